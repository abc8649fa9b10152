//! [`Ddp`]: distributed data parallel. Every rank holds the whole model; gradients are averaged
//! across ranks once per optimizer step, so every rank takes the same step.

use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::refuse_quorum::refuse_quorum;
use crate::{ParallelError, ParallelStrategy, ProcessGroup, ReduceOp, StateSaving};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Distributed data parallel over a [`ProcessGroup`] on the training backend's inner backend.
///
/// - [`setup`](Self::setup): every rank gets rank 0's parameters (one broadcast).
/// - [`sync_gradients`](Self::sync_gradients): one all-reduce of all gradients, flattened in
///   the model's visit order (ranks pair parameters by position, never by `ParamId`, which
///   differs between separately built replicas). Call it once per optimizer step, after the
///   last micro-batch: accumulating micro-batches locally and syncing once is PyTorch's
///   `no_sync`. A parameter with a gradient on some ranks only gets their sum / world size
///   (zeros elsewhere, like DDP's `find_unused_parameters`); one with none stays without.
pub struct Ddp<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    group: G,
    all_reduces: u64,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> Ddp<B, G> {
    /// Data parallel over `group`.
    pub fn new(group: G) -> Self {
        Self {
            group,
            all_reduces: 0,
            backend: PhantomData,
        }
    }

    /// The process group.
    pub fn group(&self) -> &G {
        &self.group
    }

    /// Gradient all-reduces done so far (one per [`sync_gradients`](Self::sync_gradients)).
    pub fn all_reduce_count(&self) -> u64 {
        self.all_reduces
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
        let Some(device) = parts.first().map(Tensor::device) else {
            return Ok(());
        };
        // One buffer: every parameter's values (zeros where this rank has no gradient), then
        // one presence flag per parameter.
        let presence: Vec<f32> = slots
            .iter()
            .map(|s| f32::from(u8::from(s.present)))
            .collect();
        let flags = Tensor::<Inner<B>, 1>::from_floats(presence.as_slice(), &device);
        let buffer = Tensor::cat([parts, vec![flags]].concat(), 0);
        let summed = self.group.all_reduce(buffer, ReduceOp::Sum)?;
        self.all_reduces += 1;
        let world = self.group.world_size() as f64;
        let total: usize = slots.iter().map(|s| s.len).sum();
        let flags = summed.clone().narrow(0, total, slots.len()).into_data();
        let flags = flags.convert::<f32>().to_vec::<f32>().unwrap_or_default();
        let mean = summed.narrow(0, 0, total).div_scalar(world);
        model.visit(&mut ScatterGrads::<B, _, _> {
            grads,
            mean,
            slots: slots.into_iter(),
            flags: flags.into_iter(),
            offset: 0,
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

    fn averages_gradients(&self) -> bool {
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
struct ScatterGrads<'a, B: AutodiffBackend, S, F> {
    grads: &'a mut GradientsParams,
    mean: Tensor<Inner<B>, 1>,
    slots: S,
    flags: F,
    offset: usize,
}

impl<B, S, F> ModuleVisitor<B> for ScatterGrads<'_, B, S, F>
where
    B: AutodiffBackend,
    S: Iterator<Item = Slot>,
    F: Iterator<Item = f32>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (Some(slot), Some(flag)) = (self.slots.next(), self.flags.next()) else {
            return;
        };
        let range = self.offset..self.offset + slot.len;
        self.offset += slot.len;
        if flag > 0.0 {
            let shape = param.val().shape();
            let grad = self
                .mean
                .clone()
                .slice([range])
                .reshape(shape)
                .cast(slot.dtype);
            self.grads.register::<Inner<B>, D>(slot.id, grad);
        }
    }
}
