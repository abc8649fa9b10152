//! Activation (gradient) checkpointing for Burn: wrap a block so its inner activations are
//! dropped after the forward pass and recomputed in the backward pass, like
//! `torch.utils.checkpoint`, with policies for what to keep.
//!
//! Not built yet: this crate is empty until its issue ("Activation checkpointing") lands.
//! It holds no API today, on purpose.
