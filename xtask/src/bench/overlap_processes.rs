//! DDP's overlap on the real engines between processes: 2 worker processes on loopback over
//! the ring (`afterburner launch`'s engine) and, with feature `mpi`, over Open MPI; the step
//! with the buckets reduced during backward, after backward, and with no reduction at all
//! (compute alone, the same 2 processes sharing the machine's cores), next to one all-reduce of
//! the step's gradients alone. Moving a bucket (the copy to the host, the sums, the syscalls)
//! competes with backward for the same cores here, unlike behind overlap.rs's sleeping link.
//! `xtask ddp-overlap-rank ENGINE ADDRESS RANK MODEL MODE STEPS WARMUP` (ring) and
//! `xtask mpi-ddp-overlap-rank MODEL MODE STEPS WARMUP` (under `mpirun`) are the rank side.

use std::time::{Duration, Instant};

use afterburner::checkpoint::Checkpointed;
use afterburner::parallel::{Ddp, LINK_RATE_VAR, ProcessGroup, ReduceOp, SharedGroup, connect_tcp};
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Device, Distribution, Tensor};

type B = Autodiff<Flex>;

/// Blocks, width and rows per worker of the models timed.
const BLOCKS: usize = 8;
const WIDTH: usize = 512;
const ROWS: usize = 128;
/// One bucket per block (each block's weights are 1 MiB).
const BUCKET_CAP_MB: f64 = 1.0;
/// The paced link's rate, MB/s.
const PACED_MBPS: f64 = 400.0;
/// What rank 0 prints: the median step and the median all-reduce of the step's gradients, in
/// nanoseconds.
const MARK: &str = "DDP_OVERLAP_NS";

/// How a step reduces its gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No reduction (compute alone).
    Alone,
    /// The buckets all-reduced after backward.
    After,
    /// The buckets all-reduced on the communication thread during backward.
    During,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Alone, Mode::After, Mode::During];

    fn name(self) -> &'static str {
        match self {
            Mode::Alone => "alone",
            Mode::After => "after",
            Mode::During => "during",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// The demo shape: blocks wrapped in `Checkpointed` (their gradients reach a bucket as each
/// block's backward ends).
#[derive(Module, Debug)]
struct Wrapped<B: Backend> {
    blocks: Vec<Checkpointed<B, Linear<B>>>,
}

/// Burn's own layers, nothing wrapped.
#[derive(Module, Debug)]
struct Plain<B: Backend> {
    blocks: Vec<Linear<B>>,
}

fn linear<B: Backend>(device: &B::Device) -> Linear<B> {
    LinearConfig::new(WIDTH, WIDTH)
        .with_bias(false)
        .init(device)
}

/// A model timed here.
trait Timed: AutodiffModule<B> + Clone {
    fn build(device: &Device<B>) -> Self;
    fn run(&self, x: Tensor<B, 2>) -> Tensor<B, 2>;
}

impl Timed for Wrapped<B> {
    fn build(device: &Device<B>) -> Self {
        let blocks = (0..BLOCKS)
            .map(|_| Checkpointed::new(linear(device)))
            .collect();
        Self { blocks }
    }

    fn run(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for block in &self.blocks {
            x = block.forward(x, |linear: &Linear<B>, x| linear.forward(x).tanh());
        }
        x
    }
}

impl Timed for Plain<B> {
    fn build(device: &Device<B>) -> Self {
        Self {
            blocks: (0..BLOCKS).map(|_| linear(device)).collect(),
        }
    }

    fn run(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for block in &self.blocks {
            x = block.forward(x).tanh();
        }
        x
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// One rank's medians over `steps` timed steps of model `M` in `mode`, then over as many
/// all-reduces of the step's gradients alone: (step, all-reduce).
fn rank_side<M: Timed, G: ProcessGroup<Flex> + 'static>(
    group: G,
    mode: Mode,
    steps: usize,
    warmup: usize,
) -> Result<(Duration, Duration), String> {
    let err = |e: afterburner::parallel::ParallelError| e.to_string();
    let device = Default::default();
    <Flex as Backend>::seed(&device, 0);
    let group = SharedGroup::new(group);
    let mut ddp = Ddp::<B, _>::new(group.clone())
        .with_bucket_cap_mb(BUCKET_CAP_MB)
        .map_err(err)?;
    if mode == Mode::During {
        ddp = ddp.with_overlap().map_err(err)?;
    }
    let mut model = ddp.setup(M::build(&device)).map_err(err)?;
    let mut optim = SgdConfig::new().init();
    let mut times = Vec::new();
    for step in 0..warmup + steps {
        let x = Tensor::<B, 2>::random([ROWS, WIDTH], Distribution::Default, &device);
        group.barrier(&device).map_err(err)?;
        let start = Instant::now();
        let view = (mode == Mode::During)
            .then(|| ddp.view(&model, None))
            .flatten();
        let loss = view.as_ref().unwrap_or(&model).run(x).powi_scalar(2).mean();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        if mode != Mode::Alone {
            ddp.sync_gradients(&model, &mut grads).map_err(err)?;
        }
        model = optim.step(0.01, model, grads);
        Flex::sync(&device).ok();
        if step >= warmup {
            times.push(start.elapsed());
        }
    }
    if mode == Mode::During && ddp.overlapped_syncs() == 0 {
        return Err("no step was reduced during backward".into());
    }
    let gradients = Tensor::<Flex, 1>::ones([BLOCKS * WIDTH * WIDTH], &device);
    let mut all_reduces = Vec::new();
    for _ in 0..steps.max(3) {
        group.barrier(&device).map_err(err)?;
        let start = Instant::now();
        let reduced = group
            .all_reduce(gradients.clone(), ReduceOp::Sum)
            .map_err(err)?;
        Flex::sync(&device).ok();
        drop(reduced);
        all_reduces.push(start.elapsed());
    }
    Ok((median(times), median(all_reduces)))
}

/// [`rank_side`] for the model named `model`, printing rank 0's line.
fn run_rank<G: ProcessGroup<Flex> + 'static>(
    group: G,
    model: &str,
    mode: &str,
    steps: &str,
    warmup: &str,
) -> Result<(), String> {
    let mode = Mode::parse(mode).ok_or_else(|| format!("mode {mode}: alone, after or during"))?;
    let number = |s: &str| s.parse::<usize>().map_err(|_| format!("{s}: not a count"));
    let (steps, warmup) = (number(steps)?, number(warmup)?);
    let rank = group.rank();
    let (step, all_reduce) = match model {
        "wrapped" => rank_side::<Wrapped<B>, _>(group, mode, steps, warmup)?,
        "plain" => rank_side::<Plain<B>, _>(group, mode, steps, warmup)?,
        other => return Err(format!("model {other}: wrapped or plain")),
    };
    if rank == 0 {
        println!("{MARK} {} {}", step.as_nanos(), all_reduce.as_nanos());
    }
    Ok(())
}

/// The ring rank side: `ADDRESS RANK MODEL MODE STEPS WARMUP`.
pub fn rank(args: &[String]) -> Result<(), String> {
    let usage = "usage: xtask ddp-overlap-rank ADDRESS RANK wrapped|plain alone|after|during \
                 STEPS WARMUP";
    let [address, rank, model, mode, steps, warmup] = args else {
        return Err(usage.into());
    };
    let rank = rank.parse::<usize>().map_err(|_| usage.to_string())?;
    let group = connect_tcp::<Flex>(
        address.as_str(),
        rank,
        &Default::default(),
        Duration::from_secs(120),
    )
    .map_err(|e| e.to_string())?
    .failing_together();
    run_rank(group, model, mode, steps, warmup)
}

/// The MPI rank side, under `mpirun`: `MODEL MODE STEPS WARMUP`.
#[cfg(feature = "mpi")]
pub fn mpi_rank(args: &[String]) -> Result<(), String> {
    use afterburner::parallel::{LaunchConfig, launch_mpi};
    let [model, mode, steps, warmup] = args else {
        return Err(
            "usage: xtask mpi-ddp-overlap-rank wrapped|plain alone|after|during STEPS \
                    WARMUP"
                .into(),
        );
    };
    let (model, mode, steps, warmup) = (model.clone(), mode.clone(), steps.clone(), warmup.clone());
    launch_mpi::<Flex, _, String, _>(Default::default(), LaunchConfig::default(), move |g| {
        run_rank(g, &model, &mode, &steps, &warmup)
    })
    .map_err(|e| e.to_string())
}

/// Rank 0's (step, all-reduce) medians, parsed from `output`.
fn parse(output: &str) -> Option<(Duration, Duration)> {
    let line = output.lines().find_map(|l| l.strip_prefix(MARK))?;
    let mut words = line.split_whitespace().map(|w| w.parse::<u64>().ok());
    Some((
        Duration::from_nanos(words.next()??),
        Duration::from_nanos(words.next()??),
    ))
}

/// 2 ring ranks of this binary on a lighthouse of this process, their link paced to `mbps`
/// MB/s when given.
fn over_ring(
    model: &str,
    mode: Mode,
    steps: usize,
    warmup: usize,
    mbps: Option<f64>,
) -> Result<(Duration, Duration), String> {
    let env: Vec<(&str, String)> = mbps
        .map(|rate| (LINK_RATE_VAR, rate.to_string()))
        .into_iter()
        .collect();
    let output = super::engines::ranks_of_this_binary(2, &env, |address, rank| {
        [
            "ddp-overlap-rank",
            address,
            &rank.to_string(),
            model,
            mode.name(),
            &steps.to_string(),
            &warmup.to_string(),
        ]
        .map(String::from)
        .to_vec()
    })
    .map_err(|e| format!("ring ({model}, {}): {e}", mode.name()))?;
    parse(&output).ok_or_else(|| format!("no {MARK} line from ring rank 0"))
}

/// 2 MPI ranks of this binary under `mpirun` (feature `mpi`); `None` without it.
#[cfg(feature = "mpi")]
fn over_mpi(
    model: &str,
    mode: Mode,
    steps: usize,
    warmup: usize,
) -> Result<Option<(Duration, Duration)>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let (steps, warmup) = (steps.to_string(), warmup.to_string());
    let args = ["mpi-ddp-overlap-rank", model, mode.name(), &steps, &warmup];
    let run = afterburner::parallel::run_on_loopback(2, &exe, &args, &[], Duration::from_secs(600))
        .map_err(|e| format!("cannot start mpirun (install openmpi-bin): {e}"))?;
    if !run.success {
        return Err(format!("the MPI overlap job failed:\n{}", run.output));
    }
    parse(&run.output)
        .map(Some)
        .ok_or_else(|| format!("no {MARK} line in the job's output:\n{}", run.output))
}

#[cfg(not(feature = "mpi"))]
fn over_mpi(_: &str, _: Mode, _: usize, _: usize) -> Result<Option<(Duration, Duration)>, String> {
    Ok(None)
}

/// The suite's rows (scenario, value, unit): per engine and model, ms per step in each mode,
/// the all-reduce alone, and the ratios to max(compute, communication).
pub fn rows(steps: usize, warmup: usize) -> Result<Vec<(String, f64, &'static str)>, String> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut rows = Vec::new();
    // The ring as is (loopback: the link costs CPU only), over a link paced to 400 MB/s (each
    // rank's 8 MiB a step then take about as long as the backward pass), and Open MPI.
    for engine in [
        "ring",
        "ring over an emulated link paced to 400 MB/s",
        "MPI",
    ] {
        for (model, about) in [
            ("wrapped", "8 Checkpointed 512x512 blocks"),
            ("plain", "8 plain Burn Linear 512x512 layers"),
        ] {
            let mut step = Vec::new();
            let mut communication = Duration::ZERO;
            for mode in Mode::ALL {
                let measured = match engine {
                    "ring" => Some(over_ring(model, mode, steps, warmup, None)?),
                    "MPI" => over_mpi(model, mode, steps, warmup)?,
                    _ => Some(over_ring(model, mode, steps, warmup, Some(PACED_MBPS))?),
                };
                let Some((time, all_reduce)) = measured else {
                    break;
                };
                step.push(time);
                communication = communication.max(all_reduce);
            }
            let [alone, after, during] = step[..] else {
                continue;
            };
            let what = format!(
                "DDP overlap between 2 processes on loopback, {engine} ({about}, bucket_cap_mb 1)"
            );
            let longer = ms(alone).max(ms(communication));
            rows.extend([
                (
                    format!("{what}: step, compute alone (no reduction)"),
                    ms(alone),
                    "ms",
                ),
                (
                    format!("{what}: one all-reduce of the step's gradients alone"),
                    ms(communication),
                    "ms",
                ),
                (
                    format!("{what}: step, buckets reduced after backward"),
                    ms(after),
                    "ms",
                ),
                (
                    format!("{what}: step, buckets reduced during backward"),
                    ms(during),
                    "ms",
                ),
                (
                    format!("{what}: during / max(compute, communication)"),
                    ms(during) / longer,
                    "x",
                ),
                (
                    format!("{what}: after / max(compute, communication)"),
                    ms(after) / longer,
                    "x",
                ),
            ]);
        }
    }
    Ok(rows)
}

/// `xtask ddp-overlap [STEPS]`: this scenario alone (the `ddp` suite runs it too), printed as a
/// table.
pub fn print(args: &[String]) -> Result<(), String> {
    let steps = match args.first() {
        Some(steps) => steps
            .parse::<usize>()
            .map_err(|_| "usage: xtask ddp-overlap [STEPS]".to_string())?,
        None => 10,
    };
    println!("| scenario | value | unit |\n|---|---|---|");
    for (scenario, value, unit) in rows(steps, 3)? {
        println!("| {scenario} | {value:.3} | {unit} |");
    }
    Ok(())
}
