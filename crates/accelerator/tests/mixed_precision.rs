//! bf16 / f16 mixed and true precision on Burn's own layers, through the Accelerator.

mod common;

use afterburner_accelerator::{Accelerator, AcceleratorConfig, Precision};
use burn::module::Module;
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Int, Tensor};
use common::*;

fn accelerator(precision: &str) -> Accelerator<B> {
    let config = AcceleratorConfig {
        precision: precision.parse().unwrap(),
        ..Default::default()
    };
    Accelerator::new(config, Default::default()).unwrap()
}

/// Gradients of the ViT's parameters on one digits batch under `precision`.
fn vit_grads(precision: &str) -> (Vec<Vec<f32>>, afterburner_demos::models::Vit<B>) {
    let acc = accelerator(precision);
    let model = acc.setup_model(vit(7)).unwrap();
    let batch = digits_batch(0, 32);
    let logits = acc
        .forward(&model, batch.images.clone(), |m, x| m.forward(x))
        .unwrap();
    assert_eq!(logits.dtype(), DType::F32, "outputs come back in f32");
    let loss = cross_entropy(logits, &batch);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    (grads_of(&model, &grads), model)
}

#[test]
fn bf16_mixed_gradients_match_f32() {
    let _rng = rng_lock();
    let (reference, _) = vit_grads("32-true");
    let (bf16, model) = vit_grads("bf16-mixed");
    let all_ref: Vec<f32> = reference.iter().flatten().copied().collect();
    let all_bf16: Vec<f32> = bf16.iter().flatten().copied().collect();
    let global = rel_l2(&all_bf16, &all_ref);
    let mut per_tensor: Vec<f64> = reference
        .iter()
        .zip(&bf16)
        .map(|(r, h)| rel_l2(h, r))
        .collect();
    per_tensor.sort_by(f64::total_cmp);
    let median = per_tensor[per_tensor.len() / 2];
    // (The attention key bias has an exactly-zero true gradient, so its relative error is noise.)
    println!(
        "bf16-mixed vs f32 gradients: global relative L2 {global:.2e}, median tensor {median:.2e}"
    );
    assert!(median < 2e-2, "median per-tensor relative error {median}");
    assert!(global < 2e-2, "global relative error {global}");
    assert!(global > 0.0, "bf16 must actually compute in bf16");
    assert!(
        bf16.iter().all(|g| g.iter().any(|v| *v != 0.0)),
        "every parameter gets a gradient"
    );
    assert!(
        params(&model).iter().all(|(_, d, _)| *d == DType::F32),
        "master weights stay f32"
    );
}

#[test]
fn f16_mixed_gradients_match_f32() {
    let _rng = rng_lock();
    let (reference, _) = vit_grads("32-true");
    let (f16, _) = vit_grads("16-mixed");
    let all_ref: Vec<f32> = reference.iter().flatten().copied().collect();
    let all_f16: Vec<f32> = f16.iter().flatten().copied().collect();
    let global = rel_l2(&all_f16, &all_ref);
    println!("16-mixed vs f32 gradients: global relative L2 {global:.2e}");
    assert!(
        global < 1e-2 && global > 0.0,
        "global relative error {global}"
    );
}

/// Every micro-batch builds a fresh view, so repeated passes all reach the master weights.
#[test]
fn repeated_passes_each_reach_the_master() {
    let _rng = rng_lock();
    let acc = accelerator("bf16-mixed");
    let model = acc.setup_model(vit(3)).unwrap();
    let batch = digits_batch(0, 8);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        let grads = GradientsParams::from_grads(cross_entropy(logits, &batch).backward(), &model);
        runs.push(grads_of(&model, &grads));
    }
    assert!(runs[0].iter().all(|g| g.iter().any(|v| *v != 0.0)));
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[1], runs[2]);
}

/// A loss that does not come from the set-up model is a clear error, not silent zeros.
#[test]
fn backward_without_model_gradients_is_an_error() {
    let _rng = rng_lock();
    let mut acc = accelerator("bf16-mixed");
    let model = acc.setup_model(vit(3)).unwrap();
    let stranger = LinearConfig::new(4, 1).init::<B>(&Default::default());
    let loss = stranger
        .forward(Tensor::<B, 2>::ones([2, 4], &Default::default()))
        .mean();
    let err = acc.backward(loss, &model).unwrap_err().to_string();
    assert!(err.contains("no gradient reached"), "{err}");
}

#[derive(Module, Debug)]
struct TextClassifier<B: Backend> {
    embed: Embedding<B>,
    encoder: burn::nn::transformer::TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> TextClassifier<B> {
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let x = self.embed.forward(tokens);
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        let [b, _, d] = x.dims();
        self.head.forward(x.mean_dim(1).reshape([b, d]))
    }
}

/// Embedding + TransformerEncoder (MultiHeadAttention, LayerNorm inside) with int inputs.
#[test]
fn embedding_and_attention_models_train_in_bf16() {
    let _rng = rng_lock();
    let device = Default::default();
    B::seed(&device, 11);
    let model = TextClassifier {
        embed: EmbeddingConfig::new(50, 16).init::<B>(&device),
        encoder: TransformerEncoderConfig::new(16, 32, 2, 1)
            .with_dropout(0.0)
            .init(&device),
        head: LinearConfig::new(16, 3).init(&device),
    };
    let tokens = Tensor::<B, 2, Int>::random([4, 6], Distribution::Uniform(0.0, 50.0), &device);
    let target = Tensor::<B, 2>::random([4, 3], Distribution::Normal(0.0, 1.0), &device);
    let grads_under = |precision: &str| {
        let acc = accelerator(precision);
        let model = acc.setup_model(model.clone()).unwrap();
        let out = acc
            .forward(&model, tokens.clone(), |m, t| m.forward(t))
            .unwrap();
        let loss = (out - target.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        grads_of(&model, &grads).concat()
    };
    let reference = grads_under("32-true");
    let bf16 = grads_under("bf16-mixed");
    let err = rel_l2(&bf16, &reference);
    println!("Embedding+TransformerEncoder bf16-mixed gradient relative L2: {err:.2e}");
    assert!(err < 3e-2 && err > 0.0, "relative error {err}");
}

/// What happens inside Burn's TransformerEncoder, which afterburner does not control: its
/// LayerNorm and softmax run in the half dtype. The output error stays small; measured here.
#[test]
fn transformer_encoder_output_error_in_half() {
    let _rng = rng_lock();
    let device = Default::default();
    B::seed(&device, 5);
    let encoder = TransformerEncoderConfig::new(64, 128, 4, 2)
        .with_dropout(0.0)
        .init::<B>(&device);
    let x = Tensor::<B, 3>::random([8, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let reference = encoder
        .forward(TransformerEncoderInput::new(x.clone()))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    for (precision, bound) in [("bf16-mixed", 3e-2), ("16-mixed", 5e-3)] {
        let acc = accelerator(precision);
        let out = acc
            .forward(&encoder, x.clone(), |m, x| {
                m.forward(TransformerEncoderInput::new(x))
            })
            .unwrap();
        let err = rel_l2(&out.into_data().to_vec::<f32>().unwrap(), &reference);
        println!("TransformerEncoder output, {precision} vs f32: relative L2 {err:.2e}");
        assert!(err < bound && err > 0.0, "{precision}: {err}");
    }
}

#[test]
fn true_modes_keep_half_parameters_through_a_step() {
    let _rng = rng_lock();
    for (precision, dtype) in [("bf16-true", DType::BF16), ("16-true", DType::F16)] {
        let mut acc = accelerator(precision);
        let (mut model, mut optim) = acc.setup(vit(1), SgdConfig::new().init()).unwrap();
        assert!(params(&model).iter().all(|(_, d, _)| *d == dtype));
        let before = flatten(&params(&model));
        let batch = digits_batch(0, 16);
        let logits = acc
            .forward(&model, batch.images.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(cross_entropy(logits, &batch), &model).unwrap();
        model = acc.step(model, &mut optim, &mut 0.1).unwrap();
        let after = params(&model);
        assert!(after.iter().all(|(_, d, _)| *d == dtype), "{precision}");
        assert_ne!(before, flatten(&after), "{precision} must update");
    }
}

#[test]
fn precision_typos_and_config_errors_are_named() {
    let _rng = rng_lock();
    let err = "bf16_mixed".parse::<Precision>().unwrap_err().to_string();
    assert!(
        err.contains("valid values") && err.contains("\"bf16-mixed\""),
        "{err}"
    );
    let bad = AcceleratorConfig {
        gradient_accumulation_steps: 0,
        ..Default::default()
    };
    let err = Accelerator::<B>::new(bad, Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("gradient_accumulation_steps"), "{err}");
}
