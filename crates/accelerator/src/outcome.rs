//! What training has done so far ([`Counters`], saved with the state) and what the last
//! [`step`](crate::Accelerator::step) did ([`StepOutcome`]).

use serde::{Deserialize, Serialize};

/// Progress counters, saved with the training state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Optimizer steps taken.
    pub optimizer_steps: u64,
    /// Steps skipped because the gradients held inf/NaN (fp16 overflow, or the
    /// `nonfinite_gradients = "skip"` guard).
    pub skipped_steps: u64,
    /// Micro-batches passed through `backward`.
    pub micro_batches: u64,
}

/// What the last call to [`Accelerator::step`](crate::Accelerator::step) did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOutcome {
    /// No step call yet.
    Idle,
    /// Gradients were kept for the next micro-batch of the cycle; nothing changed.
    Accumulating,
    /// The optimizer stepped.
    Stepped {
        /// Learning rate used.
        lr: f64,
        /// Global gradient norm before clipping, when it was computed (clipping or fp16).
        grad_norm: Option<f64>,
    },
    /// fp16 gradients held inf/NaN: parameters, optimizer and LR scheduler untouched.
    SkippedOverflow {
        /// The loss scale after backing off.
        loss_scale: f64,
    },
    /// Gradients held inf/NaN outside fp16 (`nonfinite_gradients = "skip"`): parameters,
    /// optimizer and LR scheduler untouched.
    SkippedNonFinite {
        /// The global gradient norm that was found (inf or NaN).
        grad_norm: f64,
    },
    /// [`step_on_device`](crate::Accelerator::step_on_device) queued the step with its skip
    /// decided on the device: what it did is read with
    /// [`settle_device_steps`](crate::Accelerator::settle_device_steps).
    Deferred,
}
