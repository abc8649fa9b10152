//! Data: a small device-aware loader and the built-in datasets.
//!
//! - [`DataLoader`]: batches of an in-memory dataset, built on the training device, shuffled
//!   per epoch from a seed, resumable at a batch index.
//! - [`ImageItem`] / [`ImageBatcher`]: labelled images to `[batch, channels, height, width]`
//!   tensors.
//! - [`digits`]: the built-in default data (UCI 8x8 handwritten digits, shipped in the crate).
//! - [`cifar10`]: a reader of CIFAR-10's binary format for users who have the files.

pub mod cifar10;
pub mod digits;
mod image;
mod loader;

pub use image::{ImageBatch, ImageBatcher, ImageItem, train_test_split};
pub use loader::{Batcher, DataLoader, DataProgress, EpochIter};
