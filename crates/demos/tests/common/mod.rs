//! What the tensor-parallel tests of the demo transformer share.

use afterburner_demos::models::{Transformer, TransformerConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};

/// The largest difference relative to the largest value of `expected`.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn relative(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len());
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let diff = actual
        .iter()
        .zip(expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

/// The norm of the difference relative to the norm of `expected` (AdamW's sign-like updates
/// turn any difference of a near-zero gradient into a step of up to the learning rate, so at
/// half precision the largest element difference is noise; the norm is the measure).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn norm_relative(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len());
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| x * x).sum::<f32>().sqrt();
    let diff = norm(&mut actual.iter().zip(expected).map(|(a, b)| a - b));
    diff / norm(&mut expected.iter().copied()).max(1e-12)
}

/// A 2-block transformer (d 16, 4 heads, 11 tokens) seeded with `seed`, and a batch of 2 x 6
/// tokens. One forward has read every lazily initialised parameter, so clones of the model
/// (one per rank) hold the same values.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn small_transformer<B: Backend>(seed: u64) -> (Transformer<B>, Tensor<B, 2, Int>) {
    let device = Default::default();
    B::seed(&device, seed);
    let model = TransformerConfig::new()
        .with_vocab_size(11)
        .with_d_model(16)
        .with_n_heads(4)
        .with_n_layers(2)
        .with_max_seq_len(8)
        .init::<B>(&device);
    let tokens = Tensor::<B, 2>::random([2, 6], Distribution::Uniform(0.0, 11.0), &device).int();
    let _ = model.forward(tokens.clone());
    (model, tokens)
}
