//! The in-process engine: one worker thread per device, collectives by burn-collective, with
//! the failure handling burn-collective lacks (a shared failure record and a watchdog).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{CollectiveError, PeerId, ReduceOperation};

use crate::{ParallelError, ProcessGroup, ReduceOp};

/// What the workers of one launch share: the first failure, and which collective each rank is
/// waiting in (for the watchdog).
pub(crate) struct Health {
    failure: Mutex<Option<ParallelError>>,
    in_flight: Mutex<Vec<Option<(Instant, &'static str)>>>,
    /// Unblocks every rank waiting in a collective (burn-collective's reset).
    reset: fn(),
}

impl Health {
    pub(crate) fn new(world_size: usize, reset: fn()) -> Self {
        Self {
            failure: Mutex::new(None),
            in_flight: Mutex::new(vec![None; world_size]),
            reset,
        }
    }

    /// Records `error` if it is the first failure, and unblocks every waiting rank.
    pub(crate) fn fail(&self, error: ParallelError) {
        {
            let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            if failure.is_some() {
                return;
            }
            tracing::error!("{error}");
            *failure = Some(error);
        }
        (self.reset)();
    }

    /// The first failure, if any.
    pub(crate) fn failure(&self) -> Option<ParallelError> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_in_flight(&self, rank: usize, op: Option<&'static str>) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        in_flight[rank] = op.map(|op| (Instant::now(), op));
    }

    /// Fails the launch if a rank has waited in a collective longer than `timeout`.
    pub(crate) fn check_timeouts(&self, timeout: Duration) {
        let overdue = {
            let in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            in_flight
                .iter()
                .enumerate()
                .find_map(|(rank, op)| match op {
                    Some((since, op)) if since.elapsed() > timeout => Some((rank, *op)),
                    _ => None,
                })
        };
        if let Some((rank, op)) = overdue {
            self.fail(ParallelError::Timeout {
                op,
                rank,
                seconds: timeout.as_secs_f64(),
            });
        }
    }
}

/// One rank of an in-process group; made by [`launch`](crate::launch) for each worker.
pub struct LocalGroup<B: Backend> {
    rank: usize,
    world_size: usize,
    device: B::Device,
    health: Arc<Health>,
}

impl<B: Backend> LocalGroup<B> {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        device: B::Device,
        health: Arc<Health>,
    ) -> Self {
        Self {
            rank,
            world_size,
            device,
            health,
        }
    }

    /// This worker's device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Runs one collective: refuses if the group already failed, marks it for the watchdog,
    /// and turns an engine error into the group's failure when there is one.
    fn run<T>(
        &self,
        op: &'static str,
        call: impl FnOnce() -> Result<T, CollectiveError>,
    ) -> Result<T, ParallelError> {
        if let Some(failure) = self.health.failure() {
            return Err(failure);
        }
        self.health.set_in_flight(self.rank, Some(op));
        let result = call();
        self.health.set_in_flight(self.rank, None);
        result.map_err(|e| {
            self.health.failure().unwrap_or(ParallelError::Collective {
                op,
                rank: self.rank,
                reason: format!("{e:?}"),
            })
        })
    }

    fn peer(&self) -> PeerId {
        PeerId(self.rank as u32)
    }
}

fn primitive<B: Backend>(tensor: Tensor<B, 1>) -> B::FloatTensorPrimitive {
    tensor.into_primitive().tensor()
}

fn tensor<B: Backend>(primitive: B::FloatTensorPrimitive) -> Tensor<B, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

impl<B: Backend> ProcessGroup<B> for LocalGroup<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce(&self, t: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>, ParallelError> {
        let op = match op {
            ReduceOp::Sum => ReduceOperation::Sum,
            ReduceOp::Mean => ReduceOperation::Mean,
        };
        self.run("all_reduce", || {
            burn_collective::all_reduce::<B>(self.peer(), primitive(t), op)
        })
        .map(tensor)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        if t.is_some() != (root == self.rank) {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!("broadcast from rank {root}: only the root passes a tensor"),
            });
        }
        self.run("broadcast", || {
            burn_collective::broadcast::<B>(self.peer(), t.map(primitive))
        })
        .map(tensor)
    }
}
