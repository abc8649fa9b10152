//! A block call to checkpoint, as the wrapper hands it to the backend's checkpointing
//! function.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// Runs the block on `slots` (the input first, then the parameters in visit order). The flag
/// says whether this run belongs to a recomputed region (forward without graph, or recompute).
pub(crate) type BlockFn<B> = Box<dyn Fn(Vec<FloatTensor<B>>, bool) -> FloatTensor<B> + Send>;

/// A block call to checkpoint.
pub(crate) struct Job<B: Backend> {
    /// The block input, then its float parameters.
    pub slots: Vec<FloatTensor<B>>,
    /// The block's forward on such slots.
    pub block: BlockFn<B>,
}
