//! The backend suite: the training properties that differ between Burn's synchronous CPU
//! backend and its asynchronous GPU ones (device sync, per-thread streams under the checkpoint
//! recompute thread and in-process workers, dtype support), written once over the backend.
//!
//! Two drivers run it: `xtask/tests/backend_suite.rs` (cargo test, on flex and, with
//! `--features wgpu`, on wgpu) and `cargo xtask gpu-check` (on the first CUDA device, from a
//! release binary that needs no cargo).

pub mod checks;
pub mod helpers;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use afterburner::Precision;
use burn::tensor::backend::AutodiffBackend;

/// The checks' names, in the order [`checks()`] runs them (the
/// test driver and the dry run list them).
pub const CHECK_NAMES: &[&str] = &[
    "bf16_mixed_gradients_match_f32",
    "f16_mixed_gradients_match_f32",
    "accumulation_equals_big_batch",
    "resume_is_bitwise",
    "checkpointed_gradients_equal_plain",
    "ddp_two_workers_equal_one_device",
    "fsdp_equals_ddp",
    "tensor_parallel_equals_one_device",
];

/// One named check of the suite.
pub struct Check<B: AutodiffBackend> {
    /// The check's name (also its test's name).
    pub name: &'static str,
    /// Runs it on a device: a line of figures when it holds, what went wrong otherwise.
    pub run: fn(&B::Device) -> Result<String, String>,
}

/// Every check, in the order they run.
pub fn checks<B: AutodiffBackend>() -> Vec<Check<B>> {
    vec![
        Check {
            name: "bf16_mixed_gradients_match_f32",
            run: |d| checks::mixed_gradients::<B>(d, Precision::Bf16Mixed),
        },
        Check {
            name: "f16_mixed_gradients_match_f32",
            run: |d| checks::mixed_gradients::<B>(d, Precision::F16Mixed),
        },
        Check {
            name: "accumulation_equals_big_batch",
            run: checks::accumulation_equals_big_batch::<B>,
        },
        Check {
            name: "resume_is_bitwise",
            run: checks::resume_is_bitwise::<B>,
        },
        Check {
            name: "checkpointed_gradients_equal_plain",
            run: checks::checkpointed_gradients_equal_plain::<B>,
        },
        Check {
            name: "ddp_two_workers_equal_one_device",
            run: checks::ddp_two_workers_equal_one_device::<B>,
        },
        Check {
            name: "fsdp_equals_ddp",
            run: checks::fsdp_equals_ddp::<B>,
        },
        Check {
            name: "tensor_parallel_equals_one_device",
            run: checks::tensor_parallel_equals_one_device::<B>,
        },
    ]
}

/// What one check gave.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The check's name.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Its figures, or what went wrong (a panic's message included).
    pub detail: String,
    /// Wall time of the check, seconds.
    pub seconds: f64,
}

/// Runs one check, turning a panic into a failed outcome.
pub fn run_check<B: AutodiffBackend>(check: &Check<B>, device: &B::Device) -> Outcome {
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| (check.run)(device)));
    let (passed, detail) = match result {
        Ok(Ok(detail)) => (true, detail),
        Ok(Err(e)) => (false, e),
        Err(panic) => (false, format!("panicked: {}", panic_text(&panic))),
    };
    Outcome {
        name: check.name.to_string(),
        passed,
        detail,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Runs the check named `name` and panics with its detail when it fails (the test driver).
pub fn assert_check<B: AutodiffBackend>(name: &str, device: &B::Device) {
    let checks = checks::<B>();
    let check = checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check named {name}"));
    match (check.run)(device) {
        Ok(detail) => println!("{name} on {}: {detail}", B::name(device)),
        Err(e) => panic!("{name} on {}: {e}", B::name(device)),
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}
