//! The process group a distributed Accelerator's strategy talks through, and its traffic
//! counting.

use afterburner_parallel::{Counted, ProcessGroup, Traffic};
use burn::tensor::backend::AutodiffBackend;

/// The process group of a distributed Accelerator, on the training backend's inner backend.
pub type Group<B> = Box<dyn ProcessGroup<<B as AutodiffBackend>::InnerBackend>>;

/// `group` with what it sends counted in `traffic`.
pub(crate) fn counted<B: AutodiffBackend>(group: Group<B>, traffic: &Traffic) -> Group<B> {
    Box::new(Counted::new(group, traffic.clone()))
}
