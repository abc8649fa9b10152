//! Tensor parallelism: a layer's weights split across the ranks of a group (Megatron's split),
//! over Burn's own `Linear`.
//!
//! - [`ColumnParallel`]: `y = x W + b` with `W`'s output columns (and `b`) split; each rank
//!   computes its slice of `y` from all of `x`. Its input goes through
//!   [`TensorParallel::copy_to_ranks`] (identity forward, gradient summed over the ranks).
//! - [`HeadParallel`]: Burn's `MultiHeadAttention` with its heads split (query, key, value
//!   column-parallel, the output projection row-parallel).
//! - [`RowParallel`]: `W`'s input rows split; each rank multiplies its slice of `x` and the
//!   partial products are summed over the ranks ([`TensorParallel::sum_over_ranks`], in f32;
//!   identity backward); the bias lives on rank 0 only, so it is added once.
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
//!     let y = down.forward(gelu(up.forward(x.clone(), &tp)), &tp);
//!     Ok::<_, afterburner_parallel::ParallelError>(y.into_data())
//! })?;
//! assert_eq!(outputs[0], outputs[1]); // every rank holds the whole output
//! # Ok::<(), afterburner_parallel::ParallelError>(())
//! ```

mod attention;
mod ops;

pub use attention::HeadParallel;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::fsdp::gather::{Exchange, Stats, is_burn_autodiff};
use crate::{ParallelError, ProcessGroup, SharedGroup};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// One rank's handle on a tensor-parallel group: it splits layers for its rank and runs their
/// collectives.
pub struct TensorParallel<G> {
    exchange: Exchange<G>,
    rank: usize,
    size: usize,
}

impl<G> Clone for TensorParallel<G> {
    /// Another handle on the same group (what a checkpointed block's recompute keeps).
    fn clone(&self) -> Self {
        Self {
            exchange: self.exchange.clone(),
            rank: self.rank,
            size: self.size,
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
            },
            rank,
            size,
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

    /// This rank's column-parallel part of `linear`: its slice of the output columns of the
    /// weight and of the bias. Every rank must split the same values: Burn initialises a
    /// layer's parameters lazily and separately in each clone, so read them once (or load one
    /// record) before the ranks clone the layer.
    pub fn column<B: AutodiffBackend>(
        &self,
        linear: Linear<B>,
    ) -> Result<ColumnParallel<B>, ParallelError> {
        let [d_in, d_out] = self.splittable::<B>(&linear, 1)?;
        let cols = self.slice_of(d_out);
        let weight = leaf(linear.weight.val().slice([0..d_in, cols.clone()]));
        let bias = linear.bias.map(|b| leaf(b.val().slice([cols])));
        Ok(ColumnParallel {
            linear: Linear { weight, bias },
        })
    }

    /// [`column`](Self::column) for a fused projection whose outputs are `chunks` blocks side
    /// by side (a `[d, 3 d]` query-key-value Linear: `chunks = 3`): this rank takes its slice
    /// of each block, so its output still splits into `chunks` blocks (its heads of each).
    pub fn column_chunks<B: AutodiffBackend>(
        &self,
        linear: Linear<B>,
        chunks: usize,
    ) -> Result<ColumnParallel<B>, ParallelError> {
        let [d_in, d_out] = self.splittable::<B>(&linear, 1)?;
        if chunks == 0 || !d_out.is_multiple_of(chunks * self.size) {
            return Err(ParallelError::InvalidConfig {
                field: "tp_size",
                value: self.size.to_string(),
                expected: format!(
                    "a divisor of each of the {chunks} blocks of a Linear [{d_in}, {d_out}]"
                ),
            });
        }
        let width = d_out / chunks;
        let ranges: Vec<_> = (0..chunks)
            .map(|c| {
                let mine = self.slice_of(width);
                c * width + mine.start..c * width + mine.end
            })
            .collect();
        let weight = linear.weight.val();
        let weight = Tensor::cat(
            ranges
                .iter()
                .map(|r| weight.clone().slice([0..d_in, r.clone()]))
                .collect(),
            1,
        );
        let bias = linear.bias.map(|b| {
            let b = b.val();
            leaf(Tensor::cat(
                ranges
                    .iter()
                    .map(|r| b.clone().slice([r.clone()]))
                    .collect(),
                0,
            ))
        });
        Ok(ColumnParallel {
            linear: Linear {
                weight: leaf(weight),
                bias,
            },
        })
    }

    /// This rank's row-parallel part of `linear`: its slice of the weight's input rows, and
    /// the bias on rank 0 only.
    pub fn row<B: AutodiffBackend>(
        &self,
        linear: Linear<B>,
    ) -> Result<RowParallel<B>, ParallelError> {
        let [d_in, d_out] = self.splittable::<B>(&linear, 0)?;
        let rows = self.slice_of(d_in);
        let weight = leaf(linear.weight.val().slice([rows, 0..d_out]));
        let bias = match self.rank {
            0 => linear.bias.map(|b| leaf(b.val())),
            _ => None,
        };
        Ok(RowParallel {
            linear: Linear { weight, bias },
        })
    }

    /// `linear`'s weight shape, when its dimension `dim` splits evenly over the ranks and `B`
    /// is Burn's autodiff (the collectives are its nodes).
    fn splittable<B: AutodiffBackend>(
        &self,
        linear: &Linear<B>,
        dim: usize,
    ) -> Result<[usize; 2], ParallelError> {
        if !is_burn_autodiff::<B>() {
            return Err(ParallelError::InvalidConfig {
                field: "backend",
                value: std::any::type_name::<B>().into(),
                expected: "Burn's Autodiff<_> (tensor parallelism's collectives are its nodes)"
                    .into(),
            });
        }
        let dims = linear.weight.val().dims();
        if !dims[dim].is_multiple_of(self.size) {
            return Err(ParallelError::InvalidConfig {
                field: "tp_size",
                value: self.size.to_string(),
                expected: format!(
                    "a divisor of the split dimension ({} of a Linear [{}, {}])",
                    dims[dim], dims[0], dims[1]
                ),
            });
        }
        Ok(dims)
    }

    /// This rank's range of `len` split evenly.
    fn slice_of(&self, len: usize) -> std::ops::Range<usize> {
        let part = len / self.size;
        self.rank * part..(self.rank + 1) * part
    }
}

/// A fresh trainable parameter holding `value` (cut off from the layer it was sliced from).
fn leaf<B: AutodiffBackend, const D: usize>(value: Tensor<B, D>) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::from_inner(value.inner()))
}

/// A Linear whose output columns are split across the tensor-parallel ranks (see the module
/// docs); its output is this rank's slice of the full output's last dimension.
#[derive(Module, Debug)]
pub struct ColumnParallel<B: Backend> {
    /// This rank's part: weight `[d_in, d_out / tp]`, bias `[d_out / tp]`.
    pub linear: Linear<B>,
}

impl<B: AutodiffBackend> ColumnParallel<B> {
    /// This rank's slice of `input W + b` (the input whole, `[..., d_in]`).
    pub fn forward<G, const D: usize>(
        &self,
        input: Tensor<B, D>,
        tp: &TensorParallel<G>,
    ) -> Tensor<B, D>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        self.linear.forward(tp.copy_to_ranks(input))
    }
}

/// A Linear whose input rows are split across the tensor-parallel ranks (see the module
/// docs); its output is the whole `input W + b`, on every rank.
#[derive(Module, Debug)]
pub struct RowParallel<B: Backend> {
    /// This rank's part: weight `[d_in / tp, d_out]`, the bias on rank 0 only.
    pub linear: Linear<B>,
}

impl<B: AutodiffBackend> RowParallel<B> {
    /// `input W + b` from this rank's slice of the input's last dimension (`[..., d_in / tp]`,
    /// what a [`ColumnParallel`] layer gives), summed over the ranks.
    pub fn forward<G, const D: usize>(
        &self,
        input: Tensor<B, D>,
        tp: &TensorParallel<G>,
    ) -> Tensor<B, D>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        tp.sum_over_ranks(self.linear.forward(input))
    }
}
