//! `Autodiff<Autocast<Flex>>` computes what `Autodiff<Flex>` computes: same losses and gradients
//! for models built from Burn's own layers, whose Linears it runs on a 2-D view.

use afterburner_precision::Autocast;
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};

type Plain = Autodiff<Flex>;
type Wrapped = Autodiff<Autocast<Flex>>;

/// Serialises the tests: the backend's random generator is seeded globally.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every parameter's gradient, in visiting order, as f32 values.
fn gradients<B: AutodiffBackend, M: Module<B>>(model: &M, grads: &B::Gradients) -> Vec<Vec<f32>> {
    struct Collect<'a, B: AutodiffBackend>(&'a B::Gradients, Vec<Vec<f32>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param
                .val()
                .grad(self.0)
                .expect("every parameter has a gradient");
            self.1
                .push(grad.into_data().convert::<f32>().to_vec().unwrap());
        }
    }
    let mut collect = Collect::<B>(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// Largest `|a - b| / max(|b|, 1e-3)` over every value; infinite when a value is not finite.
fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "same number of tensors");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "same tensor sizes");
            x.iter().zip(y)
        })
        .map(|(x, y)| {
            if x.is_finite() && y.is_finite() {
                (x - y).abs() / y.abs().max(1e-3)
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0, f32::max)
}

/// A 2-block encoder from Burn's `TransformerEncoder`, a loss and its gradients.
fn encoder_step<B: AutodiffBackend>() -> (f32, Vec<Vec<f32>>) {
    let device = Default::default();
    B::seed(&device, 7);
    let encoder: TransformerEncoder<B> = TransformerEncoderConfig::new(16, 32, 2, 2)
        .with_dropout(0.0)
        .init(&device);
    let input = Tensor::<B, 3>::random([4, 6, 16], Distribution::Normal(0.0, 1.0), &device);
    let loss = encoder
        .forward(TransformerEncoderInput::new(input))
        .powi_scalar(2)
        .mean();
    let value = loss.clone().into_scalar().elem::<f32>();
    let grads = loss.backward();
    (value, gradients(&encoder, &grads))
}

#[test]
fn transformer_encoder_has_the_same_loss_and_gradients() {
    let _rng = RNG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (plain_loss, plain) = encoder_step::<Plain>();
    let (wrapped_loss, wrapped) = encoder_step::<Wrapped>();
    let loss_rel = (plain_loss - wrapped_loss).abs() / plain_loss.abs();
    let grad_rel = max_rel(&wrapped, &plain);
    println!(
        "loss {plain_loss} vs {wrapped_loss} (rel {loss_rel:.1e}); gradients max rel {grad_rel:.1e}"
    );
    assert!(
        plain_loss.is_finite() && plain_loss > 0.0,
        "the loss is real: {plain_loss}"
    );
    assert!(loss_rel <= 1e-5, "loss differs by {loss_rel:e}");
    assert!(grad_rel <= 1e-4, "gradients differ by {grad_rel:e}");
    assert!(
        plain.iter().flatten().any(|g| *g != 0.0),
        "gradients are not all zero"
    );
}

/// A Linear with and without bias on 1-, 2-, 3- and 4-D inputs: output, input gradient and
/// parameter gradients.
fn linear_step<B: AutodiffBackend>(dims: &[usize], bias: bool) -> Vec<Vec<f32>> {
    let device = Default::default();
    B::seed(&device, 11);
    let linear: Linear<B> = LinearConfig::new(5, 3).with_bias(bias).init(&device);
    let mut shape = dims.to_vec();
    shape.push(5);
    let input = Tensor::<B, 1>::random(
        [shape.iter().product::<usize>()],
        Distribution::Default,
        &device,
    )
    .require_grad();
    let (output, input_grad) = match shape.len() {
        1 => run(&linear, input.clone()),
        2 => run(&linear, input.clone().reshape([shape[0], shape[1]])),
        3 => run(
            &linear,
            input.clone().reshape([shape[0], shape[1], shape[2]]),
        ),
        _ => run(
            &linear,
            input
                .clone()
                .reshape([shape[0], shape[1], shape[2], shape[3]]),
        ),
    };
    let grads = input_grad.backward();
    let mut values = vec![
        output,
        input.grad(&grads).unwrap().into_data().to_vec().unwrap(),
    ];
    values.extend(gradients(&linear, &grads));
    values
}

/// The Linear's output values and a scalar loss of it (weighted so every output counts).
fn run<B: Backend, const D: usize>(
    linear: &Linear<B>,
    x: Tensor<B, D>,
) -> (Vec<f32>, Tensor<B, 1>) {
    let output = linear.forward(x);
    let weights =
        Tensor::<B, 1, Int>::arange(0..output.shape().num_elements() as i64, &output.device())
            .float()
            .reshape(output.shape());
    let values = output.to_data().convert::<f32>().to_vec().unwrap();
    (values, (output * weights).sum())
}

#[test]
fn linear_matches_on_every_rank_with_and_without_bias() {
    let _rng = RNG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for dims in [&[][..], &[4], &[2, 3], &[2, 3, 2]] {
        for bias in [true, false] {
            let plain = linear_step::<Plain>(dims, bias);
            let wrapped = linear_step::<Wrapped>(dims, bias);
            let rel = max_rel(&wrapped, &plain);
            assert!(
                rel <= 1e-5,
                "input {dims:?}x5, bias {bias}: differs by {rel:e}"
            );
        }
    }
}

#[test]
fn names_the_inner_backend() {
    let name = <Autocast<Flex> as Backend>::name(&Default::default());
    assert!(
        name.starts_with("autocast<") && name.contains("flex"),
        "{name}"
    );
}

/// `f(x, y, w)` with `x` f32, `y` and `w` in `half`: mixed-dtype add, mul, matmul, cat, a
/// comparison and `mask_where`; the loss and the f32 gradient of `x`.
fn mixed_step(half: burn::tensor::DType) -> (burn::tensor::DType, f32, Vec<f32>) {
    let device = Default::default();
    let x = Tensor::<Wrapped, 2>::from_floats([[0.5, -1.25], [2.0, 0.75]], &device).require_grad();
    let y0 = Tensor::<Wrapped, 2>::from_floats([[1.5, 0.25], [-0.5, 3.0]], &device).require_grad();
    let y = y0.clone().cast(half);
    let w = Tensor::<Wrapped, 2>::from_floats([[0.25, 1.0], [-2.0, 0.5]], &device).cast(half);
    let z = (x.clone() + y.clone()) * y.clone();
    // Activations of a half tensor meeting f32: their backward ops get an f32 gradient.
    let z = z + burn::tensor::activation::relu(y.clone()) * x.clone();
    let z = z + burn::tensor::activation::sigmoid(y.clone());
    let z = z.matmul(w);
    let z = Tensor::cat(vec![z, y.clone()], 0);
    let keep = z.clone().greater(Tensor::cat(vec![y.clone(), y], 0));
    let z = z.clone().mask_where(keep, z * 2.0);
    let dtype = z.dtype();
    let loss = z.sum();
    let value = loss.clone().into_scalar().elem::<f32>();
    let grads = loss.backward();
    let gx = x.grad(&grads).expect("x has a gradient");
    assert_eq!(
        gx.dtype(),
        burn::tensor::DType::F32,
        "the f32 input's gradient is f32"
    );
    let gy = y0.grad(&grads).expect("y's f32 source has a gradient");
    let mut g: Vec<f32> = gx.into_data().to_vec().unwrap();
    g.extend(gy.into_data().convert::<f32>().to_vec::<f32>().unwrap());
    (dtype, value, g)
}

/// Ops on an f32 and a half tensor run in f32 (PyTorch's promotion), where the inner backend
/// alone rejects the mix, in the forward and in the backward (activation backward ops get an
/// f32 gradient for a half output); the values are those of the all-f32 computation on the
/// same (exactly representable) numbers, up to the half sigmoid's rounding.
#[test]
fn mixed_float_dtypes_promote_to_the_wider_one() {
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let (dtype_f32, reference, grad_ref) = mixed_step(burn::tensor::DType::F32);
    for half in [burn::tensor::DType::BF16, burn::tensor::DType::F16] {
        let (dtype, loss, grad) = mixed_step(half);
        assert_eq!(dtype, dtype_f32, "{half:?}: the result is f32");
        // The sigmoid runs in the half dtype, so values agree to its precision.
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-2 * b.abs().max(1.0);
        assert!(
            close(loss, reference),
            "{half:?}: loss {loss} vs f32 {reference}"
        );
        assert_eq!(grad.len(), grad_ref.len());
        for (g, r) in grad.iter().zip(&grad_ref) {
            assert!(
                close(*g, *r),
                "{half:?}: gradient {grad:?} vs f32 {grad_ref:?}"
            );
        }
    }
}
