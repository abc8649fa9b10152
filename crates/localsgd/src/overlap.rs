//! [`Overlapped`]: a process group that runs one collective on a background thread while the
//! training loop computes (Streaming DiLoCo's delayed exchange). Any other call on the group
//! first waits for it, so every rank sees the collectives in the same order.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use afterburner_parallel::{ParallelError, ProcessGroup, Quorum, ReduceOp};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

type Outcome<B> = Result<Tensor<B, 1>, ParallelError>;

/// The collective started in the background, if any.
enum InFlight<B: Backend> {
    Idle,
    Running(JoinHandle<Outcome<B>>),
    Done(Outcome<B>),
}

/// `group` with at most one collective in flight on a background thread.
pub(crate) struct Overlapped<B: Backend, G> {
    group: G,
    in_flight: Mutex<InFlight<B>>,
}

impl<B: Backend, G: ProcessGroup<B> + Clone + Send + 'static> Overlapped<B, G> {
    pub(crate) fn new(group: G) -> Self {
        Self {
            group,
            in_flight: Mutex::new(InFlight::Idle),
        }
    }

    fn state(&self) -> MutexGuard<'_, InFlight<B>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `op` on a clone of the group on a background thread (after any collective
    /// already in flight, whose result it replaces).
    pub(crate) fn start(&self, op: impl FnOnce(&G) -> Outcome<B> + Send + 'static) {
        let mut state = self.state();
        finish(&mut state);
        let group = self.group.clone();
        // Its host reads (the engines copy the values) count towards the replica's.
        let builder = std::thread::Builder::new().name("afterburner-diloco-exchange".into());
        let spawned = afterburner_precision::spawn_counted(builder, move || op(&group));
        *state = match spawned {
            Ok(handle) => InFlight::Running(handle),
            Err(e) => InFlight::Done(Err(ParallelError::Collective {
                op: "exchange",
                rank: self.group.rank(),
                reason: format!("cannot start the exchange thread: {e}"),
            })),
        };
    }

    /// Waits for the collective in flight and takes its result (`None` if none was started).
    pub(crate) fn take(&self) -> Option<Outcome<B>> {
        let mut state = self.state();
        finish(&mut state);
        match std::mem::replace(&mut *state, InFlight::Idle) {
            InFlight::Done(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// Waits for the collective in flight and returns a copy of its result, leaving it.
    pub(crate) fn peek(&self) -> Option<Outcome<B>> {
        let mut state = self.state();
        finish(&mut state);
        match &*state {
            InFlight::Done(outcome) => Some(outcome.clone()),
            _ => None,
        }
    }

    /// Puts back a result (e.g. restored from a saved state), as if its collective finished.
    pub(crate) fn set_done(&self, outcome: Option<Outcome<B>>) {
        *self.state() = outcome.map_or(InFlight::Idle, InFlight::Done);
    }

    /// Waits for the collective in flight, keeping its result.
    fn wait(&self) {
        finish(&mut self.state());
    }
}

/// A collective still in flight finishes before the group goes (never a detached thread
/// inside a collective).
impl<B: Backend, G> Drop for Overlapped<B, G> {
    fn drop(&mut self) {
        finish(
            &mut self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

/// Turns a running collective into its result.
fn finish<B: Backend>(state: &mut InFlight<B>) {
    if matches!(state, InFlight::Running(_))
        && let InFlight::Running(handle) = std::mem::replace(state, InFlight::Idle)
    {
        *state = InFlight::Done(handle.join().unwrap_or_else(|_| {
            Err(ParallelError::Collective {
                op: "exchange",
                rank: 0,
                reason: "the exchange thread panicked".into(),
            })
        }));
    }
}

impl<B: Backend, G: ProcessGroup<B> + Clone + Send + 'static> ProcessGroup<B> for Overlapped<B, G> {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn all_reduce(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.wait();
        self.group.all_reduce(t, op)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        self.wait();
        self.group.broadcast(t, root)
    }

    fn all_gather(&self, t: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        self.wait();
        self.group.all_gather(t)
    }

    fn reduce_scatter(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        self.wait();
        self.group.reduce_scatter(t, op)
    }

    fn barrier(&self, device: &B::Device) -> Result<(), ParallelError> {
        self.wait();
        self.group.barrier(device)
    }

    fn quorum(&self) -> Option<std::sync::Arc<dyn Quorum>> {
        self.group.quorum()
    }
}
