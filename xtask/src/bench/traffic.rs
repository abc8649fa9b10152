//! What an engine receives per FSDP optimizer step, by collective: FSDP's training steps run
//! through the Accelerator over an engine wrapped in a counting group, on the in-process
//! engine and (feature `mpi`) on the MPI engine of 2 processes on loopback. Both must see the
//! same calls: every collective reaches the engine's own implementation through the
//! Accelerator's boxed group (an all-gather is not turned into broadcasts on the way).

use std::sync::{Arc, Mutex, PoisonError};

use afterburner::parallel::{LaunchConfig, ParallelError, ProcessGroup, ReduceOp, launch};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, FsdpConfig, StrategyConfig};
use afterburner_demos::models::{Vit, VitConfig};
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};

type B = Autodiff<Flex>;

/// Optimizer steps each measured run takes.
pub const STEPS: usize = 3;

/// Values a rank handed to each kind of collective (f32 values; 4 bytes each on the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Values sent to all-gathers.
    pub all_gather: u64,
    /// Values sent to reduce-scatters.
    pub reduce_scatter: u64,
    /// Values sent to all-reduces.
    pub all_reduce: u64,
    /// Values sent to broadcasts (by the root).
    pub broadcast: u64,
}

#[cfg(feature = "mpi")]
impl Traffic {
    /// As text: `all_gather=.. reduce_scatter=.. all_reduce=.. broadcast=..`.
    pub fn line(&self) -> String {
        format!(
            "all_gather={} reduce_scatter={} all_reduce={} broadcast={}",
            self.all_gather, self.reduce_scatter, self.all_reduce, self.broadcast
        )
    }

    /// Parses [`line`](Self::line).
    pub fn parse(line: &str) -> Option<Self> {
        let mut t = Self::default();
        for field in line.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            let value = value.parse().ok()?;
            match name {
                "all_gather" => t.all_gather = value,
                "reduce_scatter" => t.reduce_scatter = value,
                "all_reduce" => t.all_reduce = value,
                "broadcast" => t.broadcast = value,
                _ => return None,
            }
        }
        Some(t)
    }
}

/// An engine whose calls are counted on the way in.
struct Counted<G> {
    engine: G,
    traffic: Arc<Mutex<Traffic>>,
}

impl<G> Counted<G> {
    fn add(&self, count: impl FnOnce(&mut Traffic)) {
        count(&mut self.traffic.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

fn len(t: &Tensor<Flex, 1>) -> u64 {
    t.dims()[0] as u64
}

impl<G: ProcessGroup<Flex>> ProcessGroup<Flex> for Counted<G> {
    fn rank(&self) -> usize {
        self.engine.rank()
    }

    fn world_size(&self) -> usize {
        self.engine.world_size()
    }

    fn all_reduce(
        &self,
        t: Tensor<Flex, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<Flex, 1>, ParallelError> {
        self.add(|c| c.all_reduce += len(&t));
        self.engine.all_reduce(t, op)
    }

    fn broadcast(
        &self,
        t: Option<Tensor<Flex, 1>>,
        root: usize,
    ) -> Result<Tensor<Flex, 1>, ParallelError> {
        self.add(|c| c.broadcast += t.as_ref().map_or(0, len));
        self.engine.broadcast(t, root)
    }

    fn all_gather(&self, t: Tensor<Flex, 1>) -> Result<Vec<Tensor<Flex, 1>>, ParallelError> {
        self.add(|c| c.all_gather += len(&t));
        self.engine.all_gather(t)
    }

    fn reduce_scatter(
        &self,
        t: Tensor<Flex, 1>,
        op: ReduceOp,
    ) -> Result<Tensor<Flex, 1>, ParallelError> {
        self.add(|c| c.reduce_scatter += len(&t));
        self.engine.reduce_scatter(t, op)
    }

    fn barrier(&self, device: &burn::tensor::Device<Flex>) -> Result<(), ParallelError> {
        self.engine.barrier(device)
    }
}

/// The model both engines train: the ViT of the ddp suite, small.
fn vit(device: &burn::tensor::Device<B>) -> Vit<B> {
    B::seed(device, 3);
    VitConfig::new()
        .with_d_model(64)
        .with_d_ff(128)
        .with_n_layers(2)
        .init(device)
}

/// Rank `rank`'s traffic over [`STEPS`] FSDP steps (one unit per block, AdamW) on `engine`.
fn fsdp_steps<G: ProcessGroup<Flex> + 'static>(
    engine: G,
    model: Vit<B>,
) -> Result<Traffic, AccelerateError> {
    let device = burn::tensor::Device::<Flex>::default();
    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let counted = Counted {
        engine,
        traffic: traffic.clone(),
    };
    let config = AcceleratorConfig::default().with_strategy(StrategyConfig::Fsdp(FsdpConfig {
        auto_wrap_policy: "TransformerEncoderLayer".parse()?,
        ..Default::default()
    }));
    let mut acc = Accelerator::<B>::with_group(config, device, Box::new(counted))?;
    let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init())?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let images = Tensor::<B, 4>::random([8, 1, 8, 8], Distribution::Normal(0.0, 1.0), &device);
    let labels = Tensor::<B, 1, Int>::from_data([0, 1, 2, 3, 4, 5, 6, 7].as_slice(), &device);
    // Counted from after setup: what each step moves.
    *traffic.lock().unwrap_or_else(PoisonError::into_inner) = Traffic::default();
    for _ in 0..STEPS {
        let logits = acc.forward(&model, images.clone(), |m, x| m.forward(x))?;
        acc.backward(loss_fn.forward(logits, labels.clone()), &model)?;
        model = acc.step(model, &mut optim, &mut 1e-3)?;
    }
    let total = *traffic.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(total)
}

/// Rank 0's traffic on the in-process engine, 2 workers.
pub fn in_process() -> Result<Traffic, String> {
    let model = vit(&Default::default());
    let ranks = launch::<Flex, _, AccelerateError, _>(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        move |group| fsdp_steps(group, model.clone()),
    )
    .map_err(|e| e.to_string())?;
    ranks.first().copied().ok_or_else(|| "no rank".into())
}

/// What rank 0 of the MPI job prints before its traffic line.
#[cfg(feature = "mpi")]
const MARK: &str = "FSDP_TRAFFIC";

/// Without the `mpi` feature there is no MPI engine to measure.
#[cfg(not(feature = "mpi"))]
pub fn over_mpi() -> Result<Option<Traffic>, String> {
    Ok(None)
}

/// Rank 0's traffic on the MPI engine, 2 processes on loopback (this binary's
/// `mpi-fsdp-traffic` command is the rank side).
#[cfg(feature = "mpi")]
pub fn over_mpi() -> Result<Option<Traffic>, String> {
    use std::time::Duration;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let run = afterburner::parallel::run_on_loopback(
        2,
        &exe,
        &["mpi-fsdp-traffic"],
        &[],
        Duration::from_secs(300),
    )
    .map_err(|e| format!("cannot start mpirun (install openmpi-bin): {e}"))?;
    if !run.success {
        return Err(format!("the MPI FSDP job failed:\n{}", run.output));
    }
    run.output
        .lines()
        .find_map(|l| Traffic::parse(l.strip_prefix(MARK)?.trim()))
        .map(Some)
        .ok_or_else(|| format!("no {MARK} line in the job's output:\n{}", run.output))
}

/// The rank side of [`over_mpi`], under `mpirun`.
#[cfg(feature = "mpi")]
pub fn mpi_rank() -> Result<(), String> {
    let model = vit(&Default::default());
    let traffic = afterburner::parallel::launch_mpi::<Flex, _, AccelerateError, _>(
        Default::default(),
        LaunchConfig::default(),
        |group| {
            let rank = group.rank();
            Ok((rank, fsdp_steps(group, model)?))
        },
    )
    .map_err(|e| e.to_string())?;
    if traffic.0 == 0 {
        println!("{MARK} {}", traffic.1.line());
    }
    Ok(())
}
