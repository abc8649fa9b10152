//! A rank of a job `afterburner launch --engine mpi` started under `mpirun`: MPI is
//! initialised when the Accelerator asks for its group and stays so until the process exits,
//! where the exit status decides how MPI ends. A rank that succeeded finalises (a collective
//! farewell every rank makes); a rank that failed aborts the job, so its peers stop at once
//! instead of waiting in a collective (or in their own finalise) for a rank that is gone.

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use burn::tensor::backend::Backend;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

use crate::mpi::init;
use crate::{MpiGroup, ParallelError};

/// The MPI environment of a launched rank, ended at exit by [`end_mpi`].
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);

impl<B: Backend> MpiGroup<B> {
    /// This process's rank of the MPI job `mpirun` started, on `device`, for the life of the
    /// process: a panic ends the job, a collective waiting longer than `timeout` aborts it,
    /// and at exit MPI is finalised (exit status 0) or the job aborted (any other status).
    /// `control` is the rank's connection to its launch's lighthouse, kept while it runs.
    /// Errs when MPI was already initialised in this process ([`launch_mpi`](crate::launch_mpi)
    /// or an earlier group).
    pub fn joined(
        device: B::Device,
        timeout: Duration,
        control: Option<afterburner_rendezvous::Connection>,
    ) -> Result<Self, ParallelError> {
        let universe = init()?;
        *UNIVERSE.lock().unwrap_or_else(PoisonError::into_inner) = Some(universe);
        end_mpi_at_exit();
        let mut group = Self::ready(device, timeout);
        group.control = control;
        Ok(group)
    }
}

#[cfg(target_env = "gnu")]
unsafe extern "C" {
    /// glibc's `on_exit(3)`: like `atexit`, with the exit status.
    fn on_exit(function: extern "C" fn(i32, *mut c_void), argument: *mut c_void) -> i32;
}

/// Registers [`end_mpi`] to run at exit (glibc; elsewhere MPI is left to `mpirun`, which
/// reports a rank that exits without finalising as failed).
fn end_mpi_at_exit() {
    #[cfg(target_env = "gnu")]
    // SAFETY: registers a plain function with no argument; it runs once, at exit.
    unsafe {
        on_exit(end_mpi, std::ptr::null_mut());
    }
}

/// At exit: finalise MPI after a success, abort the job with the status after a failure.
extern "C" fn end_mpi(status: i32, _: *mut c_void) {
    let universe = UNIVERSE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let Some(universe) = universe else {
        return;
    };
    match status {
        0 => drop(universe), // MPI_Finalize
        _ => {
            eprintln!("afterburner: this rank exits with status {status}; aborting the MPI job");
            SimpleCommunicator::world().abort(status)
        }
    }
}
