//! `Autocast<Autodiff<Flex>>`: op-level autocast above Autodiff, whose casts Autodiff records.
//! It computes the outputs and gradients of `Autodiff<Autocast<Flex>>` (the casts below
//! Autodiff), on the same weights, per op in bf16 and f16 and outside a scope.

use afterburner_precision::{Autocast, autocast_ops};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Tensor};

type Below = Autodiff<Autocast<Flex>>;
type Above = Autocast<Autodiff<Flex>>;

/// Flex has one process-wide RNG: tests that seed it and build models run one at a time.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every parameter's gradient (each must be f32), concatenated.
fn gradients<B: AutodiffBackend, M: Module<B>>(model: &M, grads: &B::Gradients) -> Vec<f32> {
    struct Collect<'a, B: AutodiffBackend>(&'a B::Gradients, Vec<f32>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.0).expect("a gradient");
            assert_eq!(grad.dtype(), DType::F32, "f32 parameters get f32 gradients");
            self.1.extend(grad.into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut collect = Collect::<B>(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// A two-layer `TransformerEncoder` seeded with `seed`, run on a seeded batch: the output
/// (in f32) and every parameter's gradient of `sum(out * target)`, the forward and backward
/// under `half`'s op-level scope when given.
fn encoder_run<B: AutodiffBackend>(seed: u64, half: Option<DType>) -> (Vec<f32>, Vec<f32>) {
    let device = Default::default();
    B::seed(&device, seed);
    let encoder = TransformerEncoderConfig::new(32, 64, 4, 2)
        .with_dropout(0.0)
        .init::<B>(&device);
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<B, 3>::random([4, 8, 32], normal, &device);
    let target = Tensor::<B, 3>::random([4, 8, 32], normal, &device);
    let scoped = |f: &mut dyn FnMut()| match half {
        Some(half) => autocast_ops(half, f),
        None => f(),
    };
    let mut out = None;
    scoped(&mut || out = Some(encoder.forward(TransformerEncoderInput::new(x.clone()))));
    let out = out.expect("ran").cast(DType::F32);
    let loss = (out.clone() * target.clone()).sum();
    let mut grads = None;
    scoped(&mut || grads = Some(loss.clone().backward()));
    let grads = gradients(&encoder, &grads.expect("ran"));
    (out.into_data().to_vec::<f32>().unwrap(), grads)
}

/// Largest `|a - b|` relative to the largest `|b|`.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

#[test]
fn recorded_casts_compute_what_casts_below_autodiff_compute() {
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let (_, grads_f32) = encoder_run::<Below>(3, None);
    for half in [None, Some(DType::BF16), Some(DType::F16)] {
        let (out_below, grads_below) = encoder_run::<Below>(3, half);
        let (out_above, grads_above) = encoder_run::<Above>(3, half);
        let (out, grads) = (
            max_diff(&out_above, &out_below),
            max_diff(&grads_above, &grads_below),
        );
        let (above_f32, below_f32) = (
            max_diff(&grads_above, &grads_f32),
            max_diff(&grads_below, &grads_f32),
        );
        println!(
            "{half:?}: recorded vs below: output {out:.2e}, gradients {grads:.2e}; gradients \
             vs f32: recorded {above_f32:.2e}, below {below_f32:.2e}"
        );
        match half {
            None => assert!(out == 0.0 && grads == 0.0, "f32: {out} {grads}"),
            Some(half) => {
                assert!(above_f32 > 1e-4, "{half:?} computes in half: {above_f32}");
                assert!(out < 1e-2 && grads < 2e-2, "{half:?}: {out} {grads}");
                assert!(
                    above_f32 < 1.5 * below_f32,
                    "{half:?}: as close to f32: {above_f32} vs {below_f32}"
                );
            }
        }
    }
}

/// Inside a scope, `Autocast<Autodiff<Flex>>` runs LayerNorm as one node (registered by
/// `record_autocast_nodes`) computing in f32: its output and the gradients of the input, gamma
/// and beta equal Autodiff's decomposed layer norm (outside a scope) to f32 rounding, and a
/// half input gets a half gradient.
#[test]
fn layer_norm_as_one_node_gives_the_decomposed_gradients() {
    use burn::nn::LayerNormConfig;
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    afterburner_precision::record_autocast_nodes::<Above>();
    let device = Default::default();
    let run = |scoped: bool, dtype: DType| {
        Above::seed(&device, 7);
        let norm = LayerNormConfig::new(32).init::<Above>(&device);
        let normal = Distribution::Normal(1.0, 2.0);
        let x = Tensor::<Above, 3>::random([4, 8, 32], normal, &device)
            .cast(dtype)
            .require_grad();
        let target = Tensor::<Above, 3>::random([4, 8, 32], normal, &device);
        let out = match scoped {
            true => autocast_ops(DType::BF16, || norm.forward(x.clone())),
            false => norm.forward(x.clone().cast(DType::F32)),
        };
        assert_eq!(out.dtype(), DType::F32, "layer norm runs in f32 per op");
        let grads = (out.clone() * target).sum().backward();
        let x_grad = x.grad(&grads).expect("a gradient");
        assert_eq!(x_grad.dtype(), dtype, "the input's gradient in its dtype");
        let values = |t: Tensor<Flex, 3>| t.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
        let params = gradients(&norm, &grads);
        (values(out.inner()), values(x_grad), params)
    };
    for dtype in [DType::F32, DType::BF16] {
        let (out_node, x_node, params_node) = run(true, dtype);
        let (out_ref, x_ref, params_ref) = run(false, dtype);
        let diffs = [
            max_diff(&out_node, &out_ref),
            max_diff(&x_node, &x_ref),
            max_diff(&params_node, &params_ref),
        ];
        println!("{dtype:?} input: node vs decomposed, output/x/params {diffs:?}");
        let bound = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        assert!(diffs.iter().all(|d| *d < bound), "{dtype:?}: {diffs:?}");
    }
}

/// Inside a scope, `Autocast<Autodiff<Flex>>` runs softmax as one node computing in f32: its
/// output equals Autodiff's decomposed softmax in f32 (outside a scope) to f32 rounding, the
/// input's gradient (in the input's dtype) to the rounding of the half copy of the output its
/// backward reads, and a half matmul reading the output gets the same values.
#[test]
fn softmax_as_one_node_gives_the_decomposed_gradients() {
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    afterburner_precision::record_autocast_nodes::<Above>();
    let device = Default::default();
    let run = |half: Option<DType>, dtype: DType| {
        Above::seed(&device, 11);
        let normal = Distribution::Normal(0.0, 2.0);
        let x = Tensor::<Above, 3>::random([4, 8, 8], normal, &device)
            .cast(dtype)
            .require_grad();
        let values = Tensor::<Above, 3>::random([4, 8, 16], normal, &device).require_grad();
        let target = Tensor::<Above, 3>::random([4, 8, 8], normal, &device);
        let (weights, context) = match half {
            Some(half) => autocast_ops(half, || {
                let weights = burn::tensor::activation::softmax(x.clone(), 2);
                (weights.clone(), weights.matmul(values.clone()))
            }),
            None => {
                let weights = burn::tensor::activation::softmax(x.clone().cast(DType::F32), 2);
                (weights.clone(), weights.matmul(values.clone()))
            }
        };
        assert_eq!(weights.dtype(), DType::F32, "softmax runs in f32 per op");
        let loss = (weights.clone() * target).sum() + context.clone().cast(DType::F32).sum();
        let grads = loss.backward();
        let x_grad = x.grad(&grads).expect("a gradient");
        assert_eq!(x_grad.dtype(), dtype, "the input's gradient in its dtype");
        let values_grad = values.grad(&grads).expect("a gradient");
        let flat = |t: Tensor<Flex, 3>| t.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
        [
            flat(weights.inner()),
            flat(context.inner()),
            flat(x_grad),
            flat(values_grad),
        ]
    };
    for dtype in [DType::F32, DType::BF16] {
        for half in [DType::BF16, DType::F16] {
            let node = run(Some(half), dtype);
            let reference = run(None, dtype);
            let diffs: Vec<f32> = node
                .iter()
                .zip(&reference)
                .map(|(a, b)| max_diff(a, b))
                .collect();
            println!(
                "{dtype:?} input, {half:?}: node vs decomposed f32, weights/context/x grad/values grad {diffs:?}"
            );
            assert!(diffs[0] < 1e-5, "{dtype:?} {half:?}: weights {diffs:?}");
            assert!(
                diffs[1..].iter().all(|d| *d < 2e-2),
                "{dtype:?} {half:?}: {diffs:?}"
            );
        }
    }
}
