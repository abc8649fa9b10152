//! What the checks share: tiny models, batches of digits and tokens, and parameter / gradient
//! readers.

use afterburner::{AccelerateError, Accelerator};
use afterburner_demos::models::{Transformer, TransformerConfig, Vit, VitConfig};
use afterburner_demos::text::TokenBatch;
use afterburner_demos::{ImageBatch, ImageBatcher, digits};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};

/// The 8x8 one-channel digits.
pub const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

/// A two-block ViT small enough for a software GPU driver (about 5k parameters).
pub fn tiny_vit<B: AutodiffBackend>(device: &B::Device, seed: u64) -> Vit<B> {
    B::seed(device, seed);
    let model = VitConfig::new()
        .with_d_model(16)
        .with_d_ff(32)
        .with_n_heads(2)
        .with_n_layers(2)
        .init::<B>(device);
    afterburner::precision::materialize_params(&model);
    model
}

/// Digits `start..start + n` as one batch on `device`.
pub fn digits_batch<B: AutodiffBackend>(
    device: &B::Device,
    start: usize,
    n: usize,
) -> Result<ImageBatch<B>, String> {
    let items = digits::load().map_err(|e| e.to_string())?.items()[start..start + n].to_vec();
    Ok(BATCHER.batch(items, device))
}

/// Mean cross-entropy of `logits` against the batch's labels.
pub fn cross_entropy<B: AutodiffBackend>(
    logits: Tensor<B, 2>,
    batch: &ImageBatch<B>,
) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, batch.labels.clone())
}

/// The model's logits on `batch` through the Accelerator (its precision, checkpointing and
/// strategy view).
pub fn logits<B: AutodiffBackend>(
    acc: &Accelerator<B>,
    model: &Vit<B>,
    batch: &ImageBatch<B>,
) -> Result<Tensor<B, 2>, AccelerateError> {
    acc.forward(model, batch.images.clone(), |m, x| m.forward(x))
}

/// A 2-block demo transformer (d 16, 4 heads, 11 tokens) seeded with `seed`, every lazy
/// parameter initialised (so clones of it hold the same values).
pub fn tiny_transformer<B: AutodiffBackend>(device: &B::Device, seed: u64) -> Transformer<B> {
    B::seed(device, seed);
    let model = TransformerConfig::new()
        .with_vocab_size(11)
        .with_d_model(16)
        .with_n_heads(4)
        .with_n_layers(2)
        .with_max_seq_len(8)
        .init::<B>(device);
    let _ = model.forward(Tensor::zeros([1, 8], device));
    model
}

/// 4 sequences of 8 tokens (a fixed pattern) and their next tokens, for [`tiny_transformer`].
pub fn token_batch<B: AutodiffBackend>(device: &B::Device) -> TokenBatch<B> {
    let tokens: Vec<i64> = (0..4 * 9).map(|i| (i * 7 + 3) % 11).collect();
    let all = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [4, 9]), device);
    TokenBatch {
        inputs: all.clone().narrow(1, 0, 8),
        targets: all.narrow(1, 1, 8),
        max_target: Some(10),
    }
}

/// Every float parameter's values in f32, flattened in visit order.
pub fn flat_params<B: AutodiffBackend, M: Module<B>>(model: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().cast(DType::F32).into_data();
            self.0.extend(values.iter::<f32>());
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// The dtype of every float parameter, in visit order.
pub fn param_dtypes<B: AutodiffBackend, M: Module<B>>(model: &M) -> Vec<DType> {
    struct Collect(Vec<DType>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().dtype());
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Every parameter's gradient in f32 (zeros where it has none), flattened in visit order.
pub fn flat_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<f32> {
    struct Collect<'a>(&'a GradientsParams, Vec<f32>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            match self.0.get::<B::InnerBackend, D>(param.id) {
                Some(g) => self.1.extend(g.cast(DType::F32).into_data().iter::<f32>()),
                None => self
                    .1
                    .extend(std::iter::repeat_n(0.0, param.val().shape().num_elements())),
            }
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// ||a - b|| / ||b|| over all values.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

/// Largest |a - b| / max(|b|, 1e-3) over all values; infinite when the lengths differ or any
/// value is not finite (so a NaN never passes a bound).
pub fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs() / y.abs().max(1e-3)))
        .fold(0.0, f64::max)
}

/// An error when training left the parameters where they started (a check comparing two runs
/// that both did nothing would otherwise pass).
pub fn trained(before: &[f32], after: &[f32]) -> Result<(), String> {
    if before.len() == after.len() && before.iter().zip(after).all(|(a, b)| a == b) {
        Err("the parameters did not change: no optimizer step was applied".into())
    } else {
        Ok(())
    }
}

/// `Ok` with `detail` when `err <= bound`, otherwise an error naming both.
pub fn within(what: &str, err: f64, bound: f64) -> Result<String, String> {
    if err <= bound {
        Ok(format!("{what}: {err:.2e} (bound {bound:.0e})"))
    } else {
        Err(format!("{what}: {err:.3e} exceeds the bound {bound:.0e}"))
    }
}

/// Turns any displayable error into the suite's `String` error.
pub fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
