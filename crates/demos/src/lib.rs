//! Demos, apart from the API (like Lightning's `lightning.pytorch.demos`): the reference models
//! the examples, tests and benches train, and the built-in data.
//!
//! - [`models`]: a small ViT and a character Transformer, built from Burn's own layers.
//! - [`digits`]: the built-in default data (UCI 8x8 handwritten digits, shipped in the crate).
//! - [`cifar10`]: a reader of CIFAR-10's binary format for users who have the files.
//! - [`text`]: the built-in text (chapters of "Around the World in 80 Days") as byte windows
//!   for the character language model, and sampling from it.
//! - [`ImageItem`] / [`ImageDataset`] / [`ImageBatcher`]: labelled images, a Burn dataset of
//!   them, and the Burn batcher to `[batch, channels, height, width]` tensors.
//! - `testing` (feature `testing`): the helpers the crates' test suites share.
//! - `equivalence` (feature `testing`): the equivalence matrix of every fast path.

#![warn(missing_docs)]

pub mod cifar10;
pub mod digits;
#[cfg(feature = "testing")]
pub mod equivalence;
mod image;
pub mod models;
mod steps;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;

pub use image::{ImageBatch, ImageBatcher, ImageDataset, ImageItem, train_test_split};
