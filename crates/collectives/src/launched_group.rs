//! [`LaunchedGroup`]: a launched worker's process group, from the place `afterburner launch`
//! gave it ([`Launched`], afterburner-rendezvous's, which knows no tensors).

use afterburner_rendezvous::launched::token;
use afterburner_rendezvous::{Declaration, Engine, Launched, RestartPolicy};
use burn::tensor::backend::Backend;

use crate::quorum::group_of;
use crate::{ParallelError, ProcessGroup};

/// Connects a launched worker to its launch's process group.
pub trait LaunchedGroup {
    /// Connects this worker to the launch's lighthouse (waiting up to the collective timeout
    /// for it, presenting the environment's `AFTERBURNER_TOKEN`), declaring what it runs
    /// (`declaration`: its strategy and the restart policy that strategy needs, which the
    /// launch's lighthouse settles or checks), and returns its process group on `device`: a
    /// fault-tolerant quorum group under [`RestartPolicy::Replica`], a group whose ranks fail
    /// together under [`RestartPolicy::All`]. Under [`Engine::Mpi`] (`afterburner launch
    /// --engine mpi`) the lighthouse keeps the control plane only and the values go over MPI
    /// (a program built with feature `mpi`; without it, over the built-in ring); a strategy
    /// whose replicas heal alone is refused there, since `mpirun` cannot restart one rank.
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
        // The declaration first, under every engine: the launcher learns the policy from it.
        let connection = afterburner_rendezvous::connect(
            self.lighthouse.as_str(),
            self.rank,
            self.collective_timeout,
            token().as_deref(),
            Some(declaration),
        )?;
        if connection.replicas != self.world_size {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "the lighthouse at {} serves {} ranks, this worker was launched as one of {}",
                    self.lighthouse, connection.replicas, self.world_size
                ),
            });
        }
        if self.engine == Engine::Mpi {
            if declaration.policy == RestartPolicy::Replica {
                return Err(ParallelError::InvalidConfig {
                    field: afterburner_rendezvous::engine::ENGINE,
                    value: self.engine.to_string(),
                    expected: format!(
                        "tcp for {}: its replicas heal alone, one restarted while the others \
                         go on, which mpirun cannot do (it stops the whole job when a rank \
                         dies); `afterburner launch --engine auto` picks tcp for it by itself",
                        declaration.strategy
                    ),
                });
            }
            #[cfg(feature = "mpi")]
            return mpi_group::<B>(self, device, connection);
            #[cfg(not(feature = "mpi"))]
            tracing::warn!(
                rank = self.rank,
                "started by mpirun, but this program was built without feature `mpi`: its \
                 collectives go over the built-in ring"
            );
        }
        let group = group_of::<B>(connection, device)?;
        Ok(match declaration.policy {
            RestartPolicy::Replica => Box::new(group),
            RestartPolicy::All => Box::new(group.failing_together()),
        })
    }
}

/// A rank of an `mpirun` job: its values go over MPI; it keeps its lighthouse `connection`
/// (the control plane) while it runs.
#[cfg(feature = "mpi")]
fn mpi_group<B: Backend>(
    launched: &Launched,
    device: &B::Device,
    connection: afterburner_rendezvous::Connection,
) -> Result<Box<dyn ProcessGroup<B>>, ParallelError> {
    let timeout = launched.collective_timeout;
    let group = crate::MpiGroup::<B>::joined(device.clone(), timeout, Some(connection))?;
    if (group.rank(), group.world_size()) != (launched.rank, launched.world_size) {
        return Err(ParallelError::Mismatch {
            rank: launched.rank,
            reason: format!(
                "MPI places this process at rank {} of {}, its environment at {} of {}",
                group.rank(),
                group.world_size(),
                launched.rank,
                launched.world_size
            ),
        });
    }
    Ok(Box::new(group))
}
