//! 16-mixed toys under op-level autocast follow PyTorch's GradScaler step for step: the same
//! scales, the same skipped steps, the same parameters. The expected figures are PyTorch
//! 2.9's, printed by `python3 xtask/torch/grad_scaler_toy.py` (same toys, same settings).
//!
//! Toy 1: the loss comes from an f32 parameter whose squares overflow f16 (300^2 > 65504); SGD
//! lr 0.1, init_scale 2^120, growth_interval 2, so that the scaled gradients overflow f32 at
//! some scales. Through the half view the forward itself overflows and every step is skipped.
//!
//! Toy 2: a Linear whose weight gradient, computed in f16 in the backward pass as PyTorch does,
//! overflows at the larger scales (a backward in f32 would never skip).

use afterburner_accelerator::precision::GradScalerConfig;
use afterburner_accelerator::{Accelerator, AcceleratorConfig, Autocast, StepOutcome};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

type A = Autodiff<Autocast<Flex>>;

/// One f32 parameter; the output is (p * x)^2.
#[derive(Module, Debug)]
struct Toy<B: Backend> {
    p: Param<Tensor<B, 1>>,
}

impl<B: Backend> Toy<B> {
    fn new(device: &B::Device) -> Self {
        let p = Tensor::from_floats([300.0, -250.0, 200.0, 320.0], device);
        Self {
            p: Param::from_tensor(p),
        }
    }

    fn forward(&self, x: Tensor<B, 1>) -> Tensor<B, 1> {
        self.p.val().mul(x).powf_scalar(2.0)
    }
}

/// One step of the toy; returns the scale it used, whether the optimizer stepped, and p.
fn step(
    acc: &mut Accelerator<A>,
    toy: Toy<A>,
    optim: &mut impl burn::optim::Optimizer<Toy<A>, A>,
) -> (Toy<A>, f64, bool) {
    let x = Tensor::<A, 1>::ones([4], &Default::default());
    let scale = acc.loss_scale().expect("16-mixed has a loss scale");
    let out = acc.forward(&toy, x, |m, x| m.forward(x)).unwrap();
    acc.backward(out.mean(), &toy).unwrap();
    let toy = acc.step(toy, optim, &mut 0.1).unwrap();
    let stepped = match acc.last_step() {
        StepOutcome::Stepped { .. } => true,
        StepOutcome::SkippedOverflow { .. } => false,
        other => panic!("unexpected outcome {other:?}"),
    };
    (toy, scale, stepped)
}

fn accelerator(autocast: &str) -> Accelerator<A> {
    accelerator_from(autocast, 120)
}

fn accelerator_from(autocast: &str, log2_init_scale: i32) -> Accelerator<A> {
    let config = AcceleratorConfig {
        precision: "16-mixed".parse().unwrap(),
        autocast: autocast.parse().unwrap(),
        grad_scaler: GradScalerConfig {
            init_scale: 2f64.powi(log2_init_scale),
            growth_interval: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    Accelerator::new(config, Default::default()).unwrap()
}

fn values(toy: &Toy<A>) -> Vec<f32> {
    toy.p.val().into_data().to_vec().unwrap()
}

#[test]
fn op_level_follows_pytorchs_grad_scaler_step_for_step() {
    // PyTorch's sequence: log2 of the scale each step used, and whether it stepped.
    let pytorch: [(i32, bool); 12] = [
        (120, true),
        (120, true),
        (121, false),
        (120, true),
        (120, true),
        (121, false),
        (120, true),
        (120, true),
        (121, true),
        (121, true),
        (122, false),
        (121, true),
    ];
    let pytorch_p_after_4 = [257.2125, -214.34375, 171.475, 274.36];
    let pytorch_p_after_12 = [189.07481, -157.56235, 126.04989, 201.6798];

    let mut acc = accelerator("op");
    let (mut toy, mut optim) = acc
        .setup(Toy::new(&Default::default()), SgdConfig::new().init())
        .unwrap();
    for (i, (log2_scale, pytorch_stepped)) in pytorch.into_iter().enumerate() {
        let (next, scale, stepped) = step(&mut acc, toy, &mut optim);
        toy = next;
        assert_eq!(scale, 2f64.powi(log2_scale), "scale at step {}", i + 1);
        assert_eq!(stepped, pytorch_stepped, "step {} taken?", i + 1);
        if i + 1 == 4 {
            assert_close(&values(&toy), &pytorch_p_after_4);
        }
    }
    assert_close(&values(&toy), &pytorch_p_after_12);
    assert_eq!(acc.counters().skipped_steps, 3);
    assert_eq!(acc.counters().optimizer_steps, 9);
}

#[test]
fn through_the_half_view_the_forward_overflows_and_every_step_is_skipped() {
    let mut acc = accelerator("view");
    let (mut toy, mut optim) = acc
        .setup(Toy::new(&Default::default()), SgdConfig::new().init())
        .unwrap();
    let start = values(&toy);
    for i in 0..3 {
        let (next, scale, stepped) = step(&mut acc, toy, &mut optim);
        toy = next;
        assert_eq!(scale, 2f64.powi(120 - i), "the scale halves each step");
        assert!(!stepped, "step {} overflows in f16", i + 1);
    }
    assert_eq!(values(&toy), start, "parameters untouched");
}

fn assert_close(ours: &[f32], pytorch: &[f32]) {
    for (a, b) in ours.iter().zip(pytorch) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "ours {ours:?}, PyTorch {pytorch:?}"
        );
    }
}

/// Toy 2's Linear: weight[i][j] = 0.1 (i - j) + 0.05 (Burn's [d_in, d_out] layout).
fn toy_linear() -> Linear<A> {
    let device = Default::default();
    let mut linear = LinearConfig::new(4, 4).init::<A>(&device);
    let w: Vec<f32> = (0..16)
        .map(|k| 0.1 * ((k / 4) as f32 - (k % 4) as f32) + 0.05)
        .collect();
    linear.weight =
        Param::from_tensor(Tensor::<A, 1>::from_floats(&w[..], &device).reshape([4, 4]));
    linear.bias = Some(Param::from_tensor(Tensor::from_floats(
        [0.1, -0.2, 0.3, 0.0],
        &device,
    )));
    linear
}

#[test]
fn a_half_weight_gradient_overflows_where_pytorchs_does() {
    let pytorch: [(i32, bool); 8] = [
        (16, false),
        (15, false),
        (14, true),
        (14, true),
        (15, false),
        (14, true),
        (14, true),
        (15, false),
    ];
    let pytorch_w_after_8 = [
        0.0275, -0.0725, -0.1725, -0.2725, 0.105, 0.005, -0.095, -0.195, 0.1825, 0.0825, -0.0175,
        -0.1175, 0.26, 0.16, 0.06, -0.04,
    ];
    let device = Default::default();
    let x: Vec<f32> = (0..32)
        .map(|k| ((k / 4 + 1) * (k % 4 + 1)) as f32 / 2.0)
        .collect();
    let x = Tensor::<A, 1>::from_floats(&x[..], &device).reshape([8, 4]);
    let mut acc = accelerator_from("op", 16);
    let (mut linear, mut optim) = acc.setup(toy_linear(), SgdConfig::new().init()).unwrap();
    for (i, (log2_scale, pytorch_stepped)) in pytorch.into_iter().enumerate() {
        assert_eq!(
            acc.loss_scale(),
            Some(2f64.powi(log2_scale)),
            "step {}",
            i + 1
        );
        let out = acc
            .forward(&linear, x.clone(), |m, x| m.forward(x))
            .unwrap();
        acc.backward(out.mean(), &linear).unwrap();
        linear = acc.step(linear, &mut optim, &mut 0.01).unwrap();
        let stepped = matches!(acc.last_step(), StepOutcome::Stepped { .. });
        assert_eq!(stepped, pytorch_stepped, "step {} taken?", i + 1);
    }
    let w: Vec<f32> = linear.weight.val().into_data().to_vec().unwrap();
    for (a, b) in w.iter().zip(pytorch_w_after_8) {
        assert!(
            (a - b).abs() <= 1e-6,
            "ours {w:?}, PyTorch {pytorch_w_after_8:?}"
        );
    }
}
