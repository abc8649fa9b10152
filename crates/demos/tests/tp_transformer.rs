//! The demo transformer under its tensor-parallel plan at tp = 2 and 4 (threads on the CPU):
//! logits, every gradient of the first step and every parameter after 5 AdamW steps (gathered
//! back with `full_model`), equal to one device within 1e-6 relative at 32-bit; each rank keeps
//! 1 / tp of the split layers.

mod common;

use afterburner::checkpoint::{CheckpointPolicy, enable, with_policy};
use afterburner::parallel::tp::{TensorParallel, TensorParallelPlan};
use afterburner::parallel::{LaunchConfig, ParallelError, flat_params, launch, local_devices};
use afterburner_demos::models::Transformer;
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor};
use common::{relative, small_transformer};

type B = Autodiff<Flex>;
const STEPS: usize = 5;
const LR: f64 = 1e-3;

fn loss(logits: Tensor<B, 3>) -> Tensor<B, 1> {
    (logits.clone() * logits).mean()
}

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

fn all_params(model: &Transformer<B>) -> Vec<f32> {
    flat_params::<B, _>(model)
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap()
}

/// `model` with each parameter's value replaced by its gradient in `grads` (zeros where it
/// has none): gradients gathered and compared as a model's parameters are.
fn gradients_as_model(model: &Transformer<B>, grads: &GradientsParams) -> Transformer<B> {
    struct Swap<'a>(&'a GradientsParams);
    impl ModuleMapper<B> for Swap<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            let grad = match self.0.get::<Flex, D>(id) {
                Some(grad) => Tensor::from_inner(grad),
                None => value.zeros_like(),
            };
            Param::from_mapped_value(id, grad, mapper)
        }
    }
    model.clone().map(&mut Swap(grads))
}

/// The first logits and gradients, and the model after `STEPS` steps, on one device.
fn one_device(
    model: Transformer<B>,
    tokens: Tensor<B, 2, Int>,
) -> (Vec<f32>, Vec<f32>, Transformer<B>) {
    let (mut model, mut optim, mut first) = (model, AdamWConfig::new().init(), None);
    for _ in 0..STEPS {
        let logits = model.forward(tokens.clone());
        let logits_values = values(logits.clone());
        let grads = GradientsParams::from_grads(loss(logits).backward(), &model);
        first.get_or_insert_with(|| {
            (
                logits_values,
                all_params(&gradients_as_model(&model, &grads)),
            )
        });
        model = optim.step(LR, model, grads);
    }
    let (logits, grads) = first.unwrap();
    (logits, grads, model)
}

/// One rank after `STEPS` steps: its first logits and gradients (gathered whole), its part of
/// the model, the whole model gathered back, the values its layers sent.
struct Rank {
    logits: Vec<f32>,
    grads: Vec<f32>,
    part: Transformer<B>,
    whole: Transformer<B>,
    sent: u64,
}

fn tensor_parallel(
    model: Transformer<B>,
    tokens: Tensor<B, 2, Int>,
    tp: usize,
    policy: CheckpointPolicy,
) -> Vec<Rank> {
    launch::<Flex, _, _, _>(
        local_devices::<Flex>(tp).unwrap(),
        LaunchConfig {
            timeout: std::time::Duration::from_secs(20),
        },
        move |group| {
            let tp = TensorParallel::new(group);
            let (mut model, mut optim, mut first) = (
                model.clone().parallelize(&tp)?,
                AdamWConfig::new().init(),
                None,
            );
            let mut gathered = 0;
            for _ in 0..STEPS {
                // The same forward as the plain model's: the split layers run their collectives.
                let logits = with_policy(policy, || model.forward(tokens.clone()));
                let logits_values = values(logits.clone());
                let grads = GradientsParams::from_grads(loss(logits).backward(), &model);
                tp.check()?;
                if first.is_none() {
                    // The split gradients gathered as parameters are (not the layers' traffic).
                    let before = tp.values_sent();
                    let whole = tp.full_model(&gradients_as_model(&model, &grads))?;
                    gathered = tp.values_sent() - before;
                    first = Some((logits_values, all_params(&whole)));
                }
                model = optim.step(LR, model, grads);
            }
            let sent = tp.values_sent() - gathered;
            let whole = tp.full_model(&model)?;
            let (logits, grads) = first.unwrap();
            Ok::<_, ParallelError>(Rank {
                logits,
                grads,
                part: model,
                whole,
                sent,
            })
        },
    )
    .unwrap()
}

#[test]
fn the_demo_transformer_at_tp_2_and_4_trains_as_on_one_device() {
    let (model, tokens) = small_transformer::<B>(5);
    let (logits, grads, trained) = one_device(model.clone(), tokens.clone());
    let expected = all_params(&trained);
    for tp in [2, 4] {
        let ranks = tensor_parallel(model.clone(), tokens.clone(), tp, CheckpointPolicy::None);
        for (rank, r) in ranks.iter().enumerate() {
            let error = relative(&r.logits, &logits);
            assert!(error < 1e-6, "tp {tp}: the logits differ by {error:e}");
            let error = relative(&r.grads, &grads);
            let params_error = relative(&all_params(&r.whole), &expected);
            println!(
                "tp {tp}, rank {rank}: first gradients {error:e}, parameters after {STEPS} AdamW steps {params_error:e} from one device"
            );
            assert!(
                error < 1e-6,
                "tp {tp}, rank {rank}: the first gradients differ by {error:e} (relative)"
            );
            let error = relative(&all_params(&r.whole), &expected);
            assert!(
                error < 1e-6,
                "tp {tp}, rank {rank}: the parameters differ by {error:e} (relative)"
            );
            // The gathered model runs whole: its logits are the plain model's.
            let whole = values(r.whole.forward(tokens.clone()));
            let plain = values(trained.forward(tokens.clone()));
            let error = relative(&whole, &plain);
            assert!(
                error < 1e-5,
                "tp {tp}: the gathered model's logits differ by {error:e}"
            );
        }
        // Each rank keeps 1 / tp of the split layers' weights and column biases; the row
        // layers' biases and the rest stay whole.
        let d = 16;
        let column = 2 * (d * 3 * d + 3 * d + d * 4 * d + 4 * d); // qkv and fc1, 2 blocks
        let row_weights = 2 * (d * d + 4 * d * d); // proj and fc2
        let replicated = model.num_params() - column - row_weights;
        // Traffic: per block, two all-reduces of the [batch * seq, d] activations forward (the
        // attention's and the MLP's outputs) and two backward (their inputs' gradients).
        let per_step = 2 * 4 * (2 * 6 * d) as u64;
        for (rank, r) in ranks.iter().enumerate() {
            assert_eq!(r.sent, STEPS as u64 * per_step, "tp {tp}, rank {rank}");
            let expected = replicated + (column + row_weights) / tp;
            assert_eq!(r.part.num_params(), expected, "tp {tp}, rank {rank}");
        }
    }
}

#[test]
fn checkpointed_tp_blocks_train_bitwise_as_kept_ones() {
    enable::<B>();
    let (model, tokens) = small_transformer::<B>(9);
    let kept = tensor_parallel(model.clone(), tokens.clone(), 2, CheckpointPolicy::None);
    let recomputed = tensor_parallel(model, tokens, 2, CheckpointPolicy::All);
    for (a, b) in kept.iter().zip(&recomputed) {
        assert_eq!(all_params(&a.part), all_params(&b.part));
        // The recompute ran each block's forward all-reduces again.
        assert!(b.sent > a.sent, "{} vs {}", b.sent, a.sent);
    }
}

#[test]
fn gpt2s_blocks_split_at_tp_4_to_their_share() {
    // One GPT-2-small block (d 768, 12 heads) over bytes: the plan gives each of 4 ranks a
    // quarter of qkv, proj, fc1 and fc2, and the rest whole.
    let device = Default::default();
    let model = afterburner_demos::models::TransformerConfig::gpt2()
        .with_n_layers(1)
        .with_vocab_size(256)
        .init::<B>(&device);
    let _ = model.forward(Tensor::zeros([1, 4], &device));
    let d = 768;
    let split = d * 3 * d + 3 * d + d * d + d * 4 * d + 4 * d + 4 * d * d;
    let total = model.num_params();
    let held = launch::<Flex, _, _, _>(
        local_devices::<Flex>(4).unwrap(),
        LaunchConfig::default(),
        move |group| {
            let tp = TensorParallel::new(group);
            Ok::<_, ParallelError>(model.clone().parallelize(&tp)?.num_params())
        },
    )
    .unwrap();
    assert_eq!(held, vec![total - split * 3 / 4; 4]);
}
