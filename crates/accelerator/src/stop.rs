//! The opt-in graceful stop (`stop_on_signal`): SIGTERM or SIGINT sets a flag that the
//! training loop polls with [`Accelerator::stop_requested`], so it can finish its step, save
//! and exit with an error, what a pre-empted cluster job needs. A second SIGINT while the
//! stop is pending ends the process at once (Ctrl-C twice); SIGTERM never does (schedulers and
//! `mpirun` often deliver it more than once). The handlers stay installed for the process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use afterburner_parallel::ParallelStrategy;
use burn::tensor::backend::AutodiffBackend;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::{AccelerateError, Accelerator};

/// Set by the first SIGTERM or SIGINT once the handlers are installed.
static REQUESTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// The outcome of installing the handlers (once per process).
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

/// The exit status of a second SIGINT (128 + SIGINT, the shell's convention for Ctrl-C).
const SECOND_SIGNAL_EXIT: i32 = 130;

/// Installs the SIGTERM and SIGINT handlers (once per process) and clears any earlier request,
/// so a new run in the same process (a retry after a stop) starts afresh.
pub(crate) fn install() -> Result<(), AccelerateError> {
    REQUESTED.store(false, Ordering::SeqCst);
    INSTALLED
        .get_or_init(|| {
            // Registered before the flag's own handler, so it sees the flag as it was: only a
            // second Ctrl-C exits.
            signal_hook::flag::register_conditional_shutdown(
                SIGINT,
                SECOND_SIGNAL_EXIT,
                REQUESTED.clone(),
            )
            .map_err(|e| format!("cannot handle SIGINT: {e}"))?;
            for signal in [SIGTERM, SIGINT] {
                signal_hook::flag::register(signal, REQUESTED.clone())
                    .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
            }
            Ok(())
        })
        .clone()
        .map_err(AccelerateError::Usage)
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Whether a stop was asked for (`stop_on_signal` and a SIGTERM or SIGINT received) on any
    /// rank: every rank gets the same answer at the same call, so all stop at the same step
    /// (one small all-reduce when distributed; call it once per optimizer step). Always false
    /// without `stop_on_signal`, with no collective.
    ///
    /// ```ignore
    /// model = acc.step(model, &mut optim, &mut lr)?;
    /// if acc.stop_requested()? {
    ///     acc.save_checkpoint(&parts)?;
    ///     return Err("stopped by a signal; state saved".into());
    /// }
    /// ```
    pub fn stop_requested(&self) -> Result<bool, AccelerateError> {
        if !self.config.stop_on_signal {
            return Ok(false);
        }
        let mine = REQUESTED.load(Ordering::SeqCst);
        Ok(self.ranks_voting_yes(mine)? > 0)
    }
}
