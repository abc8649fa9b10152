//! What the Trainer reads from the device, all at once: the training losses since the last
//! read and what the steps decided on the device did (at a log, a save, the end of training).

use burn::lr_scheduler::LrScheduler;

use super::{Trainer, TrainerTypes, lost_model};
use crate::{AccelerateError, SettledSteps};

impl<T: TrainerTypes> Trainer<T> {
    /// Adds the losses left on the device since the last read to the state's sums, in the
    /// order they came (one host read; none when there are none).
    pub(super) fn read_losses(&mut self) -> Result<(), AccelerateError> {
        // What the steps decided on the device did, read in the same host read.
        let (losses, steps) = self.unread.read(self.acc.device_step_values())?;
        for value in losses {
            self.state.loss_since_log += value;
            self.state.loss_total += value;
        }
        if let Some(values) = steps {
            let settled = self.acc.settle_device_steps(&values);
            self.after_device_steps(settled)?;
        }
        Ok(())
    }

    /// Brings the host's view up to the steps decided on the device: the LR schedule's
    /// position (it advances on applied steps only), the last rate and norm for the logs; a
    /// skipped step checks the parameters, as `step` does (a poisoned model ends the run).
    fn after_device_steps(&mut self, settled: SettledSteps) -> Result<(), AccelerateError> {
        for _ in 0..settled.applied {
            self.schedule.step();
        }
        let applied = self.acc.counters().optimizer_steps;
        if let (Some(gate), true) = (&self.gate, settled.applied > 0) {
            self.last_lr = Some(gate.lr_of(applied - 1));
        }
        self.last_grad_norm = settled.grad_norm;
        if settled.skipped > 0 {
            tracing::warn!(
                skipped = settled.skipped,
                "non-finite gradients: steps skipped on the device"
            );
            let model = self.model.as_ref().ok_or_else(lost_model)?;
            self.acc.check_parameters_finite(model)?;
        }
        Ok(())
    }
}
