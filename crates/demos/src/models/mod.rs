//! Reference models used by the examples, the tests and `cargo xtask bench`.
//!
//! Built from Burn's own layers, so they show that the precision policies and activation
//! checkpointing work on stock Burn modules.

mod transformer;
mod vit;

pub use transformer::{Transformer, TransformerBlock, TransformerConfig};
pub use vit::{Vit, VitConfig};
