//! DDP's overlap of communication with backward: 2 in-process workers behind a slow link set
//! so that one step's gradient all-reduce takes about as long as the backward pass; the step
//! time with the buckets reduced during backward, after backward, and with a free link
//! (compute alone).

use std::time::{Duration, Instant};

use afterburner::checkpoint::Checkpointed;
use afterburner::parallel::{Ddp, LaunchConfig, SharedGroup, SlowLink, launch};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

type B = Autodiff<Flex>;

/// Blocks, width and rows per worker of the model timed.
const BLOCKS: usize = 8;
const WIDTH: usize = 512;
const ROWS: usize = 128;
/// One bucket per block (each block's weights are 1 MiB).
const BUCKET_CAP_MB: f64 = 1.0;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    blocks: Vec<Checkpointed<B, Linear<B>>>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let blocks = (0..BLOCKS)
            .map(|_| {
                Checkpointed::new(
                    LinearConfig::new(WIDTH, WIDTH)
                        .with_bias(false)
                        .init(device),
                )
            })
            .collect();
        Self { blocks }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for block in &self.blocks {
            x = block.forward(x, |linear: &Linear<B>, x| linear.forward(x).tanh());
        }
        x
    }
}

/// What the overlap scenario measured (ms per step, median over the timed steps of rank 0).
pub struct Overlap {
    /// Backward pass alone (free link).
    pub backward_ms: f64,
    /// The gradient all-reduce over the slow link.
    pub communication_ms: f64,
    /// A whole step with a free link.
    pub compute_ms: f64,
    /// A step over the slow link, buckets reduced after backward.
    pub after_ms: f64,
    /// A step over the slow link, buckets reduced during backward.
    pub during_ms: f64,
}

/// Runs the scenario: `steps` timed steps after `warmup`.
pub fn measure(steps: usize, warmup: usize) -> Result<Overlap, String> {
    let free = run(None, false, steps, warmup)?;
    let bytes = (4 * BLOCKS * WIDTH * WIDTH) as f64;
    // The link that makes the all-reduce take as long as the backward pass.
    let bandwidth = bytes / free.backward.as_secs_f64();
    let after = run(Some(bandwidth), false, steps, warmup)?;
    let during = run(Some(bandwidth), true, steps, warmup)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(Overlap {
        backward_ms: ms(free.backward),
        communication_ms: bytes / bandwidth * 1e3,
        compute_ms: ms(free.step),
        after_ms: ms(after.step),
        during_ms: ms(during.step),
    })
}

struct Timed {
    step: Duration,
    backward: Duration,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn run(
    bandwidth: Option<f64>,
    overlap: bool,
    steps: usize,
    warmup: usize,
) -> Result<Timed, String> {
    let initial = Net::<B>::new(&Default::default());
    // Burn initialises parameters at their first read: read them here, once, not on a worker.
    struct Touch;
    impl burn::module::ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    initial.visit(&mut Touch);
    let timed = launch::<Flex, _, String, _>(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        move |group| {
            let device = Default::default();
            let link = SlowLink::new(group, Duration::ZERO, bandwidth.unwrap_or(f64::MAX));
            let mut ddp = Ddp::<B, _>::new(SharedGroup::new(link))
                .with_bucket_cap_mb(BUCKET_CAP_MB)
                .map_err(|e| e.to_string())?;
            if overlap {
                ddp = ddp.with_overlap().map_err(|e| e.to_string())?;
            }
            let mut model = ddp.setup(initial.clone()).map_err(|e| e.to_string())?;
            let mut optim = SgdConfig::new().init();
            let (mut step_times, mut backward_times) = (Vec::new(), Vec::new());
            for step in 0..warmup + steps {
                let x = Tensor::<B, 2>::random([ROWS, WIDTH], Distribution::Default, &device);
                let start = Instant::now();
                let loss = match ddp.view(&model, None) {
                    Some(view) => view.forward(x).powi_scalar(2).mean(),
                    None => model.forward(x).powi_scalar(2).mean(),
                };
                let backward_start = Instant::now();
                let grads = loss.backward();
                let backward = backward_start.elapsed();
                let mut grads = GradientsParams::from_grads(grads, &model);
                ddp.sync_gradients(&model, &mut grads)
                    .map_err(|e| e.to_string())?;
                model = optim.step(0.01, model, grads);
                Flex::sync(&device).ok();
                if step >= warmup {
                    step_times.push(start.elapsed());
                    backward_times.push(backward);
                }
            }
            if overlap && ddp.overlapped_syncs() == 0 {
                return Err("no step was reduced during backward".into());
            }
            Ok(Timed {
                step: median(step_times),
                backward: median(backward_times),
            })
        },
    )
    .map_err(|e| e.to_string())?;
    timed.into_iter().next().ok_or_else(|| "no rank".into())
}

/// The suite's rows (scenario, value, unit).
pub fn rows(steps: usize, warmup: usize) -> Result<Vec<(String, f64, &'static str)>, String> {
    let m = measure(steps, warmup)?;
    let what = "DDP overlap (8 checkpointed 512x512 blocks, 2 in-process workers, bucket_cap_mb 1, \
                simulated slow link: a sleep before each collective)";
    let longer = m.compute_ms.max(m.communication_ms);
    Ok(vec![
        (format!("{what}: backward alone"), m.backward_ms, "ms"),
        (
            format!("{what}: the gradient all-reduce over the link"),
            m.communication_ms,
            "ms",
        ),
        (
            format!("{what}: step, compute alone (free link)"),
            m.compute_ms,
            "ms",
        ),
        (
            format!("{what}: step, buckets reduced after backward"),
            m.after_ms,
            "ms",
        ),
        (
            format!("{what}: step, buckets reduced during backward"),
            m.during_ms,
            "ms",
        ),
        (
            format!("{what}: during / max(compute, communication)"),
            m.during_ms / longer,
            "x",
        ),
        (
            format!("{what}: after / max(compute, communication)"),
            m.after_ms / longer,
            "x",
        ),
    ])
}
