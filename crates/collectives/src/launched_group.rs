//! [`LaunchedGroup`]: a launched worker's process group, from the place `afterburner launch`
//! gave it ([`Launched`], afterburner-rendezvous's, which knows no tensors).

use afterburner_rendezvous::launched::token;
use afterburner_rendezvous::{Declaration, Launched, RestartPolicy};
use burn::tensor::backend::Backend;

use crate::quorum::connect_declaring;
use crate::{ParallelError, ProcessGroup};

/// Connects a launched worker to its launch's process group.
pub trait LaunchedGroup {
    /// Connects this worker to the launch's lighthouse (waiting up to the collective timeout
    /// for it, presenting the environment's `AFTERBURNER_TOKEN`), declaring what it runs
    /// (`declaration`: its strategy and the restart policy that strategy needs, which the
    /// launch's lighthouse settles or checks), and returns its process group on `device`: a
    /// fault-tolerant quorum group under [`RestartPolicy::Replica`], a group whose ranks fail
    /// together under [`RestartPolicy::All`].
    fn connect<B: Backend>(
        &self,
        device: &B::Device,
        declaration: &Declaration,
    ) -> Result<Box<dyn ProcessGroup<B>>, ParallelError>;
}

impl LaunchedGroup for Launched {
    fn connect<B: Backend>(
        &self,
        device: &B::Device,
        declaration: &Declaration,
    ) -> Result<Box<dyn ProcessGroup<B>>, ParallelError> {
        let group = connect_declaring::<B>(
            self.lighthouse.as_str(),
            self.rank,
            device,
            self.collective_timeout,
            token().as_deref(),
            Some(declaration),
        )?;
        if group.world_size() != self.world_size {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "the lighthouse at {} serves {} ranks, this worker was launched as one of {}",
                    self.lighthouse,
                    group.world_size(),
                    self.world_size
                ),
            });
        }
        Ok(match declaration.policy {
            RestartPolicy::Replica => Box::new(group),
            RestartPolicy::All => Box::new(group.failing_together()),
        })
    }
}
