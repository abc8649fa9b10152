//! The multi-process engine: [`MpiGroup`], one rank per process, over MPI (Open MPI through the
//! `mpi` crate). Feature `mpi`; needs `libopenmpi-dev`, `openmpi-bin` and `libclang-dev`.
//!
//! Start the program with `afterburner launch --engine mpi` (the Accelerator then joins with
//! [`MpiGroup::joined`], and the launcher restarts the job after a failure), or with `mpirun`
//! by hand (one process per device; `--host a:4,b:4` for nodes, like a torchrun job) and call
//! [`launch_mpi`] once: it reads the rank and world size from the MPI environment. Failures
//! end the whole job with an error instead of a hang: a worker that returns an error or panics
//! calls `MPI_Abort`, and a collective that waits longer than the timeout aborts its process,
//! after which `mpirun` stops the others.

use std::fmt::Display;
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use mpi::{Count, Threading};

use crate::group::all_gather_by_broadcasts;
use crate::{LaunchConfig, ParallelError, ProcessGroup, ReduceOp};

pub use afterburner_rendezvous::engine::LOOPBACK_MPIRUN_FLAGS;

/// How often the watchdog looks at the collective in flight.
const WATCHDOG_POLL: Duration = Duration::from_millis(100);

/// This process's rank of an MPI job, on device `device` of backend `B`.
///
/// Tensors go through host memory (`f32`): each collective copies its tensor to the host, runs
/// the MPI collective and copies the result back. All calls come from the thread that called
/// [`launch_mpi`] or threads it waits for (MPI is initialised `Serialized`).
pub struct MpiGroup<B: Backend> {
    rank: usize,
    size: usize,
    device: B::Device,
    watchdog: Arc<Watchdog>,
    /// The most elements one MPI call moves: MPI counts are 32-bit, so longer buffers go in
    /// pieces of at most this many.
    max_count: usize,
    /// A rank of `afterburner launch --engine mpi` keeps its connection to the launch's
    /// lighthouse (the control plane: its declaration, its presence) while it runs.
    pub(crate) control: Option<afterburner_rendezvous::Connection>,
}

/// The largest element count of one MPI call (MPI's `int` count).
const MAX_MPI_COUNT: usize = i32::MAX as usize;

/// The collective in flight, if any, and since when.
struct Watchdog {
    rank: usize,
    timeout: Duration,
    in_flight: Mutex<Option<(Instant, &'static str)>>,
}

impl Watchdog {
    fn start(rank: usize, timeout: Duration) -> Arc<Self> {
        let dog = Arc::new(Self {
            rank,
            timeout,
            in_flight: Mutex::new(None),
        });
        let watched = Arc::downgrade(&dog);
        std::thread::Builder::new()
            .name("afterburner-mpi-watchdog".into())
            .spawn(move || {
                while let Some(dog) = watched.upgrade() {
                    dog.check();
                    drop(dog);
                    std::thread::sleep(WATCHDOG_POLL);
                }
            })
            .expect("afterburner-parallel: cannot start the MPI watchdog thread");
        dog
    }

    /// Aborts the process when the collective in flight is overdue: a peer died or stopped
    /// calling collectives, and MPI itself would wait forever.
    fn check(&self) {
        let overdue = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter(|(since, _)| since.elapsed() > self.timeout);
        if let Some((_, op)) = overdue {
            eprintln!(
                "afterburner: rank {}: {op} did not complete within {} s; aborting the MPI job",
                self.rank,
                self.timeout.as_secs_f64()
            );
            std::process::abort();
        }
    }

    fn during<T>(&self, op: &'static str, call: impl FnOnce() -> T) -> T {
        *self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), op));
        let out = call();
        *self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        out
    }
}

fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

fn host(tensor: Tensor<impl Backend, 1>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap_or_default()
}

impl<B: Backend> MpiGroup<B> {
    /// Moves at most `max_count` elements per MPI call (at least 1), so a test can exercise
    /// the pieces a buffer over 2^31 values is sent in.
    #[cfg(feature = "testing")]
    pub fn with_max_count(mut self, max_count: usize) -> Self {
        self.max_count = max_count.clamp(1, MAX_MPI_COUNT);
        self
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Ends the whole MPI job with exit code `code` (every process), after printing `reason`.
    pub fn abort(&self, reason: impl Display, code: i32) -> ! {
        eprintln!(
            "afterburner: rank {} failed: {reason}; aborting the MPI job",
            self.rank
        );
        world().abort(code)
    }

    /// A summed buffer as the result of `op` (divided by the world size for the mean).
    fn reduced(&self, mut sum: Vec<f32>, op: ReduceOp, dtype: DType) -> Tensor<B, 1> {
        if op == ReduceOp::Mean {
            let n = self.size as f32;
            sum.iter_mut().for_each(|v| *v /= n);
        }
        self.tensor(sum, dtype)
    }

    /// The element-wise sum over ranks of `mine` (same length everywhere), in pieces of at
    /// most `max_count` elements.
    fn summed(&self, op: &'static str, mine: &[f32]) -> Vec<f32> {
        let mut sum = vec![0f32; mine.len()];
        for (piece, out) in mine
            .chunks(self.max_count)
            .zip(sum.chunks_mut(self.max_count))
        {
            self.watchdog.during(op, || {
                world().all_reduce_into(piece, out, SystemOperation::sum())
            });
        }
        sum
    }

    fn tensor(&self, values: Vec<f32>, dtype: DType) -> Tensor<B, 1> {
        let len = values.len();
        Tensor::<B, 1>::from_data(TensorData::new(values, [len]), &self.device).cast(dtype)
    }

    /// Errors on every rank when the ranks pass different lengths (MPI would truncate or
    /// abort): one small all-reduce of `[len, -len]` with `max`.
    fn same_length(&self, op: &'static str, len: usize) -> Result<(), ParallelError> {
        let mine = [len as i64, -(len as i64)];
        let mut max = [0i64; 2];
        self.watchdog.during(op, || {
            world().all_reduce_into(&mine[..], &mut max[..], SystemOperation::max())
        });
        if max[0] != -max[1] {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "{op}: ranks passed between {} and {} values",
                    -max[1], max[0]
                ),
            });
        }
        Ok(())
    }
}

impl<B: Backend> ProcessGroup<B> for MpiGroup<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let dtype = tensor.dtype();
        let mine = host(tensor);
        self.same_length("all_reduce", mine.len())?;
        Ok(self.reduced(self.summed("all_reduce", &mine), op, dtype))
    }

    fn broadcast(
        &self,
        tensor: Option<Tensor<B, 1>>,
        root: usize,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        if root >= self.size || tensor.is_some() != (root == self.rank) {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "broadcast from rank {root} of {}: the root must pass a tensor, the others \
                     none",
                    self.size
                ),
            });
        }
        let dtype = tensor.as_ref().map_or(DType::F32, Tensor::dtype);
        let mut values = tensor.map(host).unwrap_or_default();
        let mut header = [values.len() as u64, dtype_code(dtype)];
        let world = world();
        let from = world.process_at_rank(root as i32);
        self.watchdog
            .during("broadcast", || from.broadcast_into(&mut header[..]));
        values.resize(header[0] as usize, 0.0);
        for piece in values.chunks_mut(self.max_count) {
            self.watchdog
                .during("broadcast", || from.broadcast_into(&mut piece[..]));
        }
        Ok(self.tensor(values, dtype_from_code(header[1])))
    }

    fn all_gather(&self, tensor: Tensor<B, 1>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        let dtype = tensor.dtype();
        let mine = host(tensor);
        let mut lengths = vec![0u64; self.size];
        self.watchdog.during("all_gather", || {
            world().all_gather_into(&(mine.len() as u64), &mut lengths[..])
        });
        if lengths.iter().sum::<u64>() > self.max_count as u64 {
            // Too long for one call's 32-bit counts: one (chunked) broadcast per rank.
            return all_gather_by_broadcasts(self, self.tensor(mine, dtype));
        }
        let counts: Vec<Count> = lengths.iter().map(|&l| l as Count).collect();
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |at, &c| {
                let start = *at;
                *at += c;
                Some(start)
            })
            .collect();
        let total = counts.iter().map(|&c| c as usize).sum();
        let mut all = vec![0f32; total];
        {
            let mut parts = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.watchdog.during("all_gather", || {
                world().all_gather_varcount_into(&mine[..], &mut parts)
            });
        }
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| {
                let (c, d) = (c as usize, d as usize);
                self.tensor(all[d..d + c].to_vec(), dtype)
            })
            .collect())
    }

    fn reduce_scatter(
        &self,
        tensor: Tensor<B, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let dtype = tensor.dtype();
        let mine = host(tensor);
        // Lengths first (every rank joins), so an indivisible length errors on every rank.
        self.same_length("reduce_scatter", mine.len())?;
        if !mine.len().is_multiple_of(self.size) {
            return Err(ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "reduce_scatter of {} values over {} ranks",
                    mine.len(),
                    self.size
                ),
            });
        }
        let len = mine.len() / self.size;
        if mine.len() > self.max_count {
            // Too long for one call: a (chunked) all-reduce, keeping this rank's part.
            let sum = self.summed("reduce_scatter", &mine);
            let part = sum[self.rank * len..(self.rank + 1) * len].to_vec();
            return Ok(self.reduced(part, op, dtype));
        }
        let mut chunk = vec![0f32; len];
        self.watchdog.during("reduce_scatter", || {
            world().reduce_scatter_block_into(&mine[..], &mut chunk[..], SystemOperation::sum())
        });
        Ok(self.reduced(chunk, op, dtype))
    }

    fn barrier(&self, _device: &B::Device) -> Result<(), ParallelError> {
        self.watchdog.during("barrier", || world().barrier());
        Ok(())
    }
}

/// Float dtypes a broadcast can announce (values travel as f32 and are cast back).
const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

fn dtype_code(dtype: DType) -> u64 {
    DTYPES.iter().position(|d| *d == dtype).unwrap_or(0) as u64
}

fn dtype_from_code(code: u64) -> DType {
    DTYPES.get(code as usize).copied().unwrap_or(DType::F32)
}

/// Runs `worker` as this process's rank of the MPI job `mpirun` started, on `device`, and
/// returns its result. Call it once per process, from `main`'s thread.
///
/// The rank and world size come from the MPI environment. If the worker returns an error or
/// panics, the whole job is aborted (every process exits with an error); a collective waiting
/// longer than `config.timeout` aborts too. Outside `mpirun` the process is a job of one rank.
pub fn launch_mpi<B, R, E, F>(
    device: B::Device,
    config: LaunchConfig,
    worker: F,
) -> Result<R, ParallelError>
where
    B: Backend,
    E: Display,
    F: FnOnce(MpiGroup<B>) -> Result<R, E>,
{
    let universe = init()?;
    let world = universe.world();
    let group = MpiGroup::ready(device, config.timeout);
    let rank = group.rank;
    match worker(group) {
        Ok(result) => {
            drop(universe); // MPI_Finalize
            Ok(result)
        }
        Err(e) => {
            eprintln!("afterburner: rank {rank} failed: {e}; aborting the MPI job");
            world.abort(1)
        }
    }
}

impl<B: Backend> MpiGroup<B> {
    /// This rank of the MPI world, once MPI is initialised: a panic anywhere now ends the job,
    /// and a collective waiting longer than `timeout` aborts it.
    pub(crate) fn ready(device: B::Device, timeout: Duration) -> Self {
        let world = world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        abort_job_on_panic();
        tracing::info!(rank, world_size = size, "MPI rank ready");
        MpiGroup {
            rank,
            size,
            device,
            watchdog: Watchdog::start(rank, timeout),
            max_count: MAX_MPI_COUNT,
            control: None,
        }
    }
}

/// Initialises MPI for this process (once: a second call errs).
pub(crate) fn init() -> Result<Universe, ParallelError> {
    let err = |reason: &str| ParallelError::Collective {
        op: "MPI_Init_thread",
        rank: 0,
        reason: reason.into(),
    };
    let (universe, level) = mpi::initialize_with_threading(Threading::Serialized)
        .ok_or_else(|| err("MPI is already initialised in this process: launch_mpi runs once"))?;
    if level < Threading::Serialized {
        return Err(err(
            "this MPI library cannot be called from several (serialized) threads",
        ));
    }
    Ok(universe)
}

/// A panic anywhere in the process ends the whole job (after the usual panic message), so the
/// other ranks do not wait for this one forever.
fn abort_job_on_panic() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("afterburner: a panic on this rank; aborting the MPI job");
            world().abort(101);
        }));
    });
}
