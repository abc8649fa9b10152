//! The demo transformer's tensor-parallel plan (Megatron's): in every block the fused
//! query-key-value projection and the MLP's first Linear are column-parallel (each rank keeps
//! `n_heads / tp` heads and `4 d / tp` hidden units), the attention's output projection and the
//! MLP's second Linear row-parallel; the embeddings, the norms and the head stay whole on
//! every rank. Two all-reduces forward and two backward per block.

use afterburner::parallel::tp::{TensorParallel, TensorParallelPlan};
use afterburner::parallel::{ParallelError, ProcessGroup};
use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;

use super::Transformer;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

impl<B: AutodiffBackend> TensorParallelPlan<B> for Transformer<B> {
    /// This rank's part of the model under `tp` (the plan in the module docs). `n_heads`
    /// must split evenly over the ranks.
    fn parallelize<G>(self, tp: &TensorParallel<G>) -> Result<Self, ParallelError>
    where
        G: ProcessGroup<Inner<B>> + 'static,
    {
        // Fresh autodiff leaves for this rank: ranks on threads that kept the clones' shared
        // leaves would share one autodiff graph, and so its lock, across a collective.
        let device = self.head.weight.val().device();
        let mut this = self.fork(&device);
        for checkpointed in &mut this.blocks {
            let block = &mut checkpointed.block;
            if !block.n_heads.is_multiple_of(tp.size()) {
                return Err(ParallelError::InvalidConfig {
                    field: "tp_size",
                    value: tp.size().to_string(),
                    expected: format!("a divisor of the transformer's {} heads", block.n_heads),
                });
            }
            block.qkv = tp.column_chunks(block.qkv.clone(), 3)?;
            block.proj = tp.row(block.proj.clone())?;
            block.fc1 = tp.column(block.fc1.clone())?;
            block.fc2 = tp.row(block.fc2.clone())?;
        }
        Ok(this)
    }
}
