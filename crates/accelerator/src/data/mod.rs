//! Data: a device-aware loader over Burn's own `Dataset` and `Batcher`.
//!
//! - [`DataLoaderShard`]: batches of any `burn::data::dataset::Dataset` made by any
//!   `burn::data::dataloader::batcher::Batcher` on the training device, shuffled per epoch from
//!   a seed, sharded across ranks by afterburner-parallel's `DistributedSampler`, prepared
//!   ahead on a background thread, resumable at a batch index. A batcher written for
//!   burn-train works unchanged. Named as Accelerate's `DataLoaderShard`, so it does not
//!   shadow Burn's `DataLoader` trait.
//!
//! The built-in datasets (digits, CIFAR-10) and image batcher are in the `afterburner-demos`
//! crate.

mod epoch;
mod loader;
mod prefetch;
mod progress;

pub use crate::quiet::next_batch;
pub use epoch::EpochIter;
pub(crate) use epoch::FaultSlot;
pub use loader::{DEFAULT_PREFETCH, DataLoaderShard};
pub use progress::DataProgress;
