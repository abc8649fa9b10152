//! [`TensorParallelPlan`]: which layers of a model tensor parallelism splits, and how.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::{Inner, TensorParallel};
use crate::{ParallelError, ProcessGroup};

/// A model's tensor-parallel plan, as PyTorch's `parallelize_module` plan: which of its
/// [`TpLinear`](super::TpLinear) layers are column-parallel, which row-parallel (and with
/// them which heads each rank keeps). The model keeps its type, its forward and its record's
/// structure; only the split layers' values shrink to this rank's part.
///
/// ```ignore
/// impl<B: AutodiffBackend> TensorParallelPlan<B> for Mlp<B> {
///     fn parallelize<G>(mut self, tp: &TensorParallel<G>) -> Result<Self, ParallelError>
///     where
///         G: ProcessGroup<<B as AutodiffBackend>::InnerBackend> + 'static,
///     {
///         self.up = tp.column(self.up)?;   // output columns split
///         self.down = tp.row(self.down)?;  // input rows split, summed over the ranks
///         Ok(self)
///     }
/// }
/// ```
pub trait TensorParallelPlan<B: AutodiffBackend>: AutodiffModule<B> {
    /// This rank's part of the model under `tp`: each layer of the plan split with
    /// [`TensorParallel::column`], [`column_chunks`](TensorParallel::column_chunks) or
    /// [`row`](TensorParallel::row), everything else whole. Every rank must split the same
    /// values (build the model once, then clone it, or load one record).
    fn parallelize<G>(self, tp: &TensorParallel<G>) -> Result<Self, ParallelError>
    where
        G: ProcessGroup<Inner<B>> + 'static;
}
