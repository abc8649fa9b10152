//! Op-level autocast (`autocast_ops`) on Burn's `TransformerEncoder`: output and gradient
//! errors against f32, next to the half view's (`autocast_view`), on the same weights.

use afterburner_precision::{Autocast, CastFloats, autocast_ops, autocast_view};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Tensor};

type B = Autodiff<Autocast<Flex>>;

/// Flex has one process-wide RNG: tests that seed it and build models run one at a time.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Relative L2 distance of `a` from `b`.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += f64::from(x - y).powi(2);
        den += f64::from(*y).powi(2);
    }
    (num / den).sqrt()
}

/// Every parameter's gradient, concatenated, in f32.
fn all_grads(
    model: &TransformerEncoder<B>,
    grads: &<B as burn::tensor::backend::AutodiffBackend>::Gradients,
) -> Vec<f32> {
    struct Collect<'a>(
        &'a <B as burn::tensor::backend::AutodiffBackend>::Gradients,
        Vec<f32>,
        Vec<DType>,
    );
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param
                .val()
                .grad(self.0)
                .expect("every parameter has a gradient");
            self.2.push(grad.dtype());
            self.1
                .extend(grad.into_data().convert::<f32>().to_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(grads, Vec::new(), Vec::new());
    model.visit(&mut c);
    assert!(
        c.2.iter().all(|d| *d == DType::F32),
        "f32 parameters get f32 gradients: {:?}",
        c.2
    );
    c.1
}

/// (output, gradients) of `sum(out * target)` for the encoder computed by `run`, the backward
/// pass inside an op-level scope of `backward_scope` when given (as `Accelerator::backward`
/// runs it).
fn output_and_grads(
    encoder: &TransformerEncoder<B>,
    x: &Tensor<B, 3>,
    target: &Tensor<B, 3>,
    backward_scope: Option<DType>,
    run: impl FnOnce(&TransformerEncoder<B>, Tensor<B, 3>) -> Tensor<B, 3>,
) -> (Vec<f32>, Vec<f32>) {
    let out = run(encoder, x.clone());
    assert_eq!(out.dtype(), DType::F32);
    let loss = (out.clone() * target.clone()).sum();
    let grads = match backward_scope {
        Some(half) => autocast_ops(half, || loss.backward()),
        None => loss.backward(),
    };
    (
        out.into_data().to_vec::<f32>().unwrap(),
        all_grads(encoder, &grads),
    )
}

#[test]
fn op_level_autocast_is_closer_to_f32_than_the_half_view() {
    let _rng = rng_lock();
    let device = Default::default();
    B::seed(&device, 5);
    let encoder = TransformerEncoderConfig::new(64, 128, 4, 2)
        .with_dropout(0.0)
        .init::<B>(&device);
    let x = Tensor::<B, 3>::random([8, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let target = Tensor::<B, 3>::random([8, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let forward = |m: &TransformerEncoder<B>, x| m.forward(TransformerEncoderInput::new(x));
    let (out_ref, grad_ref) = output_and_grads(&encoder, &x, &target, None, forward);
    for half in [DType::BF16, DType::F16] {
        let (out_view, grad_view) = output_and_grads(&encoder, &x, &target, None, |m, x| {
            forward(&autocast_view(m, half), x.cast_floats(half)).cast_floats(DType::F32)
        });
        let (out_op, grad_op) = output_and_grads(&encoder, &x, &target, Some(half), |m, x| {
            autocast_ops(half, || forward(m, x)).cast_floats(DType::F32)
        });
        let (view_out, op_out) = (rel_l2(&out_view, &out_ref), rel_l2(&out_op, &out_ref));
        let (view_grad, op_grad) = (rel_l2(&grad_view, &grad_ref), rel_l2(&grad_op, &grad_ref));
        println!(
            "{half:?}: output error view {view_out:.2e}, op {op_out:.2e}; \
             gradient error view {view_grad:.2e}, op {op_grad:.2e}"
        );
        assert!(op_out > 0.0, "{half:?}: op-level autocast computes in half");
        assert!(
            op_out * 2.0 < view_out,
            "{half:?}: output {op_out} vs view {view_out}"
        );
        assert!(
            op_grad * 2.0 < view_grad,
            "{half:?}: gradients {op_grad} vs view {view_grad}"
        );
    }
}

/// A Conv2d then a ConvTranspose2d (a decoder's upsampling) per op: the transposed convolution
/// meets the half output of the convolution and f32 weights, runs in half, and the f32
/// parameters get f32 gradients close to f32's (on the inner backend alone, that mix panics).
#[test]
fn a_transposed_convolution_runs_per_op_after_a_convolution() {
    use burn::nn::conv::{Conv2dConfig, ConvTranspose2dConfig};
    let _rng = rng_lock();
    let device = Default::default();
    B::seed(&device, 9);
    let conv = Conv2dConfig::new([1, 4], [3, 3]).init::<B>(&device);
    let up = ConvTranspose2dConfig::new([4, 1], [3, 3]).init::<B>(&device);
    let x = Tensor::<B, 4>::random([2, 1, 8, 8], Distribution::Normal(0.0, 1.0), &device);
    let run = |half: Option<DType>| {
        let forward = || up.forward(conv.forward(x.clone()));
        let out = match half {
            Some(half) => autocast_ops(half, forward),
            None => forward(),
        };
        let dtype = out.dtype();
        let loss = out.cast(DType::F32).powi_scalar(2).sum();
        let grads = match half {
            Some(half) => autocast_ops(half, || loss.backward()),
            None => loss.backward(),
        };
        let mut values = Vec::new();
        for grad in [
            conv.weight.grad(&grads).map(|g| g.into_data()),
            up.weight.grad(&grads).map(|g| g.into_data()),
        ] {
            let grad = grad.expect("a gradient");
            assert_eq!(grad.dtype, DType::F32, "f32 weights get f32 gradients");
            values.extend(grad.to_vec::<f32>().unwrap());
        }
        (dtype, values)
    };
    let (_, reference) = run(None);
    let (dtype, grads) = run(Some(DType::BF16));
    assert_eq!(
        dtype,
        DType::BF16,
        "the transposed convolution runs in half"
    );
    let err = rel_l2(&grads, &reference);
    println!("conv + conv-transpose per op, bf16: gradient error {err:.2e}");
    assert!(err > 0.0 && err < 2e-2, "{err}");
}

/// Fused attention on a backend without Autodiff (inference): f32 queries meeting half keys and
/// values run in half inside a scope, in f32 outside it.
#[test]
fn fused_attention_promotes_and_runs_in_half_per_op() {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    type I = Autocast<Flex>;
    let _rng = rng_lock();
    let device = Default::default();
    let normal = Distribution::Normal(0.0, 1.0);
    let q = Tensor::<I, 4>::random([1, 2, 4, 8], normal, &device);
    let k = Tensor::<I, 4>::random([1, 2, 4, 8], normal, &device).cast(DType::BF16);
    let v = Tensor::<I, 4>::random([1, 2, 4, 8], normal, &device).cast(DType::BF16);
    let options = AttentionModuleOptions::default();
    let run = || attention(q.clone(), k.clone(), v.clone(), None, None, options);
    assert_eq!(run().dtype(), DType::F32);
    assert_eq!(autocast_ops(DType::BF16, run).dtype(), DType::BF16);
}
