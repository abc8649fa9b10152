//! Activation (gradient) checkpointing for [Burn](https://burn.dev): trade compute for memory.
//!
//! Wrap a block in [`Checkpointed`] and its inner activations are dropped after the forward
//! pass and recomputed in the backward pass, like `torch.utils.checkpoint`; gradients equal
//! those of the plain block, and an optimizer sees nothing unusual.
//!
//! - [`Checkpointed`]: the wrapper for any `Module` (a whole block, or with
//!   [`Checkpointed::cheap`] a part that is cheap to recompute); [`checkpoint`] for a
//!   parameter-free function.
//! - [`CheckpointPolicy`]: which wrappers a forward pass recomputes (`none`, `all`,
//!   `every-<k>`, `selective`, Burn's `balanced`), set for a forward pass with [`with_policy`].
//! - [`enable`]: lets wrappers checkpoint on an autodiff backend (the `afterburner`
//!   Accelerator calls it).
//! - [`seed_blocks`]: the seed stream that replays randomness (dropout) in the recompute.
//! - [`Balanced`]: Burn's own op-level `BalancedCheckpointing` backend, to compare.
//! - [`with_derived_params`]: parameters computed from other tensors (FSDP's gathered
//!   parameters): a recomputed block keeps their sources and builds them again.
//!
//! Works under mixed precision (a block in a half view recomputes in the same dtype) and
//! gradient accumulation. See `docs/checkpointing.md` for the design and measured figures.
//!
//! ## Alone, in a plain Burn loop
//!
//! `Checkpointed` blocks in an ordinary Burn loop, gradients equal to the plain model's,
//! without the `afterburner` facade (`examples/checkpointed_loop.rs`, run as this doctest; `cargo run
//! -p afterburner-checkpoint --example checkpointed_loop`):
//!
//! ```
#![doc = include_str!("../examples/checkpointed_loop.rs")]
//! ```

#![warn(missing_docs)]

mod anchor;
mod autodiff;
mod derived;
mod engine;
mod error;
mod job;
mod policy;
mod scope;
mod wrapper;

pub use anchor::block_input;
pub use derived::{BuildFn, DerivedParams, with_derived_params};
pub use engine::{enable, is_enabled};
pub use error::CheckpointError;
pub use policy::{BlockKind, CheckpointPolicy};
pub use scope::{ReplayContext, current_policy, seed_blocks, with_policy, with_replay_context};
pub use wrapper::{Checkpointed, checkpoint};

/// Burn's own op-level checkpointing: `Autodiff<B, BalancedCheckpointing>` recomputes the
/// elementwise ops it marks memory-bound. It is a backend type, chosen where the backend is
/// named; the `balanced` policy checks for it.
pub type Balanced<B> = burn::backend::Autodiff<
    B,
    burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing,
>;

/// Whether the autodiff backend `B` is Burn's [`Balanced`] (`BalancedCheckpointing`).
pub fn is_balanced<B: burn::tensor::backend::AutodiffBackend>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<Balanced<B::InnerBackend>>()
}
