//! [`Engine`]: what starts a launched run's workers and moves their values, and the names
//! under which a worker started by Open MPI's `mpirun` finds its place.

use crate::RendezvousError;

/// The variable that tells a launched worker its engine ([`Engine`]'s spelling).
pub const ENGINE: &str = "AFTERBURNER_ENGINE";

/// Open MPI's variable for the global rank (what `RANK` is under the built-in engine).
pub const MPI_RANK: &str = "OMPI_COMM_WORLD_RANK";
/// Open MPI's variable for the number of ranks.
pub const MPI_WORLD_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
/// Open MPI's variable for the rank on this node.
pub const MPI_LOCAL_RANK: &str = "OMPI_COMM_WORLD_LOCAL_RANK";
/// Open MPI's variable for the ranks on this node.
pub const MPI_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";

/// `mpirun` flags for a job on one machine: allowed as root, more ranks than cores, TCP on the
/// loopback interface only (no shared-memory transport, which containers often forbid). Use:
/// `mpirun <flags> -np 2 <program>`.
pub const LOOPBACK_MPIRUN_FLAGS: &[&str] = &[
    "--allow-run-as-root",
    "--oversubscribe",
    "--mca",
    "btl",
    "self,tcp",
    "--mca",
    "btl_tcp_if_include",
    "lo",
    "--mca",
    "oob_tcp_if_include",
    "lo",
];

/// What starts a launched run's workers and moves the values of their collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// The built-in one: the launcher starts each worker itself, and their collectives go
    /// over a TCP ring between them (the lighthouse keeps the control plane: membership,
    /// quorum, who heals whom). Serves every strategy, and the only one whose replicas can be
    /// restarted one at a time (Local SGD, DiLoCo).
    #[default]
    Tcp,
    /// Open MPI: the launcher starts each attempt as one `mpirun` job, and a program built with
    /// feature `mpi` runs its collectives over MPI. For the strategies whose ranks fail
    /// together (DDP, ZeRO-1, FSDP, tensor parallel): `mpirun` stops the whole job when a rank
    /// dies, and the launcher starts it again.
    Mpi,
}

impl Engine {
    /// Each engine with its spelling, once (parse and print; any ASCII case parses).
    pub const SPELLINGS: [(Engine, &'static str); 2] = [(Engine::Tcp, "tcp"), (Engine::Mpi, "mpi")];

    /// The variable holding `torch_name`'s value under this engine: torchrun's names under
    /// [`Engine::Tcp`], Open MPI's under [`Engine::Mpi`] (`RANK` is `OMPI_COMM_WORLD_RANK`).
    pub fn place_variable(self, torch_name: &'static str) -> &'static str {
        use crate::launched::{LOCAL_RANK, LOCAL_WORLD_SIZE, RANK, WORLD_SIZE};
        match (self, torch_name) {
            (Engine::Mpi, RANK) => MPI_RANK,
            (Engine::Mpi, WORLD_SIZE) => MPI_WORLD_SIZE,
            (Engine::Mpi, LOCAL_RANK) => MPI_LOCAL_RANK,
            (Engine::Mpi, LOCAL_WORLD_SIZE) => MPI_LOCAL_SIZE,
            _ => torch_name,
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spelling = Self::SPELLINGS
            .iter()
            .find(|(engine, _)| engine == self)
            .map_or("tcp", |(_, spelling)| spelling);
        f.write_str(spelling)
    }
}

impl std::str::FromStr for Engine {
    type Err = RendezvousError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::SPELLINGS
            .iter()
            .find(|(_, spelling)| spelling.eq_ignore_ascii_case(text.trim()))
            .map(|(engine, _)| *engine)
            .ok_or_else(|| RendezvousError::InvalidConfig {
                field: ENGINE,
                value: text.to_string(),
                expected: "tcp or mpi".into(),
            })
    }
}
