//! [`LaunchedGroup`]: a launched worker's process group, from the place `afterburner launch`
//! gave it ([`Launched`], afterburner-rendezvous's, which knows no tensors).

use afterburner_rendezvous::launched::token;
use afterburner_rendezvous::{Launched, RestartPolicy};
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, connect_tcp_with_token};

/// Connects a launched worker to its launch's process group.
pub trait LaunchedGroup {
    /// Connects this worker to the launch's lighthouse (waiting up to the collective timeout
    /// for it, presenting the environment's `AFTERBURNER_TOKEN`) and returns its process group
    /// on `device`: a fault-tolerant quorum group under [`RestartPolicy::Replica`], a group
    /// whose ranks fail together under [`RestartPolicy::All`].
    fn connect<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<Box<dyn ProcessGroup<B>>, ParallelError>;
}

impl LaunchedGroup for Launched {
    fn connect<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<Box<dyn ProcessGroup<B>>, ParallelError> {
        let group = connect_tcp_with_token::<B>(
            self.lighthouse.as_str(),
            self.rank,
            device,
            self.collective_timeout,
            token().as_deref(),
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
        Ok(match self.policy {
            RestartPolicy::Replica => Box::new(group),
            RestartPolicy::All => Box::new(group.failing_together()),
        })
    }
}
