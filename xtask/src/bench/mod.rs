//! `cargo xtask bench`: measured side by side in one run, per suite.
//!
//! - `precision`: the small ViT under each precision next to the plain Burn loop.
//! - `checkpoint`: activation checkpointing off / all / every-2 / selective / Burn's balanced,
//!   on the 12-block transformer and on the ViT: step time and peak memory.
//! - `ddp`: 1 vs 2 in-process workers, the gradient all-reduce's size and time, and what the
//!   engine receives per FSDP step, in-process and over MPI (`traffic`).
//! - `data`: time per epoch of reading + batching (with a simulated step) with the loader's
//!   background thread and without it.
//! - `linear`: models built from Burn's own layers on `Autodiff<I>` and on
//!   `Autodiff<Autocast<I>>` (every Linear on a 2-D view): step time, memory, loss.
//! - `autocast`: op-level autocast next to the half view: errors against f32 (and PyTorch's
//!   autocast's on the same weights, when PyTorch imports), step time and memory.
//! - `localsgd`: DDP vs Local SGD vs DiLoCo behind a slow link (wall time, bytes, accuracy).
//! - `faults`: fault-tolerant DiLoCo on 4 workers, without a fault and with one worker failing
//!   and restarting (wall time, bytes, rounds with every worker, accuracy).
//! - `launch` (`--suite launch`): `afterburner launch` running the ViT example under DiLoCo on
//!   3 replica processes, without faults and with a random replica SIGKILLed every second
//!   (useful steps per second side by side).
//! - `tp` (`--suite tp`): tensor parallelism next to FSDP on the demo transformer (values sent
//!   per step, parameters per rank, time per step).
//! - `torch` (`--torch`): the checkpoint suite's models next to their PyTorch twins (step time,
//!   peak heap, ratios), when PyTorch is installed.
//! - `presets` (`--preset vit-b16|gpt2-small|all`): the talk's models under each precision,
//!   with and without checkpointing, over all devices: throughput and device memory.

mod autocast;
mod autocast_error;
pub mod bandwidth;
mod burn_lm;
mod checkpoint;
mod data;
mod ddp;
#[cfg(feature = "flex")]
pub mod engines;
mod faults;
mod flop_overhead;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod fusion;
mod launch;
mod linear;
mod localsgd;
#[cfg(all(feature = "mpi", feature = "flex"))]
pub mod mpi;
#[cfg(feature = "flex")]
pub mod overlap;
#[cfg(feature = "flex")]
pub mod overlap_processes;
pub mod perf;
mod plot;
mod precision;
pub mod presets;
mod progress;
pub(crate) mod torch;
mod tp;
#[cfg(feature = "flex")]
pub mod traffic;

pub use presets::PRESET_NAMES;

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;

use crate::alloc;

/// Settings of one suite's run.
#[derive(Clone)]
pub struct Options {
    pub backend: String,
    pub steps: usize,
    pub warmup: usize,
    pub batch_size: usize,
    pub rounds: usize,
    pub out: String,
    /// Models of the checkpoint suite: "transformer", "vit" or "all".
    pub models: String,
    /// Presets of the presets suite: "vit-b16", "gpt2-small" or "all".
    pub preset: Option<String>,
    /// Tiny step counts and inputs (the presets suite).
    pub quick: bool,
}

/// What the command line set; the rest comes from each suite's defaults.
#[derive(Default)]
struct Given {
    suite: Option<String>,
    backend: Option<String>,
    steps: Option<usize>,
    warmup: Option<usize>,
    batch_size: Option<usize>,
    rounds: Option<usize>,
    out: Option<String>,
    models: Option<String>,
    preset: Option<String>,
    quick: bool,
}

/// A suite's defaults: (steps, warmup, batch size, rounds).
type Defaults = (usize, usize, usize, usize);
const PRECISION_DEFAULTS: Defaults = (60, 5, 64, 3);
const CHECKPOINT_DEFAULTS: Defaults = (4, 2, 32, 2);
const DDP_DEFAULTS: Defaults = (10, 3, 32, 2);
/// Data suite: (epochs, warm-up epochs, batch size, rounds).
const DATA_DEFAULTS: Defaults = (3, 1, 64, 3);
/// Local SGD suite: (optimizer steps, unused, batch size per worker, unused).
const LOCALSGD_DEFAULTS: Defaults = (200, 0, 32, 1);
/// Faults suite: (optimizer steps, unused, batch size per worker, runs of each scenario).
const FAULTS_DEFAULTS: Defaults = (200, 0, 32, 3);
/// Side by side with PyTorch: (steps, warmup, batch size, rounds), as the checkpoint suite.
const TORCH_DEFAULTS: Defaults = (4, 2, 32, 2);
/// Linear suite: (steps, warmup, batch size, rounds), as the checkpoint suite.
const LINEAR_DEFAULTS: Defaults = (4, 2, 32, 2);
/// Autocast suite: (steps, warmup, batch size, rounds), as the checkpoint suite.
const AUTOCAST_DEFAULTS: Defaults = (4, 2, 32, 2);
/// Fusion suite: (steps, warmup, batch size, rounds); small, for a software Vulkan driver,
/// with 3 warm-up steps (fused kernels compile during the first ones: 1 was not enough).
const FUSION_DEFAULTS: Defaults = (6, 3, 4, 1);
/// Tensor-parallel suite: (optimizer steps, unused, unused, unused).
const TP_DEFAULTS: Defaults = (5, 0, 0, 1);
/// Launch suite: (optimizer steps, unused, batch size per replica, runs of each scenario).
const LAUNCH_DEFAULTS: Defaults = (600, 0, 16, 3);
/// Presets: (steps, warmup, unused: each preset has its batch sizes, unused).
const PRESETS_DEFAULTS: Defaults = (10, 3, 0, 1);

/// `--quick`: every suite in a few steps and one round (the whole bench in a few minutes on 2
/// cores; the figures are a smoke test, not a measurement). Flags given explicitly win.
fn quick_defaults(suite: Suite) -> Defaults {
    match suite {
        Suite::Precision => (10, 2, 64, 1),
        Suite::Checkpoint => (1, 1, 32, 1),
        Suite::Ddp => (2, 1, 32, 1),
        Suite::Data => (1, 1, 64, 1),
        Suite::LocalSgd | Suite::Faults => (20, 0, 32, 1),
        Suite::Launch => (60, 0, 16, 1),
        Suite::Tp => (1, 0, 0, 1),
        Suite::Presets => PRESETS_DEFAULTS,
        Suite::Torch => (1, 1, 32, 1),
        Suite::Linear => (1, 1, 32, 1),
        Suite::Autocast => (1, 1, 32, 1),
        Suite::Fusion => (1, 1, 2, 1),
    }
}

pub const USAGE: &str = "usage: cargo xtask bench [--suite precision|checkpoint|linear|autocast|ddp|data|localsgd|faults|launch|tp|fusion|all] \
[--backend flex|cuda|wgpu|tch] [--steps N] [--warmup N] [--batch-size N] [--rounds N] [--out DIR] \
[--models transformer|vit|burn-lm|all (checkpoint, linear, autocast, torch)] [--preset vit-b16|gpt2-small|all] [--quick (a few steps per suite)] [--torch (next to PyTorch)]";

fn parse(args: &[String]) -> Result<Given, String> {
    let mut g = Given::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--quick" {
            g.quick = true;
            continue;
        }
        if flag == "--torch" {
            g.suite = Some("torch".into());
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = || match value.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("{flag} '{value}': expected a whole number >= 1")),
        };
        match flag.as_str() {
            "--suite" => g.suite = Some(value.clone()),
            "--backend" => g.backend = Some(value.clone()),
            "--steps" => g.steps = num()?,
            "--warmup" => g.warmup = num()?,
            "--batch-size" => g.batch_size = num()?,
            "--rounds" => g.rounds = num()?,
            "--out" => g.out = Some(value.clone()),
            "--models" => g.models = Some(value.clone()),
            "--preset" => g.preset = Some(value.clone()),
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    Ok(g)
}

impl Given {
    fn options(&self, (steps, warmup, batch_size, rounds): Defaults) -> Options {
        Options {
            backend: self.backend.clone().unwrap_or_else(|| "flex".into()),
            steps: self.steps.unwrap_or(steps),
            warmup: self.warmup.unwrap_or(warmup),
            batch_size: self.batch_size.unwrap_or(batch_size),
            rounds: self.rounds.unwrap_or(rounds),
            out: self.out.clone().unwrap_or_else(|| "bench-results".into()),
            models: self.models.clone().unwrap_or_else(|| "all".into()),
            preset: self.preset.clone(),
            quick: self.quick,
        }
    }
}

/// Runs the benchmark suites the command line asks for.
pub fn run(args: &[String]) -> Result<(), String> {
    let given = parse(args)?;
    let default_suite = if given.preset.is_some() {
        "presets"
    } else {
        "all"
    };
    let suite = given.suite.as_deref().unwrap_or(default_suite);
    let suites: &[Suite] = match suite {
        "all" => &[
            Suite::Precision,
            Suite::Checkpoint,
            Suite::Linear,
            Suite::Autocast,
            Suite::Ddp,
            Suite::Data,
            Suite::LocalSgd,
            Suite::Faults,
        ],
        "precision" => &[Suite::Precision],
        "checkpoint" => &[Suite::Checkpoint],
        "linear" => &[Suite::Linear],
        "autocast" => &[Suite::Autocast],
        "ddp" => &[Suite::Ddp],
        "data" => &[Suite::Data],
        "localsgd" => &[Suite::LocalSgd],
        "faults" => &[Suite::Faults],
        "launch" => &[Suite::Launch],
        "tp" => &[Suite::Tp],
        "presets" => &[Suite::Presets],
        "fusion" => &[Suite::Fusion],
        "torch" => &[Suite::Torch],
        other => {
            return Err(format!(
                "unknown suite '{other}'; valid: precision, checkpoint, linear, autocast, ddp, data, localsgd, faults, launch, tp, fusion, \
                 presets, torch, all (all but presets and torch, which --preset and --torch \
                 select)"
            ));
        }
    };
    for &suite in suites {
        let defaults = match suite {
            _ if given.quick => quick_defaults(suite),
            Suite::Precision => PRECISION_DEFAULTS,
            Suite::Checkpoint => CHECKPOINT_DEFAULTS,
            Suite::Ddp => DDP_DEFAULTS,
            Suite::Data => DATA_DEFAULTS,
            Suite::LocalSgd => LOCALSGD_DEFAULTS,
            Suite::Faults => FAULTS_DEFAULTS,
            Suite::Launch => LAUNCH_DEFAULTS,
            Suite::Tp => TP_DEFAULTS,
            Suite::Presets => PRESETS_DEFAULTS,
            Suite::Torch => TORCH_DEFAULTS,
            Suite::Linear => LINEAR_DEFAULTS,
            Suite::Autocast => AUTOCAST_DEFAULTS,
            Suite::Fusion => FUSION_DEFAULTS,
        };
        on_backend(&given.options(defaults), suite)?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Suite {
    Precision,
    Checkpoint,
    Ddp,
    Data,
    LocalSgd,
    /// Fault-tolerant DiLoCo, with and without a worker failing and restarting.
    Faults,
    /// `afterburner launch` under DiLoCo, with and without a replica killed every second.
    Launch,
    /// Tensor parallelism next to FSDP: bytes per step, parameters per rank.
    Tp,
    Presets,
    Torch,
    Linear,
    Autocast,
    /// Fused vs unfused GPU backend (wgpu, cuda).
    Fusion,
}

fn on_backend(o: &Options, suite: Suite) -> Result<(), String> {
    if let Suite::Fusion = suite {
        return fusion_on_backend(o);
    }
    if let Suite::Launch = suite {
        return launch::bench(o);
    }
    if let Suite::Tp = suite {
        return tp::bench(o);
    }
    macro_rules! go {
        ($inner:ty) => {
            match suite {
                Suite::Precision => precision::bench::<$inner>(o),
                Suite::Checkpoint => checkpoint::bench::<$inner>(o),
                Suite::Ddp => ddp::bench::<$inner>(o),
                Suite::Data => data::bench::<$inner>(o),
                Suite::LocalSgd => localsgd::bench::<$inner>(o),
                Suite::Faults => faults::bench::<$inner>(o),
                Suite::Presets => presets::bench::<$inner>(o),
                Suite::Torch => torch::bench::<$inner>(o),
                Suite::Linear => linear::bench::<$inner>(o),
                Suite::Autocast => autocast::bench::<$inner>(o),
                Suite::Fusion => fusion_on_backend(o),
                Suite::Launch => launch::bench(o),
                Suite::Tp => tp::bench(o),
            }
        };
    }
    match o.backend.as_str() {
        #[cfg(feature = "flex")]
        "flex" => go!(burn::backend::Flex),
        #[cfg(feature = "cuda")]
        "cuda" => go!(burn::backend::Cuda),
        #[cfg(feature = "wgpu")]
        "wgpu" => go!(burn::backend::Wgpu),
        #[cfg(feature = "tch")]
        "tch" => go!(burn::backend::LibTorch),
        other => Err(format!(
            "backend '{other}' is not compiled in; build xtask with it: \
             cargo run --release -p xtask --features {other} -- bench --backend {other}"
        )),
    }
}

/// The fusion suite on the backend `--backend` names, fused and unfused side by side.
fn fusion_on_backend(o: &Options) -> Result<(), String> {
    match o.backend.as_str() {
        #[cfg(feature = "wgpu")]
        "wgpu" => fusion::bench::<
            burn::backend::Wgpu,
            burn_cubecl::CubeBackend<burn_cubecl::cubecl::wgpu::WgpuRuntime, f32, i32, u32>,
        >(o),
        #[cfg(feature = "cuda")]
        "cuda" => fusion::bench::<
            burn::backend::Cuda,
            burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>,
        >(o),
        other => Err(format!(
            "the fusion suite compares Burn's fused and unfused GPU backends: --backend wgpu \
             or cuda (built with that feature), not '{other}'"
        )),
    }
}

/// Writes each chart as `<out>/<suite>-<backend>-<chart>.svg` and links them under `md`.
fn with_charts(
    o: &Options,
    suite: &str,
    md: &str,
    charts: &[plot::Chart],
) -> Result<String, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("creating {}: {e}", o.out))?;
    let mut md = md.to_string();
    for chart in charts {
        let mut chart = chart.clone();
        if o.quick {
            chart.title.push_str(QUICK_TITLE);
        }
        let file = format!("{suite}-{}-{}.svg", o.backend, chart.name);
        let path = format!("{}/{file}", o.out);
        std::fs::write(&path, chart.svg()).map_err(|e| format!("writing {path}: {e}"))?;
        md.push_str(&format!("\n![{}]({file})\n", chart.title));
    }
    Ok(md)
}

/// What a `--quick` chart's title ends with.
const QUICK_TITLE: &str = " (--quick: not a measurement)";

/// The banner a `--quick` report starts with.
const QUICK_BANNER: &str = "> --quick: one round of a few steps, to check that the suite runs. \
These figures are not measurements and no conclusion is drawn from them; run without --quick \
to measure.";

/// A `--quick` report: the banner, the suite's first line, its tables and charts, and none of
/// its sentences (they draw conclusions from the figures).
fn quick_report(md: &str) -> String {
    let mut lines = vec![QUICK_BANNER.to_string(), String::new()];
    let mut described = false;
    for line in md.lines() {
        let table_or_chart = line.starts_with('|') || line.starts_with("![") || line.is_empty();
        if table_or_chart || line.starts_with('#') {
            lines.push(line.to_string());
        } else if !described {
            lines.push(line.to_string());
            described = true;
        }
    }
    lines.join("\n")
}

/// Prints the markdown table and writes `<out>/<suite>-<backend>.{json,md}`.
pub fn write_report<T: serde::Serialize>(
    o: &Options,
    suite: &str,
    rows: &[T],
    md: &str,
) -> Result<(), String> {
    let md = match o.quick {
        true => quick_report(md),
        false => md.to_string(),
    };
    println!("{md}");
    std::fs::create_dir_all(&o.out).map_err(|e| format!("creating {}: {e}", o.out))?;
    let base = format!("{}/{suite}-{}", o.out, o.backend);
    let json = serde_json::to_string_pretty(rows).map_err(|e| e.to_string())?;
    std::fs::write(format!("{base}.json"), json)
        .map_err(|e| format!("writing {base}.json: {e}"))?;
    std::fs::write(format!("{base}.md"), md).map_err(|e| format!("writing {base}.md: {e}"))?;
    eprintln!("wrote {base}.json and {base}.md");
    Ok(())
}

/// Whether the counting allocator sees the backend's tensors: not for tch, whose libtorch
/// allocates in C++.
pub(crate) fn heap_is_counted(o: &Options) -> bool {
    o.backend != "tch"
}

/// A sentence for reports on a backend whose heap the counting allocator does not see.
pub(crate) fn heap_note(o: &Options) -> &'static str {
    if heap_is_counted(o) {
        ""
    } else {
        " The tch backend's tensors live in libtorch's C++ heap, which the counting allocator \
         does not see: its memory columns are n/a."
    }
}

/// Waits for queued device work, restarts the memory peak and returns the start instant.
fn start_timing<B: AutodiffBackend>(device: &B::Device) -> Instant {
    B::sync(device).ok();
    alloc::reset_peak();
    Instant::now()
}

#[cfg(test)]
mod quick_tests {
    use super::*;

    #[test]
    fn a_quick_report_is_marked_and_draws_no_conclusion() {
        let md = "ViT on digits, 2 steps.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n\
                  The Accelerator is 3% slower.\n\n![chart](c.svg)\n";
        let quick = quick_report(md);
        assert!(quick.starts_with("> --quick"), "{quick}");
        assert!(quick.contains("not measurements"), "{quick}");
        assert!(
            quick.contains("ViT on digits") && quick.contains("| 1 | 2 |"),
            "{quick}"
        );
        assert!(quick.contains("![chart](c.svg)"), "{quick}");
        assert!(!quick.contains("slower"), "a conclusion was kept: {quick}");
    }
}
