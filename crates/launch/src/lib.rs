//! `afterburner launch`: one command starts the workers of a multi-process run, watches them
//! and restarts them, in the shape PyTorch users know from torchrun.
//!
//! ```text
//! afterburner launch --nproc 2 --max-restarts 3 -- target/release/examples/vit_classify --strategy ddp
//! ```
//!
//! Each worker gets its place through the environment ([`afterburner_rendezvous::launched`]:
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `AFTERBURNER_LIGHTHOUSE`, ...), which the Accelerator
//! and the Trainer read. Node 0's launcher serves the rendezvous (the lighthouse the workers'
//! process group meets at). Two restart policies (docs/launch.md), given with
//! `--restart-policy` or, by default (`auto`), settled by the workers: each declares at the
//! rendezvous the strategy it runs and whether its replicas heal alone; the launcher never
//! reads the program's command line.
//!
//! - `all` (DDP, ZeRO-1, FSDP): a worker's death stops the others; all start again and resume
//!   from the last committed checkpoint.
//! - `replica` (Local SGD, DiLoCo): only the dead worker starts again; it is healed from a
//!   live replica while the others go on.
//!
//! Two engines (`--engine`): `tcp` (the default) starts each worker itself and their values go
//! over a TCP ring between them; `mpi` starts each attempt as one `mpirun` job (collectives over
//! Open MPI in a program built with feature `mpi`) and starts it again whole after a failure;
//! `auto` takes `mpi` where `mpirun` is installed and the launch can use it.

#![warn(missing_docs)]

mod args;
mod blame;
mod error;
mod mpi_job;
mod pids;
mod supervise;
mod worker;

pub use args::{EngineChoice, LaunchArgs, PolicyChoice, parse_args};
pub use error::LaunchError;
pub use pids::{kill_worker, launched_workers};
pub use supervise::launch;
