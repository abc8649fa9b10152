//! [`Ddp`]: distributed data parallel. Every rank holds the whole model; gradients are averaged
//! across ranks once per optimizer step, so every rank takes the same step.

mod buckets;
mod config;
mod hook;
mod reducer;
#[cfg(test)]
mod tests;

pub use buckets::DEFAULT_BUCKET_CAP_MB;
pub use config::DdpConfig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use reducer::{Reduced, Reducer};

use std::marker::PhantomData;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::refuse_quorum::refuse_quorum;
use crate::{ForwardView, ParallelError, ParallelStrategy, ProcessGroup, StateSaving};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Distributed data parallel over a [`ProcessGroup`] on the training backend's inner backend.
///
/// - [`setup`](Self::setup): every rank gets rank 0's parameters (one broadcast).
/// - [`sync_gradients`](Self::sync_gradients): the gradients all-reduced in buckets of at most
///   [`bucket_cap_mb`](Self::with_bucket_cap_mb) (25 MiB, as PyTorch's DDP; one bucket, the
///   whole model flattened, when it fits), parameters paired by the model's visit order, never
///   by `ParamId` (which differs between separately built replicas). Call it once per
///   optimizer step, after the last micro-batch: accumulating micro-batches locally and
///   syncing once is PyTorch's `no_sync`. A parameter with a gradient on some ranks only gets
///   their sum / world size (zeros elsewhere, like DDP's `find_unused_parameters`); one with
///   none stays without. A rank that has every gradient reads nothing back to the host.
pub struct Ddp<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    group: G,
    all_reduces: u64,
    overlapped: u64,
    bucket_cap_mb: f64,
    /// The communication thread, when gradients are reduced during backward.
    reducer: Option<Arc<Reducer<Inner<B>>>>,
    /// The anchors that place the hooks of parameters outside `Checkpointed` blocks.
    ladder: Arc<hook::Ladder<Inner<B>>>,
    /// What the thread reduced during the last backward, until the step takes it.
    reduced: Mutex<Option<Reduced<Inner<B>>>>,
    /// The last backward also reached parameters outside the view (the model used beside
    /// `acc.forward`): the thread's sums miss that part, so the step reduces after backward.
    outside_view: AtomicBool,
    /// That was said in the log (once).
    said_outside: AtomicBool,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> Ddp<B, G> {
    /// Data parallel over `group`.
    pub fn new(group: G) -> Self {
        Self {
            group,
            all_reduces: 0,
            overlapped: 0,
            bucket_cap_mb: DEFAULT_BUCKET_CAP_MB,
            reducer: None,
            ladder: Arc::default(),
            reduced: Mutex::new(None),
            outside_view: AtomicBool::new(false),
            said_outside: AtomicBool::new(false),
            backend: PhantomData,
        }
    }

    /// This DDP with its gradients all-reduced while backward runs (PyTorch DDP's overlap):
    /// a thread sends each bucket as soon as backward has produced its gradients, on a clone
    /// of the group. The forward pass must run on [`view`](Self::view) (the Accelerator's
    /// `forward` does), and each backward pass must end an optimizer step's gradients: with
    /// gradient accumulation, run the micro-batches before the last on the model itself
    /// (PyTorch's `no_sync`). Each parameter's gradient reaches its bucket as soon as
    /// backward has completed it, in any model (Burn's own layers or
    /// [`Checkpointed`](afterburner_checkpoint::Checkpointed) blocks). The result is bitwise
    /// the reduction after backward's.
    pub fn with_overlap(mut self) -> Result<Self, ParallelError>
    where
        G: Clone + 'static,
    {
        let group: Box<dyn ProcessGroup<Inner<B>>> = Box::new(self.group.clone());
        self.reducer = Some(Arc::new(Reducer::start(group)?));
        Ok(self)
    }

    /// The model a forward pass runs on: under [`with_overlap`](Self::with_overlap), every
    /// parameter behind a hook that hands its gradient to the communication thread (cast to
    /// `compute` when given); `None` without overlap, or on a backend other than Burn's
    /// `Autodiff` (run on the model itself).
    pub fn view<M: Module<B>>(&self, model: &M, compute: Option<DType>) -> Option<M> {
        let reducer = self.reducer.as_ref()?;
        if !crate::fsdp::gather::is_burn_autodiff::<B>() {
            return None;
        }
        let mut lens = ParamLens(Vec::new());
        model.visit(&mut lens);
        let pass = reducer.begin(lens.0, self.bucket_cap_mb);
        Some(hook::hooked_view(
            model,
            reducer,
            &self.ladder,
            pass,
            compute,
        ))
    }

    /// After a backward pass on [`view`](Self::view), with this rank's new gradients of
    /// `model`: adds the view's gradients, which the hooks handed to the communication thread,
    /// to what reached the parameters outside the view (a use of the model beside the view:
    /// then the thread's sums miss that part, and the step reduces the sums after backward);
    /// then [`finish_backward`](Self::finish_backward).
    pub fn complete_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        if let Some(reducer) = &self.reducer {
            let local = reducer.take_local();
            if local.iter().any(Option::is_some) {
                // Before the view's gradients join them, `grads` holds only what reached the
                // parameters some other way.
                let outside = !grads.is_empty();
                self.outside_view.store(outside, Ordering::SeqCst);
                model.visit(&mut hook::AddViewGrads::<B, _> {
                    grads,
                    local: local.into_iter(),
                    backend: PhantomData,
                });
            }
        }
        self.finish_backward()
    }

    /// After a backward pass on [`view`](Self::view): sends the buckets left and waits for
    /// them, keeping the result for [`sync_gradients`](Self::sync_gradients); the first
    /// failure of the thread.
    pub fn finish_backward(&self) -> Result<(), ParallelError> {
        let Some(reducer) = &self.reducer else {
            return Ok(());
        };
        if let Some(reduced) = reducer.finish()? {
            *self.reduced.lock().unwrap_or_else(PoisonError::into_inner) = Some(reduced);
        }
        Ok(())
    }

    /// This DDP with gradient buckets of at most `cap_mb` MiB (PyTorch's `bucket_cap_mb`;
    /// default 25). Errors on a size that is not positive and finite.
    pub fn with_bucket_cap_mb(mut self, cap_mb: f64) -> Result<Self, ParallelError> {
        if !(cap_mb.is_finite() && cap_mb > 0.0) {
            return Err(ParallelError::InvalidConfig {
                field: "bucket_cap_mb",
                value: cap_mb.to_string(),
                expected: "a positive number of MiB (PyTorch's default is 25)".into(),
            });
        }
        self.bucket_cap_mb = cap_mb;
        Ok(self)
    }

    /// The process group.
    pub fn group(&self) -> &G {
        &self.group
    }

    /// Gradient all-reduces done so far (one per bucket per
    /// [`sync_gradients`](Self::sync_gradients): one per step where the model fits a bucket).
    pub fn all_reduce_count(&self) -> u64 {
        self.all_reduces
    }

    /// Gradient syncs whose buckets the communication thread reduced during backward (see
    /// [`with_overlap`](Self::with_overlap)).
    pub fn overlapped_syncs(&self) -> u64 {
        self.overlapped
    }

    /// Replaces every float parameter by rank 0's value (ids and `require_grad` kept).
    pub fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        refuse_quorum(&self.group, "DDP")?;
        broadcast_from_rank0(&self.group, model)
    }

    /// Averages `grads` (the gradients of `model` on this rank) across ranks, in place.
    pub fn sync_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        refuse_quorum(&self.group, "DDP")?;
        let mut gather = GatherGrads::<B> {
            grads,
            parts: Vec::new(),
            slots: Vec::new(),
        };
        model.visit(&mut gather);
        let GatherGrads { parts, slots, .. } = gather;
        if parts.is_empty() {
            return Ok(());
        }
        let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
        let locally: Vec<bool> = slots.iter().map(|s| s.present).collect();
        self.finish_backward()?;
        let overlapped = self
            .reduced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let outside_view = self.outside_view.swap(false, Ordering::SeqCst);
        if outside_view && overlapped.is_some() && !self.said_outside.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "DDP: gradients reached the model outside acc.forward (a second forward or a \
                 penalty on the model itself): such steps reduce their gradients after backward \
                 instead of during it"
            );
        }
        let (plan, reduced) = match overlapped {
            // The same parameters as the view's, whose gradients all came through it (else
            // reduce what `grads` holds).
            Some((plan, reduced))
                if !outside_view && plan.iter().map(Vec::len).sum::<usize>() == slots.len() =>
            {
                self.overlapped += 1;
                (plan, reduced)
            }
            _ => {
                let plan = Arc::new(buckets::plan(&lens, self.bucket_cap_mb));
                let reduced = buckets::all_reduce_buckets(&self.group, &plan, parts, &locally)?;
                (plan, reduced)
            }
        };
        self.all_reduces += reduced.len() as u64;
        let mut summed: Vec<Option<Tensor<Inner<B>, 1>>> = vec![None; slots.len()];
        let mut flags = Vec::with_capacity(reduced.len());
        for bucket in reduced {
            bucket
                .params
                .into_iter()
                .for_each(|(i, v)| summed[i] = Some(v));
            flags.push(bucket.flags);
        }
        let anywhere = buckets::present_anywhere(&plan, flags, &locally);
        let world = self.group.world_size() as f64;
        model.visit(&mut ScatterGrads {
            grads,
            slots: slots.into_iter().zip(summed).zip(anywhere),
            world,
        });
        Ok(())
    }
}

/// Replaces every float parameter of `model` by rank 0's value (one broadcast; ids and
/// `require_grad` kept): how every data parallel strategy starts.
pub fn broadcast_from_rank0<B, G, M>(group: &G, model: M) -> Result<M, ParallelError>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + ?Sized,
    M: AutodiffModule<B>,
{
    let rank = group.rank();
    let mut flat = Flatten::<B>::default();
    model.visit(&mut flat);
    let total = flat.total;
    if total == 0 {
        return Ok(model); // no float parameters (the same model on every rank): nothing to send
    }
    let sent = if rank == 0 { flat.concat() } else { None };
    let received = group.broadcast(sent, 0)?;
    let [len] = received.dims();
    if len != total {
        return Err(ParallelError::Mismatch {
            rank,
            reason: format!("rank 0 has {len} parameter values, this rank {total}"),
        });
    }
    Ok(model.map(&mut Unflatten::<B> {
        values: received,
        offset: 0,
        backend: PhantomData,
    }))
}

/// Every rank holds the same state: the single-device one.
impl<B, G> StateSaving<B> for Ddp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>>,
{
}

impl<B, G> ParallelStrategy<B> for Ddp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>>,
{
    fn name(&self) -> &'static str {
        "ddp"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(&self.group)
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        Ddp::setup(self, model)
    }

    fn gradient_all_reduces(&self) -> u64 {
        self.all_reduces
    }

    fn forward_view<M: Module<B>>(
        &self,
        model: &M,
        compute: Option<DType>,
    ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
        Ok(self.view(model, compute).map(|model| ForwardView {
            model,
            derived: Vec::new(),
        }))
    }

    fn after_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.complete_backward(model, grads)
    }

    fn reduces_in_backward(&self) -> bool {
        self.reducer.is_some()
    }

    fn averages_gradients(&self) -> bool {
        true
    }

    /// Every rank steps on the same all-reduced gradients: the same decision from its own.
    fn decides_on_device(&self) -> bool {
        true
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        self.sync_gradients(model, grads)
    }
}

/// All float parameters, flattened to f32 in visit order; with `keep`, the parameters not
/// kept are zeros.
pub(crate) struct Flatten<B: AutodiffBackend> {
    pub(crate) parts: Vec<Tensor<Inner<B>, 1>>,
    pub(crate) total: usize,
    pub(crate) keep: Option<Vec<bool>>,
}

impl<B: AutodiffBackend> Default for Flatten<B> {
    fn default() -> Self {
        Self {
            parts: Vec::new(),
            total: 0,
            keep: None,
        }
    }
}

impl<B: AutodiffBackend> Flatten<B> {
    pub(crate) fn concat(self) -> Option<Tensor<Inner<B>, 1>> {
        (!self.parts.is_empty()).then(|| Tensor::cat(self.parts, 0))
    }
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val().inner();
        let len = value.shape().num_elements();
        let kept = self.keep.as_ref().is_none_or(|keep| keep[self.parts.len()]);
        self.total += len;
        self.parts.push(if kept {
            value.cast(DType::F32).flatten(0, D - 1)
        } else {
            Tensor::zeros([len], &value.device())
        });
    }
}

/// Puts consecutive slices of `values` back into the float parameters.
pub(crate) struct Unflatten<B: AutodiffBackend> {
    pub(crate) values: Tensor<Inner<B>, 1>,
    pub(crate) offset: usize,
    pub(crate) backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Unflatten<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let len = shape.num_elements();
        let slice = self.values.clone().narrow(0, self.offset, len);
        self.offset += len;
        let value = slice.reshape(shape).cast(tensor.dtype());
        let leaf = Tensor::from_inner(value).set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, leaf, mapper)
    }
}

/// Each float parameter's value count, in visit order.
struct ParamLens(Vec<usize>);

impl<B: AutodiffBackend> ModuleVisitor<B> for ParamLens {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.val().shape().num_elements());
    }
}

/// Where a parameter's gradient sits in the buffer.
struct Slot {
    id: ParamId,
    len: usize,
    dtype: DType,
    present: bool,
}

/// Takes every gradient out of `grads` (zeros where none), flattened in visit order.
struct GatherGrads<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<Inner<B>, 1>>,
    slots: Vec<Slot>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GatherGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = self.grads.remove::<Inner<B>, D>(param.id);
        let value = param.val();
        let len = value.shape().num_elements();
        let (flat, dtype, present) = match grad {
            Some(g) => {
                let dtype = g.dtype();
                (g.cast(DType::F32).flatten(0, D - 1), dtype, true)
            }
            None => (Tensor::zeros([len], &value.device()), value.dtype(), false),
        };
        self.parts.push(flat);
        self.slots.push(Slot {
            id: param.id,
            len,
            dtype,
            present,
        });
    }
}

/// Registers the averaged gradients back, for parameters some rank had a gradient for.
struct ScatterGrads<'a, S> {
    grads: &'a mut GradientsParams,
    /// Each parameter's slot, summed values and whether some rank had a gradient.
    slots: S,
    world: f64,
}

impl<B, S> ModuleVisitor<B> for ScatterGrads<'_, S>
where
    B: AutodiffBackend,
    S: Iterator<Item = ((Slot, Option<Tensor<Inner<B>, 1>>), bool)>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(((slot, Some(summed)), true)) = self.slots.next() else {
            return;
        };
        let shape = param.val().shape();
        let grad = summed
            .div_scalar(self.world)
            .reshape(shape)
            .cast(slot.dtype);
        self.grads.register::<Inner<B>, D>(slot.id, grad);
    }
}
