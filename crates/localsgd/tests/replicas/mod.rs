//! What the fault-tolerance tests share: a small model, each replica's deterministic inner
//! step, the DiLoCo settings.

#![allow(dead_code)] // each test file uses its own part

use afterburner_localsgd::DiLoCoConfig;
use afterburner_parallel::{StrategyState, flat_params, with_flat_params};
use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;

/// The backend.
pub type B = Autodiff<Flex>;
/// The model every replica trains.
pub type Model = Linear<B>;

/// Inner steps per round.
pub const H: u64 = 3;
/// Rounds per run.
pub const ROUNDS: u64 = 5;

/// A fixed model (the backend's RNG is shared by tests running in parallel).
pub fn model(seed: usize) -> Model {
    let device = Default::default();
    let linear: Model = LinearConfig::new(4, 2).init(&device);
    let values: Vec<f32> = (0..10)
        .map(|i| 0.2 - 0.05 * i as f32 + 0.01 * seed as f32)
        .collect();
    with_flat_params::<B, _>(linear, Tensor::from_floats(values.as_slice(), &device))
}

/// One AdamW step of replica `replica` at `step` on its own deterministic batch.
pub fn inner_step<O: Optimizer<Model, B>>(
    model: Model,
    optim: &mut O,
    replica: usize,
    step: u64,
) -> Model {
    let device = Default::default();
    let x: Vec<f32> = (0..8)
        .map(|i| ((replica * 31 + step as usize * 7 + i) as f32 * 0.37).sin())
        .collect();
    let x = Tensor::<B, 1>::from_floats(x.as_slice(), &device).reshape([2, 4]);
    let target = x.clone().sum_dim(1).repeat_dim(1, 2).mul_scalar(0.5);
    let loss = (model.forward(x) - target).powi_scalar(2).mean();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    optim.step(1e-2, model, grads)
}

/// The model's parameters, flat.
pub fn values(model: &Model) -> Vec<f32> {
    flat_params::<B, _>(model)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// DiLoCo's global copy in a state.
pub fn global(state: &StrategyState) -> Vec<f32> {
    state.tensor("global").unwrap().to_vec()
}

/// DiLoCo with 3 inner steps per round and Nesterov outer momentum.
pub fn config() -> DiLoCoConfig {
    DiLoCoConfig {
        sync_every: H as usize,
        outer_lr: 0.7,
        outer_momentum: 0.9,
        ..Default::default()
    }
}
