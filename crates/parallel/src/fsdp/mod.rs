//! [`Fsdp`]: fully sharded data parallel. Between steps each rank keeps only its shard of every
//! parameter, so its gradients and optimizer state are shards too; a forward pass gathers each
//! unit's parameters when it first reads them.
//!
//! How it fits Burn: after [`shard`](Fsdp::shard) the model's parameters hold this rank's
//! chunk (shape `[1, .., 1, chunk]`, same `ParamId`), so any element-wise optimizer (SGD, Adam,
//! AdamW, RMSprop...) steps the shards and keeps shard-sized state without knowing. For a
//! forward pass [`view`](Fsdp::view) returns a model whose parameters are lazy: the first read
//! of any parameter of a unit runs one all-gather for the whole unit and adds one autodiff node
//! whose backward reduce-scatters the unit's gradient (mean over ranks) back to the shards.

mod config;
mod elastic;
pub(crate) mod gather;
mod layout;
mod strategy;
mod view;

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::collections::HashMap;

use afterburner_checkpoint::DerivedParams;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};

pub use config::{AutoWrapPolicy, FsdpConfig, ShardingStrategy, StateDictType};
pub use layout::ShardLayout;

use crate::{ParallelError, ProcessGroup, SharedGroup};
use gather::{Exchange, Stats};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Fully sharded data parallel over a [`SharedGroup`] on the training backend's inner backend.
///
/// Use: every rank starts from the same parameters (broadcast them with
/// [`Ddp::setup`](crate::Ddp::setup)), calls [`shard`](Self::shard) once, then per micro-batch
/// runs the forward pass on [`view`](Self::view) of the sharded model, `backward`, and
/// [`ParallelStrategy::after_backward`](crate::ParallelStrategy::after_backward) on
/// `GradientsParams::from_grads(grads, &sharded)`, which then holds this rank's shard of the
/// gradients, averaged over ranks. After each optimizer step call
/// [`after_step`](Self::after_step). Needs Burn's `Autodiff<_, _>` backend.
pub struct Fsdp<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    config: FsdpConfig,
    exchange: Exchange<G>,
    state: Mutex<Sharded<B>>,
    backend: PhantomData<B>,
}

/// What [`Fsdp::shard`] sets up.
struct Sharded<B: AutodiffBackend> {
    layout: Option<Arc<ShardLayout>>,
    /// `grad-op` only: each unit's full buffer, refreshed after every optimizer step.
    replicated: Vec<Tensor<Inner<B>, 1>>,
}

impl<B, G> Fsdp<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    /// FSDP over `group`. Errors for `sharding = none` (use [`Ddp`](crate::Ddp)) and for
    /// autodiff backends other than Burn's `Autodiff<_, _>`.
    pub fn new(group: SharedGroup<G>, config: FsdpConfig) -> Result<Self, ParallelError> {
        if config.sharding_strategy == ShardingStrategy::NoShard {
            return Err(ParallelError::InvalidConfig {
                field: "fsdp.sharding_strategy",
                value: config.sharding_strategy.to_string(),
                expected: "full or grad-op (none is plain DDP)".into(),
            });
        }
        if !gather::is_burn_autodiff::<B>() {
            return Err(ParallelError::InvalidConfig {
                field: "backend",
                value: std::any::type_name::<B>().to_string(),
                expected: "burn's Autodiff<_, _> backend (FSDP adds its own autodiff nodes)".into(),
            });
        }
        group.with(|g| crate::refuse_quorum::refuse_quorum::<Inner<B>, G>(g, "FSDP"))?;
        Ok(Self {
            config,
            exchange: Exchange {
                group,
                failure: Default::default(),
                stats: Arc::new(Stats::default()),
                view_grads: Default::default(),
            },
            state: Mutex::new(Sharded {
                layout: None,
                replicated: Vec::new(),
            }),
            backend: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &FsdpConfig {
        &self.config
    }

    /// The units and shard sizes (after [`shard`](Self::shard)).
    pub fn layout(&self) -> Option<Arc<ShardLayout>> {
        self.state().layout.clone()
    }

    fn state(&self) -> MutexGuard<'_, Sharded<B>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces every float parameter of `model` (full, the same on every rank) by this rank's
    /// chunk, and records the layout. Call once, at setup (again to re-shard a full model).
    pub fn shard<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        layout::check_module_names(
            &model,
            &self.config.auto_wrap_policy,
            "fsdp.auto_wrap_policy",
        )?;
        let group = &self.exchange.group;
        let layout = ShardLayout::new(
            &model,
            &self.config.auto_wrap_policy,
            group.rank(),
            group.world_size(),
        );
        let replicated = match self.config.sharding_strategy {
            ShardingStrategy::GradOp => view::replicated_buffers(&model, &layout),
            _ => Vec::new(),
        };
        let model = view::to_shards(model, &layout)?;
        *self.state() = Sharded {
            layout: Some(Arc::new(layout)),
            replicated,
        };
        Ok(model)
    }

    fn layout_or_err(&self) -> Result<Arc<ShardLayout>, ParallelError> {
        self.layout().ok_or_else(|| ParallelError::InvalidConfig {
            field: "fsdp",
            value: "model not sharded".into(),
            expected: "Fsdp::shard(model) before view/full_model/after_step".into(),
        })
    }

    /// A model for one forward pass: same `ParamId`s, full parameters gathered lazily per unit
    /// (with `compute`, cast to that dtype through a differentiable cast: the autocast view).
    /// Build a new view for every forward pass. Every rank must run the same forward passes
    /// (each unit's first read is a collective). An error is also kept for
    /// [`check`](Self::check).
    pub fn view<M: Module<B>>(
        &self,
        sharded: &M,
        compute: Option<DType>,
    ) -> Result<M, ParallelError> {
        Ok(self.view_with_units(sharded, compute)?.0)
    }

    /// [`view`](Self::view), and each unit as [`DerivedParams`] (its shards and how to gather
    /// them): give them to [`with_derived_params`](afterburner_checkpoint::with_derived_params)
    /// around the forward pass so a recomputed `Checkpointed` block
    /// keeps its unit's shards instead of the gathered parameters and gathers them again in
    /// the backward pass (PyTorch FSDP's `reshard_after_forward`).
    pub fn view_with_units<M: Module<B>>(
        &self,
        sharded: &M,
        compute: Option<DType>,
    ) -> Result<(M, Vec<DerivedParams<B>>), ParallelError> {
        let layout = self.layout_or_err();
        let view = layout.and_then(|layout| {
            let replicated = match self.config.sharding_strategy {
                ShardingStrategy::GradOp => Some(self.state().replicated.clone()),
                _ => None,
            };
            view::lazy_view(sharded, &layout, &self.exchange, replicated, compute)
        });
        if let Err(e) = &view {
            self.exchange.record(e.clone());
        }
        view
    }

    /// The whole model, gathered from every rank's shards (every rank gets it; each unit is
    /// one all-gather): for evaluation outside [`view`](Self::view), export and full saves.
    pub fn full_model<M: AutodiffModule<B>>(&self, sharded: &M) -> Result<M, ParallelError> {
        let layout = self.layout_or_err()?;
        let buffers = view::local_buffers(sharded, &layout)?
            .into_iter()
            .map(|local| self.exchange.all_gather(local))
            .collect::<Vec<_>>();
        self.check()?;
        view::from_buffers(sharded.clone(), &layout, buffers)
    }

    /// After each backward pass, on `GradientsParams::from_grads(grads, &sharded)`: gives the
    /// shard parameters their pieces of the units' gradients (reduce-scattered during
    /// backward) and reports a collective that failed in it. A loss that reached the sharded
    /// model outside the view (outside `acc.forward`) is refused: there each rank's
    /// parameters are its shards, so the term is not the one-device loss.
    pub fn finish_backward<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        let layout = self.layout_or_err()?;
        let units = self
            .exchange
            .take_view_grads::<Inner<B>>(layout.units.len());
        self.check()?;
        // Ranks that are threads of one process share Burn's autodiff state: after each
        // backward a rank's graph cleanup locks every graph, and a rank already in its next
        // backward holds its own graph's lock while it waits in a reduce-scatter for the
        // first (a deadlock, seen once in about 900 runs). No rank starts its next backward
        // before every rank has left this one (one all-reduce of one value, never read).
        if let Some(device) = units.iter().flatten().next().map(Tensor::device) {
            Fsdp::group(self).barrier(&device)?;
        }
        if let Some(id) = view::reached_outside_view::<B, M>(model, grads) {
            return Err(ParallelError::InvalidConfig {
                field: "strategy",
                value: format!(
                    "fsdp (sharding_strategy = {})",
                    self.config().sharding_strategy
                ),
                expected: format!(
                    "a loss computed from acc.forward's output only: it read parameter {id} of \
                     the model outside acc.forward, where under FSDP each rank holds only its \
                     shards, so that term is not the loss one device computes. Compute it \
                     inside the forward closure (`acc.forward(&model, x, |m, x| (m.forward(x), \
                     penalty(m)))`, on the gathered parameters), or train with \"ddp\" or \
                     sharding_strategy = \"none\""
                ),
            });
        }
        view::add_view_grads::<B, M>(model, &layout, units, grads)
    }

    /// After each optimizer step: under `grad-op`, gathers every unit's new values (one
    /// all-gather per unit); nothing to do under `full`.
    pub fn after_step<M: AutodiffModule<B>>(&self, sharded: &M) -> Result<(), ParallelError> {
        if self.config.sharding_strategy != ShardingStrategy::GradOp {
            return Ok(());
        }
        let layout = self.layout_or_err()?;
        let replicated = view::local_buffers(sharded, &layout)?
            .into_iter()
            .map(|local| self.exchange.all_gather(local))
            .collect();
        self.check()?;
        self.state().replicated = replicated;
        Ok(())
    }

    /// Each float parameter's index in the layout, by `ParamId`, for `sharded` as it is now (ids
    /// change when a record is loaded): to match a record's entries to parameters.
    pub fn param_indices<M: Module<B>>(&self, sharded: &M) -> HashMap<ParamId, usize> {
        struct Ids(HashMap<ParamId, usize>, usize);
        impl<B: Backend> ModuleVisitor<B> for Ids {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0.insert(param.id, self.1);
                self.1 += 1;
            }
        }
        let mut ids = Ids(HashMap::new(), 0);
        sharded.visit(&mut ids);
        ids.0
    }

    /// The full values (row-major) and shape of parameter `index` from every rank's chunk of
    /// it (`local`, this rank's, as many values as its shard): one all-gather; every rank
    /// calls it, in the same order. For tensors shaped like a parameter's shard, such as an
    /// element-wise optimizer's state.
    pub fn gather_values(
        &self,
        index: usize,
        local: Vec<f32>,
        device: &B::Device,
    ) -> Result<(Vec<f32>, Vec<usize>), ParallelError> {
        let layout = self.layout_or_err()?;
        let slot = layout.slot(index)?;
        let local = Tensor::<Inner<B>, 1>::from_floats(local.as_slice(), device);
        let full = self.exchange.all_gather(local);
        self.check()?;
        let values = full.into_data().convert::<f32>().into_vec::<f32>();
        let mut values = values.map_err(|e| ParallelError::Mismatch {
            rank: layout.rank,
            reason: format!("gathered values: {e:?}"),
        })?;
        if values.len() != layout.world * slot.chunk {
            return Err(ParallelError::Mismatch {
                rank: layout.rank,
                reason: format!(
                    "parameter {index}: {} values gathered, expected {} chunks of {}",
                    values.len(),
                    layout.world,
                    slot.chunk
                ),
            });
        }
        values.truncate(slot.numel);
        Ok((values, slot.shape.clone()))
    }

    /// This rank's chunk of parameter `index` from its full values (row-major), and the shape
    /// a shard has (`[1, .., 1, chunk]`): the inverse of [`gather_values`](Self::gather_values).
    pub fn shard_values(
        &self,
        index: usize,
        mut full: Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<usize>), ParallelError> {
        let layout = self.layout_or_err()?;
        let slot = layout.slot(index)?;
        if full.len() != slot.numel {
            return Err(ParallelError::Mismatch {
                rank: layout.rank,
                reason: format!(
                    "parameter {index} has {} values, the state holds {}",
                    slot.numel,
                    full.len()
                ),
            });
        }
        full.resize(layout.world * slot.chunk, 0.0);
        let start = layout.rank * slot.chunk;
        let mut shape = vec![1; slot.shape.len()];
        if let Some(last) = shape.last_mut() {
            *last = slot.chunk;
        }
        Ok((full[start..start + slot.chunk].to_vec(), shape))
    }

    /// The first collective failure since the last check (gathers in a forward pass and
    /// reduce-scatters in a backward pass cannot return errors themselves), cleared.
    pub fn check(&self) -> Result<(), ParallelError> {
        match self.exchange.take_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The process group.
    pub fn group(&self) -> &SharedGroup<G> {
        &self.exchange.group
    }

    /// Unit all-gathers so far (forward passes, `after_step`, `full_model`).
    pub fn all_gathers(&self) -> u64 {
        self.exchange.stats.all_gathers.load(Ordering::Relaxed)
    }

    /// Unit reduce-scatters so far (one per gathered unit per backward pass).
    pub fn reduce_scatters(&self) -> u64 {
        self.exchange.stats.reduce_scatters.load(Ordering::Relaxed)
    }

    /// Values (4 bytes each on the wire) this rank received in gathers and sent to
    /// reduce-scatters so far.
    pub fn values_moved(&self) -> u64 {
        self.exchange.stats.values_moved.load(Ordering::Relaxed)
    }
}
