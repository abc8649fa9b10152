//! Helpers the test suites of afterburner's crates share (feature `testing`): the flex
//! training backend, the digits batcher, a tiny ViT, the lock over flex's one process-wide
//! RNG, parameter snapshots and comparisons, scratch directories, the digits Trainer.

use std::sync::{Mutex, MutexGuard};

use crate::models::{Vit, VitConfig};
use crate::{ImageBatch, ImageBatcher, digits};
use afterburner::{AccelerateError, Accelerator};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{DType, Tensor};

/// The training backend of the tests: flex under autodiff.
pub type B = Autodiff<Flex>;

/// Batches the 8x8 one-channel digits.
pub const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

/// Flex keeps one process-wide RNG and the Accelerator seeds it: every test of a binary that
/// builds models or accelerators holds this lock for its whole run.
static RNG_LOCK: Mutex<()> = Mutex::new(());

/// Holds [`RNG_LOCK`] (a test that panicked while holding it does not poison it).
pub fn rng_lock() -> MutexGuard<'static, ()> {
    RNG_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A ViT small enough for a test: width 32, feed-forward 64, 2 layers.
pub fn tiny_vit() -> VitConfig {
    VitConfig::new()
        .with_d_model(32)
        .with_d_ff(64)
        .with_n_layers(2)
}

/// The first `n` digits as one batch.
pub fn digits_batch(start: usize, n: usize) -> ImageBatch<B> {
    let items = digits::load().unwrap().items()[start..start + n].to_vec();
    BATCHER.batch(items, &Default::default())
}

/// The mean cross-entropy of `logits` against `batch`'s labels.
pub fn cross_entropy(logits: Tensor<B, 2>, batch: &ImageBatch<B>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&Default::default())
        .forward(logits, batch.labels.clone())
}

/// Every float parameter as (id, dtype, values in f32), in visit order.
pub fn params<M: Module<B>>(model: &M) -> Vec<(ParamId, DType, Vec<f32>)> {
    struct Collect(Vec<(ParamId, DType, Vec<f32>)>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let v = param.val();
            let dtype = v.dtype();
            let values = v.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
            self.0.push((param.id, dtype, values));
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Every float parameter's values in f32, flattened in visit order, on any backend.
pub fn flat_params<Bk: burn::tensor::backend::Backend, M: Module<Bk>>(model: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<Bk: burn::tensor::backend::Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            let values = param.val().cast(DType::F32).into_data();
            self.0.extend(values.to_vec::<f32>().unwrap());
        }
    }
    let mut all = Collect(Vec::new());
    model.visit(&mut all);
    all.0
}

/// Gradient of every parameter of `model` (visit order), in f32; zeros where none.
pub fn grads_of<M: Module<B>>(model: &M, grads: &GradientsParams) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = match self.0.get::<Flex, D>(param.id) {
                Some(g) => g.cast(DType::F32).into_data().to_vec::<f32>().unwrap(),
                None => vec![0.0; param.val().shape().num_elements()],
            };
            self.1.push(values);
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// ||a - b|| / ||b|| over all values.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

/// Largest |a - b| / max(|b|, floor) over all values.
pub fn max_rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(floor))
        .fold(0.0, f32::max)
}

/// Every value of `p`, in order.
pub fn flatten(p: &[(ParamId, DType, Vec<f32>)]) -> Vec<f32> {
    p.iter().flat_map(|(_, _, v)| v.iter().copied()).collect()
}

/// A tiny ViT from `seed` (hold [`rng_lock`]).
pub fn vit(seed: u64) -> Vit<B> {
    <B as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
    let model = tiny_vit().init::<B>(&Default::default());
    afterburner::precision::materialize_params(&model);
    model
}

/// Trains the tiny ViT for one epoch of 96 digits in micro-batches of `batch`; returns the
/// full parameters, optimizer steps and gradient all-reduces.
pub fn train_96_digits(
    acc: &mut Accelerator<B>,
    model: crate::models::Vit<B>,
    batch: usize,
) -> Result<(Vec<f32>, u64, u64), AccelerateError> {
    let (mut model, mut optim) = acc.setup(model, SgdConfig::new().init())?;
    let loader = acc.dataloader(digits::load()?.take(96), BATCHER, batch)?;
    for batch in loader.epoch(0) {
        let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
        acc.backward(cross_entropy(logits, &batch), &model)?;
        model = acc.step(model, &mut optim, &mut 0.5)?;
    }
    Ok((
        flatten(&params(&acc.full_model(&model)?)),
        acc.counters().optimizer_steps,
        acc.gradient_all_reduces(),
    ))
}

/// The entry names of `dir`, sorted.
pub fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A fresh directory for this test process, `<temp>/afterburner-tests/<name>-<pid>` (not
/// created). The first call in a process removes what earlier test processes that are no
/// longer running left there, so the outputs of tests that cannot clean up after themselves
/// (a failed assertion, a directory other tests of the binary share) do not pile up.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = std::env::temp_dir().join("afterburner-tests");
    SWEPT.call_once(|| {
        // Which processes still run is read from /proc (Linux); elsewhere nothing is swept.
        let Ok(entries) = std::fs::read_dir(&root) else {
            return;
        };
        if !std::path::Path::new("/proc/self").exists() {
            return;
        }
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            let running = |pid: u32| std::path::Path::new("/proc").join(pid.to_string()).exists();
            if let Some(pid) = pid
                && pid != std::process::id()
                && !running(pid)
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir = root.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The Trainer of the tiny ViT on the built-in digits (flex).
pub type DigitsTrainer = afterburner::trainer::Trainer<
    afterburner::trainer::Components<
        B,
        Vit<B>,
        crate::ImageItem,
        crate::ImageBatch<B>,
        crate::ImageBatch<Flex>,
        burn::train::ClassificationOutput<Flex>,
    >,
>;
