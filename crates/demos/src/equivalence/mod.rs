//! The equivalence matrix: every fast path trains like the plain one. One harness trains a
//! 2-block transformer for a few steps in every combination a user configures (strategy x
//! micro-batches x loss normalisation x precision x checkpointing x loss shape x who decides
//! the step x loop or Trainer) and compares its parameters with the one-device run of the
//! same data (docs/equivalence.md; `cargo xtask equivalence` runs all of it, the
//! `equivalence` test of this crate a fixed sample).

mod case;
mod compare;
mod data;
mod run;

pub use case::{
    Case, Entry, LossShape, Norm, Step, Strategy, all_cases, losses, precisions, sample, steps,
};
pub use compare::{
    FLOOR_FACTOR, HALF_ERRORS, Outcome, PARAMETER_ROUNDING, References, Verdict, by_design,
    expected_refusal, remark,
};
pub use data::{AUX, EqBatch, EqBatcher, EqItem, SEQ_LEN, aux_term, dataset, loss_sum};
pub use run::{
    ADAMW_EPSILON, ADAMW_LR, B, GLOBAL_BATCH, SEED, SGD_LR, STEPS, initial_model, run_case,
    run_one_device,
};
