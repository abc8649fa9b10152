//! The presets of the talk's seeds: ViT-B/16 (224 px, CIFAR-10's 10 classes, batch 16 and 64)
//! and GPT-2 small (124M parameters, sequence 1024), each under 32-true, bf16-mixed and
//! 16-mixed, with and without activation checkpointing, on one device and, where the backend
//! shows several, DDP and FSDP over all of them. Synthetic data (speed, not accuracy):
//! images/s or tokens/s, TFLOP/s and MFU (the model's FLOPs counted once on
//! `Autodiff<Autocast<I>>`), device memory, and the bf16-mixed speed-up over 32-true.
//!
//! `--quick` keeps the architectures (widths, depths, vocabulary) but runs 1 warm-up and 1
//! timed step on small inputs (batch 2 at 64 px; batch 1 of 32 tokens), one device: the form
//! CI runs on flex so the presets keep compiling and running (about 3 minutes on 2 cores).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use afterburner::throughput::peak_flops;
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, Autocast, CheckpointPolicy, FsdpConfig,
    Precision, StrategyConfig, count_flops,
};
use afterburner_demos::models::{TransformerConfig, VitConfig};
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::backend::{Backend, DeviceOps};
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};
use serde::Serialize;

use super::Options;
use xtask::memory::{DeviceMemory, device_memory};

/// The presets, by name.
pub const PRESET_NAMES: [&str; 2] = ["vit-b16", "gpt2-small"];

const PRECISIONS: [Precision; 3] = [Precision::Full32, Precision::Bf16Mixed, Precision::F16Mixed];

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub preset: String,
    pub strategy: String,
    pub devices: usize,
    /// Items per device per step (images, or sequences).
    pub batch: usize,
    pub precision: String,
    pub checkpointing: bool,
    /// Images/s or tokens/s over all devices; `None` when the precision is unsupported.
    pub throughput: Option<f64>,
    pub unit: String,
    /// Throughput over the same configuration at 32-true.
    pub speedup_vs_32_true: Option<f64>,
    pub step_ms: Option<f64>,
    /// Achieved TFLOP/s per device: the model's FLOPs per step (counted once on
    /// `Autodiff<Autocast<I>>`, forward and backward, no checkpointing) over the step time.
    pub tflops: Option<f64>,
    /// `tflops` over the device's peak in the precision's compute dtype.
    pub mfu: Option<f64>,
    /// Rank 0's device memory after the timed steps (`None` where Burn does not expose it).
    pub device_memory: Option<DeviceMemory>,
    pub final_loss: Option<f64>,
    /// Why the configuration did not run (a precision the device lacks).
    pub skipped: Option<String>,
    /// The error that stopped it, if one did.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Preset {
    /// ViT-B/16.
    VitB16,
    /// GPT-2 small.
    Gpt2Small,
}

impl Preset {
    fn parse(name: &str) -> Result<Vec<Preset>, String> {
        match name {
            "vit-b16" => Ok(vec![Preset::VitB16]),
            "gpt2-small" => Ok(vec![Preset::Gpt2Small]),
            "all" => Ok(vec![Preset::VitB16, Preset::Gpt2Small]),
            other => Err(format!(
                "unknown preset '{other}'; valid: vit-b16, gpt2-small, all"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Preset::VitB16 => "vit-b16",
            Preset::Gpt2Small => "gpt2-small",
        }
    }

    /// Per-device batch sizes, and the sequence length (tokens) or image side (pixels).
    pub(super) fn shapes(self, quick: bool) -> (Vec<usize>, usize) {
        match (self, quick) {
            (Preset::VitB16, false) => (vec![16, 64], 224),
            (Preset::VitB16, true) => (vec![2], 64),
            (Preset::Gpt2Small, false) => (vec![8], 1024),
            (Preset::Gpt2Small, true) => (vec![1], 32),
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Preset::VitB16 => "img/s",
            Preset::Gpt2Small => "tokens/s",
        }
    }
}

/// Every device of `I`'s kind (Burn's `device_count`), the default one first.
pub(super) fn all_devices<I: Backend>() -> Result<Vec<I::Device>, String> {
    let count = I::device_count(I::Device::default().id().type_id).max(1);
    afterburner::parallel::local_devices::<I>(count).map_err(|e| e.to_string())
}

/// Runs the presets `o.preset` names and writes `presets-<backend>.{json,md}`.
pub fn bench<I: Backend>(o: &Options) -> Result<(), String> {
    let rows = rows::<I>(o)?;
    super::write_report(o, "presets", &rows, &markdown(o, &rows))
}

/// The presets' rows (gpu-check reads them too).
pub fn rows<I: Backend>(o: &Options) -> Result<Vec<Row>, String> {
    let presets = Preset::parse(o.preset.as_deref().unwrap_or("all"))?;
    let devices = all_devices::<I>()?;
    let mut layouts = vec![("ddp", 1)];
    if devices.len() > 1 && !o.quick {
        layouts.push(("ddp", devices.len()));
        layouts.push(("fsdp", devices.len()));
    }
    let mut rows = Vec::new();
    let per_batch = layouts.len() * 2 * PRECISIONS.len();
    let total = presets
        .iter()
        .map(|p| p.shapes(o.quick).0.len())
        .sum::<usize>()
        * per_batch;
    let mut progress = super::progress::Progress::new("presets", total);
    for preset in presets {
        let (batches, size) = preset.shapes(o.quick);
        for &batch in &batches {
            let flops = model_flops::<I>(preset, batch, size, &devices[0]);
            for &(strategy, world) in &layouts {
                for checkpointing in [false, true] {
                    let mut base = None;
                    for precision in PRECISIONS {
                        progress.next(format!(
                            "{} batch {batch} {precision} checkpointing {checkpointing} \
                             on {world} device(s) ({strategy})",
                            preset.name()
                        ));
                        let setting = Setting {
                            preset,
                            flops,
                            batch,
                            size,
                            precision,
                            checkpointing,
                            strategy,
                        };
                        let row = measure::<I>(o, &setting, &devices[..world]);
                        rows.push(versus_32_true(row, precision, &mut base));
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// `row` with its speed-up over the 32-true row of its series, which sets `base`.
pub(super) fn versus_32_true(mut row: Row, precision: Precision, base: &mut Option<f64>) -> Row {
    if precision == Precision::Full32 {
        *base = row.throughput;
    }
    row.speedup_vs_32_true = row.throughput.zip(*base).map(|(t, b)| t / b);
    row
}

pub(super) struct Setting {
    pub(super) preset: Preset,
    /// The model's FLOPs per training step on one device (`None`: not counted).
    pub(super) flops: Option<u64>,
    pub(super) batch: usize,
    pub(super) size: usize,
    pub(super) precision: Precision,
    pub(super) checkpointing: bool,
    pub(super) strategy: &'static str,
}

pub(super) fn measure<I: Backend>(o: &Options, s: &Setting, devices: &[I::Device]) -> Row {
    let mut row = Row {
        preset: s.preset.name().into(),
        strategy: if devices.len() == 1 {
            "one device".into()
        } else {
            s.strategy.to_string()
        },
        devices: devices.len(),
        batch: s.batch,
        precision: s.precision.to_string(),
        checkpointing: s.checkpointing,
        throughput: None,
        unit: s.preset.unit().into(),
        speedup_vs_32_true: None,
        step_ms: None,
        tflops: None,
        mfu: None,
        device_memory: None,
        final_loss: None,
        skipped: None,
        error: None,
    };
    if let Err(e) = s.precision.check_backend::<I>(&devices[0]) {
        row.skipped = Some(e.to_string());
        return row;
    }
    let result = match s.preset {
        Preset::VitB16 => train_vit::<I>(o, s, devices),
        Preset::Gpt2Small => train_gpt::<I>(o, s, devices),
    };
    match result {
        Ok((step, loss, memory)) => {
            let items = (s.batch * devices.len()) as f64
                * match s.preset {
                    Preset::VitB16 => 1.0,
                    Preset::Gpt2Small => s.size as f64,
                };
            row.throughput = Some(items / step.as_secs_f64());
            row.step_ms = Some(step.as_secs_f64() * 1e3);
            row.tflops = s.flops.map(|f| f as f64 / step.as_secs_f64() / 1e12);
            let peak = peak_flops::<I>(&devices[0], s.precision.compute_dtype());
            row.mfu = row
                .tflops
                .zip(peak)
                .map(|(t, p)| t * 1e12 / p.flops_per_second);
            row.final_loss = Some(loss);
            row.device_memory = memory;
        }
        Err(e) => row.error = Some(e),
    }
    row
}

fn config(s: &Setting) -> AcceleratorConfig {
    AcceleratorConfig {
        precision: s.precision,
        gradient_checkpointing: if s.checkpointing {
            CheckpointPolicy::All
        } else {
            CheckpointPolicy::None
        },
        seed: 0,
        parallelism: afterburner::ParallelismConfig {
            strategy: match s.strategy.parse().expect("a built-in strategy") {
                StrategyConfig::Fsdp(_) => StrategyConfig::Fsdp(FsdpConfig {
                    auto_wrap_policy: "TransformerEncoderLayer,TransformerBlock"
                        .parse()
                        .expect("a valid policy"),
                    ..Default::default()
                }),
                other => other,
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// (time per step, final loss, rank 0's device memory).
type Measured = (Duration, f64, Option<DeviceMemory>);

/// Times `o.steps` steps after `o.warmup` (1 and 1 under `--quick`) on every rank; the
/// slowest rank's time per step.
fn timed<I, M>(
    o: &Options,
    s: &Setting,
    devices: &[I::Device],
    model: M,
    loss: impl Fn(&Accelerator<Autodiff<I>>, &M) -> Result<Tensor<Autodiff<I>, 1>, AccelerateError>
    + Send
    + Sync
    + 'static,
) -> Result<Measured, String>
where
    I: Backend,
    M: AutodiffModule<Autodiff<I>> + Sync + 'static,
{
    let (warmup, steps) = if o.quick { (1, 1) } else { (o.warmup, o.steps) };
    let run = move |mut acc: Accelerator<Autodiff<I>>| -> Result<Measured, AccelerateError> {
        let (mut model, mut optim) = acc.setup(model.clone(), AdamWConfig::new().init())?;
        let mut start = Instant::now();
        let mut last = None;
        for i in 0..warmup + steps {
            if i == warmup {
                I::sync(acc.device()).ok();
                acc.barrier()?;
                start = Instant::now();
            }
            let value = loss(&acc, &model)?;
            last = Some(value.clone());
            acc.backward(value, &model)?;
            model = acc.step(model, &mut optim, &mut 1e-4)?;
        }
        I::sync(acc.device()).ok();
        let elapsed = start.elapsed() / steps as u32;
        // The last loss is read after the clock stops (a read inside would drain the queue).
        let last = last.map_or(f64::NAN, |l| l.into_scalar().elem::<f64>());
        Ok((elapsed, last, device_memory::<I>(acc.device())))
    };
    let results = Accelerator::<Autodiff<I>>::launch(config(s), devices.to_vec(), run)
        .map_err(|e| e.to_string())?;
    let slowest = results.iter().map(|r| r.0).max().unwrap_or_default();
    let first = results.first().ok_or("no rank returned")?;
    Ok((slowest, first.1, first.2))
}

/// The FLOPs of one training step of `preset` at `batch` on one device: one forward and
/// backward counted on `Autodiff<Autocast<I>>` (f32, no checkpointing: the model's FLOPs,
/// whatever the measured setting's precision and checkpointing).
pub(super) fn model_flops<I: Backend>(
    preset: Preset,
    batch: usize,
    size: usize,
    device: &I::Device,
) -> Option<u64> {
    type C<I> = Autodiff<Autocast<I>>;
    let loss = CrossEntropyLossConfig::new().init::<C<I>>(device);
    let (_, flops) = match preset {
        Preset::VitB16 => {
            let model = vit_b16(size).init::<C<I>>(device);
            let images = Tensor::random([batch, 3, size, size], Distribution::Default, device);
            let labels = Tensor::<C<I>, 1, Int>::zeros([batch], device);
            count_flops(|| loss.forward(model.forward(images), labels).backward())
        }
        Preset::Gpt2Small => {
            let model = gpt2_small(size).init::<C<I>>(device);
            let tokens = Tensor::<C<I>, 2, Int>::zeros([batch, size], device);
            let targets = Tensor::<C<I>, 1, Int>::zeros([batch * size], device);
            count_flops(|| {
                let logits = model.forward(tokens).reshape([batch * size, GPT2_VOCAB]);
                loss.forward(logits, targets).backward()
            })
        }
    };
    (flops > 0).then_some(flops)
}

/// ViT-B/16 on `size`-pixel RGB images, 10 classes.
fn vit_b16(size: usize) -> VitConfig {
    VitConfig::new()
        .with_channels(3)
        .with_image_size(size)
        .with_patch_size(16)
        .with_d_model(768)
        .with_n_heads(12)
        .with_n_layers(12)
        .with_d_ff(3072)
        .with_num_classes(10)
}

/// GPT-2 small's vocabulary.
const GPT2_VOCAB: usize = 50257;

/// GPT-2 small's shape (the demo's untied head: 163M parameters) on sequences of `seq` tokens.
fn gpt2_small(seq: usize) -> TransformerConfig {
    TransformerConfig::gpt2().with_max_seq_len(seq)
}

fn train_vit<I: Backend>(
    o: &Options,
    s: &Setting,
    devices: &[I::Device],
) -> Result<Measured, String> {
    let device = &devices[0];
    I::seed(device, 0);
    let model = vit_b16(s.size).init::<Autodiff<I>>(device);
    afterburner::precision::materialize_params(&model);
    let (batch, size) = (s.batch, s.size);
    timed::<I, _>(o, s, devices, model, move |acc, model| {
        let device = acc.device();
        let images = Tensor::random([batch, 3, size, size], Distribution::Default, device);
        let labels = Tensor::<_, 1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), device);
        let logits = acc.forward(model, images, |m, x| m.forward(x))?;
        Ok(CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, labels))
    })
}

fn train_gpt<I: Backend>(
    o: &Options,
    s: &Setting,
    devices: &[I::Device],
) -> Result<Measured, String> {
    let device = &devices[0];
    I::seed(device, 0);
    let model = gpt2_small(s.size).init::<Autodiff<I>>(device);
    afterburner::precision::materialize_params(&model);
    let (batch, seq) = (s.batch, s.size);
    timed::<I, _>(o, s, devices, model, move |acc, model| {
        let device = acc.device();
        let range = Distribution::Uniform(0.0, GPT2_VOCAB as f64);
        let tokens = Tensor::<_, 2, Int>::random([batch, seq], range, device);
        let targets = Tensor::<_, 2, Int>::random([batch, seq], range, device);
        let logits = acc.forward(model, tokens, |m, x| m.forward(x))?;
        let logits = logits.reshape([batch * seq, GPT2_VOCAB]);
        Ok(CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, targets.reshape([batch * seq])))
    })
}

fn markdown(o: &Options, rows: &[Row]) -> String {
    let (steps, warmup) = if o.quick { (1, 1) } else { (o.steps, o.warmup) };
    format!(
        "## Presets on {}{}\n\nSynthetic data; AdamW; {steps} timed steps after {warmup} warm-up.\n\n{}",
        o.backend,
        if o.quick {
            " (quick: not a benchmark)"
        } else {
            ""
        },
        table(rows)
    )
}

/// The rows as a markdown table: throughput over all devices; device memory of rank 0 after
/// the steps (in use / reserved by Burn's pools).
pub fn table(rows: &[Row]) -> String {
    let mut md = String::from(
        "| preset | layout | batch/device | precision | checkpointing | throughput | vs 32-true | \
         step (ms) | TFLOP/s per device | MFU | device memory (in use / reserved) | final loss \
         |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let layout = if r.devices == 1 {
            r.strategy.clone()
        } else {
            format!("{} x{}", r.strategy, r.devices)
        };
        let throughput = match (r.throughput, &r.skipped, &r.error) {
            (Some(t), _, _) => format!("{t:.1} {}", r.unit),
            (None, _, Some(e)) => format!("ERROR: {e}"),
            (None, Some(why), None) => format!("skipped: {why}"),
            (None, None, None) => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {layout} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.preset,
            r.batch,
            r.precision,
            if r.checkpointing { "all" } else { "off" },
            throughput.replace('|', "/").replace('\n', " "),
            r.speedup_vs_32_true
                .map_or("-".into(), |x| format!("{x:.2}x")),
            r.step_ms.map_or("-".into(), |x| format!("{x:.0}")),
            r.tflops.map_or("-".into(), |x| match x < 1.0 {
                true => format!("{x:.4}"),
                false => format!("{x:.1}"),
            }),
            r.mfu.map_or("-".into(), |x| format!("{:.1}%", x * 100.0)),
            r.device_memory
                .as_ref()
                .map_or("-".into(), DeviceMemory::describe),
            r.final_loss.map_or("-".into(), |x| format!("{x:.3}")),
        );
    }
    md
}
