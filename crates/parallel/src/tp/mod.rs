//! Tensor parallelism: a layer's weights split across the ranks of a group (Megatron's split),
//! over Burn's own `Linear`.
//!
//! - [`TpLinear`]: Burn's `Linear`, split by a plan in place (the model keeps its type):
//!   column-parallel (`W`'s output columns and `b` split; each rank computes its slice of `y`
//!   from all of `x`, whose gradient is summed over the ranks backward) or row-parallel (`W`'s
//!   input rows split; the partial products summed over the ranks in f32, identity backward,
//!   the bias whole and added once).
//! - [`TensorParallelPlan`]: a model's plan (which layers are column, row, heads), as
//!   PyTorch's `parallelize_module`; [`TensorParallelMesh`] the strategy that trains such a
//!   model on a `dp x tp` mesh (DDP across the tensor-parallel groups).
//! - [`HeadParallel`]: Burn's `MultiHeadAttention` with its heads split (query, key, value
//!   column-parallel, the output projection row-parallel).
//!
//! A column-parallel layer followed by a row-parallel one (an MLP, attention's projections)
//! costs one all-reduce forward and one backward (none when the input is data, which needs no
//! gradient), and each rank holds `1 / tp` of both weights.
//! The collectives are autodiff nodes over any [`ProcessGroup`]; one failing inside Burn's
//! backward is recorded and returned by [`TensorParallel::check`].
//!
//! ```
//! use afterburner_parallel::tp::TensorParallel;
//! use afterburner_parallel::{LaunchConfig, launch, local_devices};
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::LinearConfig;
//! use burn::tensor::{Tensor, activation::gelu};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let (up, down) = (LinearConfig::new(8, 16).init::<B>(&device), LinearConfig::new(16, 8).init::<B>(&device));
//! // Burn initialises parameters lazily, per clone: read them once so every rank splits the same.
//! let _ = (up.weight.val(), up.bias.as_ref().map(|b| b.val()), down.weight.val(), down.bias.as_ref().map(|b| b.val()));
//! let x = Tensor::<B, 2>::ones([4, 8], &device);
//! let outputs = launch::<Flex, _, _, _>(local_devices::<Flex>(2)?, LaunchConfig::default(), move |group| {
//!     let tp = TensorParallel::new(group);
//!     let (up, down) = (tp.column(up.clone())?, tp.row(down.clone())?);
//!     let y = down.forward(gelu(up.forward(x.clone())));
//!     Ok::<_, afterburner_parallel::ParallelError>(y.into_data())
//! })?;
//! assert_eq!(outputs[0], outputs[1]); // every rank holds the whole output
//! # Ok::<(), afterburner_parallel::ParallelError>(())
//! ```

mod attention;
mod linear;
mod mesh;
mod ops;
mod plan;
mod split;

pub use attention::HeadParallel;
pub use linear::{SplitKind, TpLinear};
pub use mesh::TensorParallelMesh;
pub use plan::TensorParallelPlan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use split::ParamSplit;

use crate::fsdp::gather::{Exchange, Stats, is_burn_autodiff};
use crate::{ParallelError, ProcessGroup, SharedGroup};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// One rank's handle on a tensor-parallel group: it splits layers for its rank and runs their
/// collectives.
pub struct TensorParallel<G> {
    exchange: Exchange<G>,
    rank: usize,
    size: usize,
    /// The parameters this handle split (by id), for saving and the gradient norm.
    splits: Arc<Mutex<HashMap<String, ParamSplit>>>,
    /// The same by position in the model, once found.
    positions: Arc<Mutex<Option<Vec<Option<ParamSplit>>>>>,
}

impl<G> Clone for TensorParallel<G> {
    /// Another handle on the same group (what a checkpointed block's recompute keeps).
    fn clone(&self) -> Self {
        Self {
            exchange: self.exchange.clone(),
            rank: self.rank,
            size: self.size,
            splits: self.splits.clone(),
            positions: self.positions.clone(),
        }
    }
}

impl<G> TensorParallel<G> {
    /// Tensor parallelism over `group` (its ranks are the `tp` ranks that share each layer).
    pub fn new<I: Backend>(group: G) -> Self
    where
        G: ProcessGroup<I>,
    {
        let (rank, size) = (group.rank(), group.world_size());
        Self {
            exchange: Exchange {
                group: SharedGroup::new(group),
                failure: Arc::new(Mutex::new(None)),
                stats: Arc::new(Stats::default()),
                view_grads: Default::default(),
            },
            rank,
            size,
            splits: Arc::default(),
            positions: Arc::default(),
        }
    }

    /// This rank in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks a layer is split over (`tp_size`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// All-reduces so far (forward and backward).
    pub fn all_reduces(&self) -> u64 {
        self.exchange.stats.all_reduces.load(Ordering::Relaxed)
    }

    /// Values (f32) this rank sent through them so far.
    pub fn values_sent(&self) -> u64 {
        self.exchange.stats.values_moved.load(Ordering::Relaxed)
    }

    /// Returns once every rank of the group has called it (one all-reduce of one value, never
    /// read).
    pub fn barrier<I: Backend>(&self, device: &I::Device) -> Result<(), ParallelError>
    where
        G: ProcessGroup<I>,
    {
        self.exchange.group.barrier(device)
    }

    /// The first collective failure since the last check (a backward cannot return one), e.g.
    /// a rank that died; call it after `backward`.
    pub fn check(&self) -> Result<(), ParallelError> {
        match self.exchange.take_failure() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// `x` unchanged forward; its gradient summed over the ranks backward.
    pub fn copy_to_ranks<B, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        ops::copy_to_ranks(x, &self.exchange)
    }

    /// The sum of every rank's `x` forward (in f32); the gradient unchanged backward.
    pub fn sum_over_ranks<B, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        ops::sum_over_ranks(x, &self.exchange)
    }

    /// This rank's column-parallel part of `linear` (see [`TpLinear`]): its slice of the
    /// output columns of the weight and of the bias. Every rank must split the same values:
    /// Burn initialises a layer's parameters lazily and separately in each clone, so read
    /// them once (or load one record) before the ranks clone the layer.
    pub fn column<B>(&self, linear: impl Into<TpLinear<B>>) -> Result<TpLinear<B>, ParallelError>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        self.split(linear.into(), SplitKind::Column { chunks: 1 })
    }

    /// [`column`](Self::column) for a fused projection whose outputs are `chunks` blocks side
    /// by side (a `[d, 3 d]` query-key-value Linear: `chunks = 3`): this rank takes its slice
    /// of each block, so its output still splits into `chunks` blocks (its heads of each).
    pub fn column_chunks<B>(
        &self,
        linear: impl Into<TpLinear<B>>,
        chunks: usize,
    ) -> Result<TpLinear<B>, ParallelError>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        self.split(linear.into(), SplitKind::Column { chunks })
    }

    /// This rank's row-parallel part of `linear` (see [`TpLinear`]): its slice of the
    /// weight's input rows; the bias stays whole.
    pub fn row<B>(&self, linear: impl Into<TpLinear<B>>) -> Result<TpLinear<B>, ParallelError>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        self.split(linear.into(), SplitKind::Row)
    }

    /// `layer` (whole) split as `kind` for this rank, its split parameters remembered.
    fn split<B>(&self, layer: TpLinear<B>, kind: SplitKind) -> Result<TpLinear<B>, ParallelError>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        let Linear { weight, bias } = layer.linear;
        let (weight_split, bias_split) = match kind {
            SplitKind::Column { chunks } => (
                ParamSplit { dim: 1, chunks },
                Some(ParamSplit { dim: 0, chunks }),
            ),
            SplitKind::Row => (ParamSplit { dim: 0, chunks: 1 }, None),
            SplitKind::Whole => return Ok(TpLinear::from(Linear { weight, bias })),
        };
        let full = self.splittable::<B>(&weight.val(), weight_split)?;
        let weight = self.part_of(weight, Some(weight_split));
        let bias = bias.map(|b| self.part_of(b, bias_split));
        let linear = Linear { weight, bias };
        Ok(TpLinear::split(linear, kind, full, &self.exchange))
    }

    /// This rank's part of `param` under `split` (all of it when `None`) as a fresh autodiff
    /// leaf with the same id, remembered when split.
    fn part_of<B: AutodiffBackend, const D: usize>(
        &self,
        param: Param<Tensor<B, D>>,
        split: Option<ParamSplit>,
    ) -> Param<Tensor<B, D>> {
        let (id, value) = (param.id, param.val().inner());
        let value = match split {
            None => value,
            Some(split) => {
                self.register(id.serialize(), split);
                split.part_of(value, self.rank, self.size)
            }
        };
        // A fresh leaf: ranks on threads that kept the clones' shared leaves would share one
        // autodiff graph, and so its lock, across a collective (a deadlock).
        Param::initialized(id, Tensor::from_inner(value).require_grad())
    }

    /// `weight`'s shape, when its dimension `split.dim` splits evenly into `split.chunks`
    /// blocks over the ranks and `B` is Burn's autodiff (the collectives are its nodes).
    fn splittable<B: AutodiffBackend>(
        &self,
        weight: &Tensor<B, 2>,
        split: ParamSplit,
    ) -> Result<[usize; 2], ParallelError> {
        if !is_burn_autodiff::<B>() {
            return Err(ParallelError::InvalidConfig {
                field: "backend",
                value: std::any::type_name::<B>().into(),
                expected: "Burn's Autodiff<_> (tensor parallelism's collectives are its nodes)"
                    .into(),
            });
        }
        let dims = weight.dims();
        let (len, chunks) = (dims[split.dim], split.chunks);
        if chunks == 0 || !len.is_multiple_of(chunks * self.size) {
            let blocks = match chunks {
                1 => String::new(),
                n => format!(" in {n} blocks"),
            };
            return Err(ParallelError::InvalidConfig {
                field: "tp_size",
                value: self.size.to_string(),
                expected: format!(
                    "a divisor of the split dimension{blocks} ({len} of a Linear [{}, {}])",
                    dims[0], dims[1]
                ),
            });
        }
        Ok(dims)
    }
}
