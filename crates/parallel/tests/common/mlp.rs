//! The small MLP, data and single-device reference the DDP and MPI tests share.

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use super::{B, params, rows};

pub const STEPS: usize = 5;
pub const BATCH: usize = 8; // per worker; the single-device run uses 2 x BATCH

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    act: Relu,
    fc2: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub fn new(seed: u64, device: &B::Device) -> Self {
        B::seed(device, seed);
        let m = Self {
            fc1: LinearConfig::new(6, 16).init(device),
            act: Relu::new(),
            fc2: LinearConfig::new(16, 3).init(device),
        };
        let _ = params(&m); // initialise lazy parameters now
        m
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2.forward(self.act.forward(self.fc1.forward(x)))
    }
}

/// Fixed data: per step, 2 x BATCH rows of 6 features and 3 targets.
pub fn data() -> Vec<(Vec<f32>, Vec<f32>)> {
    let device = Default::default();
    Flex::seed(&device, 99);
    (0..STEPS)
        .map(|_| {
            let x =
                Tensor::<Flex, 2>::random([2 * BATCH, 6], Distribution::Normal(0.0, 1.0), &device);
            let y =
                Tensor::<Flex, 2>::random([2 * BATCH, 3], Distribution::Normal(0.0, 1.0), &device);
            (
                x.into_data().to_vec().unwrap(),
                y.into_data().to_vec().unwrap(),
            )
        })
        .collect()
}

/// Mean squared error of `model` on rows `from..from + n` of a step's data, times `scale`.
pub fn loss(
    model: &Mlp<B>,
    step: &(Vec<f32>, Vec<f32>),
    from: usize,
    n: usize,
    scale: f64,
) -> Tensor<B, 1> {
    let out = model.forward(rows(&step.0, 6, from, n));
    (out - rows(&step.1, 3, from, n))
        .powi_scalar(2)
        .mean()
        .mul_scalar(scale)
}

/// The reference: one device trained on the whole 2 x BATCH rows of every step.
pub fn single_device() -> Vec<f32> {
    let mut model = Mlp::<B>::new(1, &Default::default());
    let mut optim = SgdConfig::new().init();
    for step in &data() {
        let grads =
            GradientsParams::from_grads(loss(&model, step, 0, 2 * BATCH, 1.0).backward(), &model);
        model = optim.step(0.1, model, grads);
    }
    params(&model)
}
