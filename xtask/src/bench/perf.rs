//! The presets' focused form for a short GPU session (`cargo xtask gpu-check --perf`):
//! GPT-2 small (sequence 1024, batch 8) and ViT-B/16 (224 px, batch 64) at 32-true and
//! bf16-mixed, on one device, without activation checkpointing: the rows the PyTorch twins
//! (`xtask/torch/preset_twins.py`) are put beside. `--quick` keeps the architectures and runs
//! the presets' tiny inputs (the CPU dry run CI makes).

use afterburner::Precision;
use burn::tensor::backend::Backend;

use super::Options;
use super::presets::{Preset, Row, Setting, all_devices, measure, model_flops, versus_32_true};

/// The precisions the focused run times.
pub const PERF_PRECISIONS: [Precision; 2] = [Precision::Full32, Precision::Bf16Mixed];

/// The focused presets, in the order they run, with their batch per device.
fn presets(quick: bool) -> Vec<(Preset, usize)> {
    [Preset::Gpt2Small, Preset::VitB16]
        .into_iter()
        .map(|preset| {
            let (batches, _) = preset.shapes(quick);
            // The larger ViT batch: the one a GPU is measured at.
            (preset, batches.last().copied().unwrap_or(1))
        })
        .collect()
}

/// The focused rows on `I`'s first device (`o.steps` timed steps after `o.warmup`; 1 and 1
/// under `o.quick`), each 32-true row first, so bf16-mixed's speed-up over it is filled in;
/// `done` sees the rows so far after each one (gpu-check writes its report there).
pub fn rows<I: Backend>(o: &Options, done: &mut dyn FnMut(&[Row])) -> Result<Vec<Row>, String> {
    let devices = all_devices::<I>()?;
    let one = &devices[..1];
    let mut rows = Vec::new();
    for (preset, batch) in presets(o.quick) {
        let (_, size) = preset.shapes(o.quick);
        let flops = model_flops::<I>(preset, batch, size, &devices[0]);
        let mut base = None;
        for precision in PERF_PRECISIONS {
            println!("perf: {preset:?} batch {batch} size {size} {precision} on one device");
            let setting = Setting {
                preset,
                flops,
                batch,
                size,
                precision,
                checkpointing: false,
                strategy: "ddp",
            };
            let row = measure::<I>(o, &setting, one);
            rows.push(versus_32_true(row, precision, &mut base));
            done(&rows);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_focused_presets_are_the_issues_shapes() {
        let full = presets(false);
        assert_eq!(full.len(), 2);
        assert_eq!(full[0].0.shapes(false).1, 1024);
        assert_eq!(full[0].1, 8);
        assert_eq!(full[1].0.shapes(false).1, 224);
        assert_eq!(full[1].1, 64);
    }
}
