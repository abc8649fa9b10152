//! Data: a device-aware loader over Burn's own `Dataset` and `Batcher`, and built-in datasets.
//!
//! - [`DataLoader`]: batches of any `burn::data::dataset::Dataset` made by any
//!   `burn::data::dataloader::batcher::Batcher` on the training device, shuffled per epoch from
//!   a seed, sharded across ranks by afterburner-parallel's `DistributedSampler`, prepared
//!   ahead on a background thread, resumable at a batch index. A batcher written for
//!   burn-train works unchanged.
//! - [`ImageItem`] / [`ImageDataset`] / [`ImageBatcher`]: labelled images, a Burn dataset of
//!   them, and the batcher to `[batch, channels, height, width]` tensors.
//! - [`digits`]: the built-in default data (UCI 8x8 handwritten digits, shipped in the crate).
//! - [`cifar10`]: a reader of CIFAR-10's binary format for users who have the files.

pub mod cifar10;
pub mod digits;
mod epoch;
mod image;
mod loader;
mod prefetch;
mod progress;

pub use epoch::EpochIter;
pub use image::{ImageBatch, ImageBatcher, ImageDataset, ImageItem, train_test_split};
pub use loader::{DEFAULT_PREFETCH, DataLoader};
pub use progress::DataProgress;
