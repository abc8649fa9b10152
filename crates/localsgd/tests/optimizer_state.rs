//! `LocalSgd` with `average_optimizer_state` in a plain Burn loop (no facade): the strategy
//! sees the optimizer after each step, so right after each parameter average both ranks hold
//! the same AdamW moments; between averages, and without the flag, they differ.

use afterburner_localsgd::{LocalSgd, LocalSgdConfig};
use afterburner_parallel::{
    LaunchConfig, ParallelStrategy, SharedGroup, flat_params, launch, param_ids,
};
use burn::backend::{Autodiff, Flex};
use burn::module::ParamId;
use burn::nn::{Linear, LinearConfig};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;

type B = Autodiff<Flex>;
type Optim = OptimizerAdaptor<AdamW, Linear<B>, B>;

const K: u64 = 3;
const STEPS: u64 = 7;

/// AdamW's first and second moments of every parameter of `model`, in parameter order.
fn moments(model: &Linear<B>, optim: &Optim) -> Vec<f32> {
    let mut record = optim.to_record();
    let mut out = Vec::new();
    for (position, id) in param_ids(model).into_iter().enumerate() {
        let state = record
            .remove(&ParamId::deserialize(&id))
            .expect("every parameter has a state after a step");
        let momentum = match position {
            0 => {
                let m = state.into_state::<2>().momentum;
                [m.moment_1.flatten::<1>(0, 1), m.moment_2.flatten::<1>(0, 1)]
            }
            _ => {
                let m = state.into_state::<1>().momentum;
                [m.moment_1, m.moment_2]
            }
        };
        for tensor in momentum {
            out.extend(tensor.into_data().to_vec::<f32>().unwrap());
        }
    }
    out
}

/// Two ranks of Local SGD (average every K steps) over AdamW, each on its own data; per
/// rank, per step: (parameters, AdamW moments).
fn run(average_optimizer_state: bool) -> Vec<Vec<(Vec<f32>, Vec<f32>)>> {
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
    let config = LocalSgdConfig {
        local_sgd_steps: K as usize,
        average_optimizer_state,
    };
    launch::<Flex, _, String, _>(vec![device; 2], LaunchConfig::default(), move |group| {
        let rank = afterburner_parallel::ProcessGroup::<Flex>::rank(&group);
        let mut local = LocalSgd::<B, _>::new(SharedGroup::new(group), config.clone())
            .map_err(|e| e.to_string())?;
        let mut model = local.setup(model.clone()).map_err(|e| e.to_string())?;
        let mut optim: Optim = AdamWConfig::new().init();
        let mut trajectory = Vec::new();
        for step in 1..=STEPS {
            // Each rank its own input, so the replicas drift apart between averages.
            let x = Tensor::<B, 2>::from_floats(
                [[1.0 + rank as f32, -0.5 * step as f32, 0.25]],
                &Default::default(),
            );
            let loss = model.forward(x).powi_scalar(2).sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model, grads);
            model = local
                .after_optimizer_step(model, &mut optim, step)
                .map_err(|e| e.to_string())?;
            let params = flat_params::<B, _>(&model).unwrap();
            let params = params.into_data().to_vec::<f32>().unwrap();
            trajectory.push((params, moments(&model, &optim)));
        }
        Ok(trajectory)
    })
    .unwrap()
}

#[test]
fn adamw_moments_are_equal_on_both_ranks_right_after_each_average() {
    let ranks = run(true);
    for step in 1..=STEPS {
        let (a, b) = (&ranks[0][step as usize - 1], &ranks[1][step as usize - 1]);
        if step % K == 0 {
            assert_eq!(a.0, b.0, "parameters after the average at step {step}");
            assert_eq!(a.1, b.1, "AdamW moments after the average at step {step}");
        } else {
            assert_ne!(
                a.1, b.1,
                "moments at step {step} (between averages) should differ"
            );
        }
    }
}

#[test]
fn without_the_flag_each_rank_keeps_its_own_moments() {
    let ranks = run(false);
    let k = K as usize - 1;
    assert_eq!(ranks[0][k].0, ranks[1][k].0, "parameters are averaged");
    assert_ne!(ranks[0][k].1, ranks[1][k].1, "moments are not");
}
