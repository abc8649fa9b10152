// afterburner-precision alone, in a plain Burn loop (no facade), through its PrecisionPlugin:
// the forward pass runs per op (`autocast_ops` on `Autodiff<Autocast<Flex>>`, as
// torch.autocast) or on a half view of an f32 model (any backend), in bf16-mixed or 16-mixed
// with a GradScaler; the loss and the optimizer stay in f32.
// `cargo run -p afterburner-precision --example mixed_precision_loop`.
use afterburner_precision::{Autocast, AutocastMode, PrecisionError, PrecisionPlugin, grads};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Tensor};

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.out.forward(self.act.forward(self.hidden.forward(x)))
    }
}

/// Trains a small regression for `steps` steps under `precision`, the mixed modes per op
/// (`autocast = Op`, on a backend with `Autocast`) or through the half view (`View`); returns
/// (first, last) loss.
fn train<B: AutodiffBackend>(
    precision: &str,
    steps: usize,
    autocast: AutocastMode,
) -> Result<(f32, f32), PrecisionError> {
    let device = Default::default();
    // One value holds the policy: dtypes, per op vs view, the 16-mixed loss scaler.
    let mut plugin =
        PrecisionPlugin::<B>::new(precision.parse()?, autocast, Default::default(), &device)?;
    B::seed(&device, 0);
    let mlp = Mlp {
        hidden: LinearConfig::new(8, 32).init(&device),
        out: LinearConfig::new(32, 1).init(&device),
        act: Relu::new(),
    };
    let mut model = plugin.prepare_model(mlp)?;
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<B, 2>::random([64, 8], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1);
    let (mut first, mut last) = (f32::NAN, f32::NAN);
    for step in 0..steps {
        // (1) The forward pass per op (matmuls in half, reductions in f32, f32 parameters) or
        // on a half view (same parameters, differentiable cast); the output comes back in f32.
        let out = plugin.forward(&model, None, x.clone(), |m, x| m.forward(x));
        // (2) The loss in f32.
        let loss = (out - y.clone()).powi_scalar(2).mean();
        last = loss.clone().into_scalar().elem();
        if step == 0 {
            first = last;
        }
        // (3) fp16: scale the loss; per op, the backward runs under the same scope (Linear's
        // backward in half), and each gradient comes back in its parameter's dtype.
        let raw = plugin.backward(plugin.scale_loss(loss));
        let mut grads = GradientsParams::from_grads(raw, &model);
        grads::to_param_dtypes::<B, _>(&model, &mut grads);
        // (4) Unscale (fp16), skip the step on overflow and back off the scale.
        let summary = plugin.unscale(&model, &mut grads, 1.0, true);
        let overflow = plugin.skips_overflow() && summary.is_some_and(|s| !s.is_finite());
        plugin.update(overflow);
        if overflow {
            continue;
        }
        // (5) Global-norm clipping, which Burn 0.21 lacks, then an ordinary f32 step.
        grads::clip_grad_norm::<B, _>(&model, &mut grads, 1.0);
        model = optim.step(1e-2, model, grads);
    }
    Ok((first, last))
}

fn main() -> Result<(), PrecisionError> {
    for (precision, per_op) in [
        ("32-true", false),
        ("bf16-mixed", false),
        ("16-mixed", false),
        ("bf16-mixed", true),
        ("16-mixed", true),
    ] {
        let (first, last) = match per_op {
            true => train::<Autodiff<Autocast<Flex>>>(precision, 60, AutocastMode::Op)?,
            false => train::<Autodiff<Flex>>(precision, 60, AutocastMode::View)?,
        };
        let how = if per_op { " per op" } else { "" };
        println!("{precision}{how}: loss {first:.4} -> {last:.4}");
        assert!(
            last < first / 4.0,
            "{precision} should learn: {first} -> {last}"
        );
    }
    Ok(())
}
