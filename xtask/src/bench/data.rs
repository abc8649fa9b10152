//! The data suite: time per epoch of reading + batching, alone and with a simulated training
//! step, with the loader's background thread (`prefetch(2)`) and without it (`prefetch(0)`),
//! side by side in one run. Writes `bench-results/data-<backend>.{json,md}`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use afterburner::data::DataLoaderShard;
use afterburner_demos::{ImageBatch, ImageBatcher, ImageDataset, ImageItem, digits};
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Tensor, activation};
use serde::Serialize;

use super::Options;

/// Side of the decoded images.
const SIDE: usize = 32;
/// Width of the simulated step's hidden layer.
const HIDDEN: usize = 1024;

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    /// The loader's prefetch depth (`None`: no loader, batches made beforehand).
    prefetch: Option<usize>,
    ms_per_epoch: f64,
    /// Epoch time of the same work with `prefetch(0)`, over this one.
    speed_vs_prefetch_0: Option<f64>,
}

/// One timed scenario: reading + batching through the loader at a prefetch depth, with or
/// without the step, or (`prefetch: None`) the step alone on batches made beforehand.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    prefetch: Option<usize>,
    step: bool,
}

const SCENARIOS: [Scenario; 5] = [
    Scenario {
        name: "read + batch",
        prefetch: Some(0),
        step: false,
    },
    Scenario {
        name: "read + batch",
        prefetch: Some(2),
        step: false,
    },
    Scenario {
        name: "simulated step alone (batches made beforehand)",
        prefetch: None,
        step: true,
    },
    Scenario {
        name: "read + batch + simulated step",
        prefetch: Some(0),
        step: true,
    },
    Scenario {
        name: "read + batch + simulated step",
        prefetch: Some(2),
        step: true,
    },
];

/// The digits "decoded" on every read into 3x32x32 images (upsampled and blurred): a Burn
/// dataset whose reads cost CPU time, as decoding and augmenting image files do.
struct Decoded(ImageDataset);

impl Dataset<ImageItem> for Decoded {
    fn get(&self, index: usize) -> Option<ImageItem> {
        self.0.get(index).map(decode)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Nearest-neighbour upsampling of an 8x8 digit to 3 channels of 32x32, then a 5x5 box blur.
fn decode(item: ImageItem) -> ImageItem {
    let scale = SIDE / digits::SIDE;
    let up = |c: usize, y: usize, x: usize| -> f32 {
        let p = item.pixels[(y / scale) * digits::SIDE + x / scale];
        p * (1.0 - 0.2 * c as f32)
    };
    let mut pixels = Vec::with_capacity(3 * SIDE * SIDE);
    for c in 0..3 {
        for y in 0..SIDE {
            for x in 0..SIDE {
                let (mut sum, mut n) = (0.0, 0.0);
                for yy in y.saturating_sub(2)..(y + 3).min(SIDE) {
                    for xx in x.saturating_sub(2)..(x + 3).min(SIDE) {
                        sum += up(c, yy, xx);
                        n += 1.0;
                    }
                }
                pixels.push(sum / n);
            }
        }
    }
    ImageItem {
        pixels,
        label: item.label,
    }
}

/// A fixed amount of tensor work per batch (a two-layer forward pass), read back to the host.
fn step<B: Backend>(batch: ImageBatch<B>, weights: &(Tensor<B, 2>, Tensor<B, 2>)) -> f64 {
    let [n, ..] = batch.images.dims();
    let x = batch.images.reshape([n, 3 * SIDE * SIDE]);
    let h = activation::relu(x.matmul(weights.0.clone()));
    h.matmul(weights.1.clone()).sum().into_scalar().elem()
}

/// Mean time per epoch of `run(epoch)` over the timed epochs, after the warm-up ones.
fn time_epochs(o: &Options, mut run: impl FnMut(usize)) -> Duration {
    (0..o.warmup).for_each(&mut run);
    let start = Instant::now();
    (o.warmup..o.warmup + o.steps).for_each(&mut run);
    start.elapsed() / o.steps as u32
}

/// Runs the suite on `B`.
pub fn bench<B: Backend>(o: &Options) -> Result<(), String> {
    let device = B::Device::default();
    B::seed(&device, 0);
    let data = Arc::new(Decoded(digits::load().map_err(|e| e.to_string())?));
    let items = data.len();
    let batcher = ImageBatcher {
        channels: 3,
        height: SIDE,
        width: SIDE,
    };
    let loader = |depth: usize| {
        DataLoaderShard::<B, _, _>::new(data.clone(), batcher, o.batch_size, device.clone())
            .map(|loader| loader.shuffle(0).prefetch(depth))
            .map_err(|e| e.to_string())
    };
    let normal = Distribution::Normal(0.0, 0.02);
    let weights = (
        Tensor::<B, 2>::random([3 * SIDE * SIDE, HIDDEN], normal, &device),
        Tensor::<B, 2>::random([HIDDEN, HIDDEN], normal, &device),
    );
    let made: Vec<ImageBatch<B>> = loader(0)?.epoch(0).collect();
    let mut best = [Duration::MAX; SCENARIOS.len()];
    let mut progress = super::progress::Progress::new("data", o.rounds * SCENARIOS.len());
    for round in 0..o.rounds {
        // The order alternates between rounds so drift does not favour one scenario.
        for k in 0..SCENARIOS.len() {
            let i = if round % 2 == 0 {
                k
            } else {
                SCENARIOS.len() - 1 - k
            };
            let s = SCENARIOS[i];
            progress.next(format!("round {}/{}: {}", round + 1, o.rounds, s.name));
            let mut sink = 0.0;
            let t = match s.prefetch {
                Some(depth) => {
                    let loader = loader(depth)?;
                    time_epochs(o, |epoch| {
                        for batch in loader.epoch(epoch) {
                            if s.step {
                                sink += step(batch, &weights);
                            }
                        }
                    })
                }
                None => time_epochs(o, |_| {
                    for batch in &made {
                        sink += step(batch.clone(), &weights);
                    }
                }),
            };
            std::hint::black_box(sink);
            best[i] = best[i].min(t);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let inline = |s: Scenario| {
        SCENARIOS
            .iter()
            .position(|r| r.name == s.name && r.prefetch == Some(0))
            .map(|i| best[i])
    };
    let rows: Vec<Row> = SCENARIOS
        .iter()
        .zip(best)
        .map(|(&s, t)| Row {
            scenario: s.name.into(),
            prefetch: s.prefetch,
            ms_per_epoch: ms(t),
            speed_vs_prefetch_0: inline(s).map(|base| ms(base) / ms(t)),
        })
        .collect();
    write_results(o, items, &rows)
}

fn write_results(o: &Options, items: usize, rows: &[Row]) -> Result<(), String> {
    let mut md = format!(
        "{items} digits decoded to 3x{SIDE}x{SIDE} on every read (upsample + 5x5 blur), \
         batch {}, backend `{}`; simulated step: [batch, {}] x [{}, {HIDDEN}] x [{HIDDEN}, \
         {HIDDEN}] forward, read back. Time per epoch, {} timed epochs after {} warm-up, best \
         of {} rounds.\n\n\
         | scenario | prefetch | ms/epoch | speed vs prefetch 0 |\n|---|---|---|---|\n",
        o.batch_size,
        o.backend,
        3 * SIDE * SIDE,
        3 * SIDE * SIDE,
        o.steps,
        o.warmup,
        o.rounds
    );
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {} |",
            r.scenario,
            or_dash(r.prefetch.map(|d| d.to_string())),
            r.ms_per_epoch,
            or_dash(r.speed_vs_prefetch_0.map(|x| format!("{x:.2}x"))),
        );
    }
    super::write_report(o, "data", rows, &md)
}
