//! The demo transformer under tensor parallelism at bf16-mixed (per op, on
//! `Autodiff<Autocast<Flex>>`): TP's difference from one device at bf16-mixed is no larger
//! than bf16-mixed's own difference from 32-true on one device, both measured here, for the
//! first logits and the weights after 5 AdamW steps. The row-parallel sums are reduced in f32.

mod common;

use afterburner::parallel::tp::{TensorParallel, TensorParallelPlan};
use afterburner::parallel::{LaunchConfig, ParallelError, launch, local_devices};
use afterburner::precision::{Autocast, autocast_ops, grads::to_param_dtypes};
use afterburner_demos::models::Transformer;
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{DType, Int, Tensor};
use common::{norm_relative, small_transformer};

type I = Autocast<Flex>;
type B = Autodiff<I>;
const STEPS: usize = 5;
const LR: f64 = 1e-3;

/// The first logits and, after `STEPS` steps, block 0's fc1 and fc2 weights (whole).
type Run = (Vec<f32>, Vec<f32>, Vec<f32>);

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().to_vec().unwrap()
}

/// One training step's gradients of the mean square of `logits`, in the parameters' dtypes.
fn gradients<M: AutodiffModule<B>>(logits: Tensor<B, 3>, model: &M) -> GradientsParams {
    let logits = logits.cast(DType::F32);
    let mut grads = GradientsParams::from_grads((logits.clone() * logits).mean().backward(), model);
    to_param_dtypes::<B, M>(model, &mut grads);
    grads
}

/// One device, every op in `half` (bf16) or in f32 (`DType::F32`).
fn one_device(model: Transformer<B>, tokens: Tensor<B, 2, Int>, half: DType) -> Run {
    autocast_ops(half, || {
        let (mut model, mut optim, mut first) = (model, AdamWConfig::new().init(), None);
        for _ in 0..STEPS {
            let logits = model.forward(tokens.clone());
            first.get_or_insert_with(|| values(logits.clone()));
            let grads = gradients(logits, &model);
            model = optim.step(LR, model, grads);
        }
        (first.unwrap(), values(fc(&model, 1)), values(fc(&model, 2)))
    })
}

/// Block 0's fc1 or fc2 weight.
fn fc(model: &Transformer<B>, which: usize) -> Tensor<B, 2> {
    match which {
        1 => model.blocks[0].block.fc1.linear.weight.val(),
        _ => model.blocks[0].block.fc2.linear.weight.val(),
    }
}

/// `tp` ranks, every op in bf16.
fn tensor_parallel(model: Transformer<B>, tokens: Tensor<B, 2, Int>, tp: usize) -> Run {
    let ranks = launch::<I, _, _, _>(
        local_devices::<I>(tp).unwrap(),
        LaunchConfig::default(),
        move |group| {
            autocast_ops(DType::BF16, || {
                let tp = TensorParallel::new(group);
                let (mut model, mut optim, mut first) = (
                    model.clone().parallelize(&tp)?,
                    AdamWConfig::new().init(),
                    None,
                );
                for _ in 0..STEPS {
                    let logits = model.forward(tokens.clone());
                    first.get_or_insert_with(|| values(logits.clone()));
                    let grads = gradients(logits, &model);
                    tp.check()?;
                    model = optim.step(LR, model, grads);
                }
                let whole = tp.full_model(&model)?;
                Ok::<_, ParallelError>((first.unwrap(), fc(&whole, 1), fc(&whole, 2)))
            })
        },
    )
    .unwrap();
    let (logits, fc1, fc2) = ranks[0].clone();
    (logits, values(fc1), values(fc2))
}

#[test]
fn tp_at_bf16_mixed_differs_from_one_device_no_more_than_bf16_from_f32() {
    let (model, tokens) = small_transformer::<B>(5);
    let full = one_device(model.clone(), tokens.clone(), DType::F32);
    let half = one_device(model.clone(), tokens.clone(), DType::BF16);
    let own = [
        norm_relative(&half.0, &full.0),
        norm_relative(&half.1, &full.1),
        norm_relative(&half.2, &full.2),
    ];
    assert!(
        own.iter().all(|e| *e > 0.0),
        "bf16 changed nothing: {own:?}"
    );
    for tp in [2, 4] {
        let split = tensor_parallel(model.clone(), tokens.clone(), tp);
        let of_tp = [
            norm_relative(&split.0, &half.0),
            norm_relative(&split.1, &half.1),
            norm_relative(&split.2, &half.2),
        ];
        eprintln!("tp {tp}: TP vs one device at bf16 {of_tp:?}, bf16 vs 32-true {own:?}");
        for ((what, tp_error), own_error) in ["logits", "fc1", "fc2"].iter().zip(of_tp).zip(own) {
            assert!(
                tp_error <= own_error,
                "tp {tp}, {what}: TP differs from one device by {tp_error:e} at bf16-mixed, \
                 more than bf16-mixed from 32-true ({own_error:e})"
            );
        }
    }
}
