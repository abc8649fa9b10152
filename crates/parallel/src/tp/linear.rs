//! [`TpLinear`]: Burn's `Linear` that a tensor-parallel plan can split in place. Until split
//! it is the `Linear` itself; split, it holds this rank's slice of the weight and runs the
//! collectives its split needs, so a model keeps its type (and its forward code) under TP.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::module::linear;
use burn::tensor::{DType, Tensor};

use super::ops;
use crate::ProcessGroup;
use crate::fsdp::gather::Exchange;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Burn's `Linear`, splittable by a tensor-parallel plan
/// ([`TensorParallel::column`](super::TensorParallel::column),
/// [`row`](super::TensorParallel::row)). Whole (as built, or gathered back by
/// [`TensorParallel::full_model`](super::TensorParallel::full_model)) it is the `Linear`;
/// split:
///
/// - column-parallel: `W`'s output columns (and `b`) split; each rank computes its slice of
///   `y` from all of `x`, whose gradient is summed over the ranks backward;
/// - row-parallel: `W`'s input rows split; each rank multiplies its slice of `x`, the partial
///   products are summed over the ranks (in f32) and the bias, whole on every rank, added once.
#[derive(Module, Debug)]
pub struct TpLinear<B: Backend> {
    /// The layer: whole, or this rank's part of it.
    pub linear: Linear<B>,
    /// How it is split and the collectives that run it (not saved: a state holds the values).
    #[module(skip)]
    split: LinearSplit,
}

impl<B: Backend> From<Linear<B>> for TpLinear<B> {
    /// `linear`, whole until a plan splits it.
    fn from(linear: Linear<B>) -> Self {
        Self {
            linear,
            split: LinearSplit::default(),
        }
    }
}

/// How a [`TpLinear`] is split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SplitKind {
    /// Not split.
    #[default]
    Whole,
    /// Output columns split, in `chunks` blocks side by side (3 for a fused query-key-value
    /// projection: each rank takes its slice of each block).
    Column {
        /// Blocks of the output, each split over the ranks.
        chunks: usize,
    },
    /// Input rows split; the bias whole on every rank.
    Row,
}

/// A split layer's kind, full weight shape and collectives (for its training backend and for
/// the backend without autodiff, what `valid()` gives).
#[derive(Clone, Default)]
pub(crate) struct LinearSplit {
    kind: SplitKind,
    full: [usize; 2],
    ops: Vec<Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for LinearSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.kind)
    }
}

/// One backend's two collectives on `[n, d]` activations.
struct Collectives<B: Backend> {
    copy_to_ranks: Box<dyn Fn(Tensor<B, 2>) -> Tensor<B, 2> + Send + Sync>,
    sum_over_ranks: Box<dyn Fn(Tensor<B, 2>) -> Tensor<B, 2> + Send + Sync>,
}

impl<B: Backend> TpLinear<B> {
    /// How this layer is split ([`SplitKind::Whole`] until a plan splits it).
    pub fn split_kind(&self) -> SplitKind {
        self.split.kind
    }

    /// `input W + b` (`[..., d_in]` to `[..., d_out]`), whole on every rank for a whole or
    /// row-parallel layer, this rank's slice of the last dimension for a column-parallel one
    /// (whose input is whole; a row-parallel layer takes this rank's slice).
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let weight = self.linear.weight.val();
        if self.split.kind == SplitKind::Whole || weight.dims() == self.split.full {
            return self.linear.forward(input);
        }
        let collectives = self
            .split
            .ops
            .iter()
            .find_map(|ops| ops.downcast_ref::<Collectives<B>>())
            .expect(
                "a split TpLinear runs on the backend it was split on, or that backend's inner \
                 one (use TensorParallel::full_model for another)",
            );
        let dims = input.dims();
        let d_in = dims[D - 1];
        let x = input.reshape([dims[..D - 1].iter().product(), d_in]);
        let y = match self.split.kind {
            SplitKind::Row => {
                let params = weight.dtype();
                let partial = linear(x, weight, None);
                // The bias in the dtype the matmul ran in (as one device's Linear adds it),
                // added to the f32 sum; the result in the parameters' dtype (f32 masters under
                // per-op autocast, the half copy's dtype under a half view).
                let dtype = partial.dtype();
                let sum = (collectives.sum_over_ranks)(partial);
                let sum = match &self.linear.bias {
                    Some(bias) => {
                        let bias = bias.val().cast(dtype).cast(sum.dtype());
                        sum + bias.unsqueeze::<2>()
                    }
                    None => sum,
                };
                sum.cast(params)
            }
            _ => self.linear.forward((collectives.copy_to_ranks)(x)),
        };
        let mut out = dims;
        out[D - 1] = y.dims()[1];
        y.reshape(out)
    }

    /// This layer with `weight` and `bias` (this rank's slices) as `kind` of a `full` weight,
    /// running its collectives through `exchange`.
    pub(crate) fn split<G>(
        linear: Linear<B>,
        kind: SplitKind,
        full: [usize; 2],
        exchange: &Exchange<G>,
    ) -> Self
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        Self {
            linear,
            split: LinearSplit {
                kind,
                full,
                ops: vec![
                    Arc::new(training::<B, G>(exchange)),
                    Arc::new(evaluation::<Inner<B>, G>(exchange)),
                ],
            },
        }
    }
}

/// The autodiff nodes: identity forward and gradient summed backward, and the reverse.
fn training<B, G>(exchange: &Exchange<G>) -> Collectives<B>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let (copy, sum) = (exchange.clone(), exchange.clone());
    Collectives {
        copy_to_ranks: Box::new(move |x| ops::copy_to_ranks(x, &copy)),
        sum_over_ranks: Box::new(move |x| ops::sum_over_ranks(x, &sum)),
    }
}

/// Without autodiff (evaluation of `valid()`): the copy is the identity, the sum a plain
/// all-reduce in f32.
fn evaluation<I, G>(exchange: &Exchange<G>) -> Collectives<I>
where
    I: Backend,
    G: ProcessGroup<I> + 'static,
{
    let sum = exchange.clone();
    Collectives {
        copy_to_ranks: Box::new(|x| x),
        sum_over_ranks: Box::new(move |x| {
            let [n, d] = x.dims();
            sum.all_reduce_sum(x.reshape([n * d]).cast(DType::F32))
                .reshape([n, d])
        }),
    }
}
