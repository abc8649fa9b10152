//! `autocast = "op" | "view" | "auto"` through the Accelerator on `Autodiff<Autocast<Flex>>`:
//! op-level autocast is closer to f32 than the half view on Burn's `TransformerEncoder`, "auto"
//! picks it on this backend, and "op" on a backend without `Autocast` is a named error. Per op,
//! the backward runs under the forward's scope, checkpointed blocks recompute under it (same
//! gradients with checkpointing on and off), and FSDP with checkpointing trains as DDP.

mod common;

use afterburner_accelerator::{Accelerator, AcceleratorConfig, Autocast, AutocastMode};
use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Tensor};
use common::rel_l2;

type B = Autodiff<Autocast<Flex>>;

fn accelerator<Bk: burn::tensor::backend::AutodiffBackend>(
    precision: &str,
    autocast: &str,
) -> Result<Accelerator<Bk>, afterburner_accelerator::AccelerateError> {
    let config = AcceleratorConfig {
        precision: precision.parse().unwrap(),
        autocast: autocast.parse()?,
        ..Default::default()
    };
    Accelerator::new(config, Default::default())
}

#[test]
fn op_level_is_closer_to_f32_than_the_view_and_auto_picks_it() {
    let _rng = common::rng_lock();
    let device = Default::default();
    B::seed(&device, 5);
    let encoder = TransformerEncoderConfig::new(64, 128, 4, 2)
        .with_dropout(0.0)
        .init::<B>(&device);
    let x = Tensor::<B, 3>::random([8, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let reference: Vec<f32> = encoder
        .forward(TransformerEncoderInput::new(x.clone()))
        .into_data()
        .to_vec()
        .unwrap();
    for precision in ["bf16-mixed", "16-mixed"] {
        let mut errors = Vec::new();
        for mode in ["view", "op", "auto"] {
            let acc = accelerator::<B>(precision, mode).unwrap();
            let out = acc
                .forward(&encoder, x.clone(), |m, x| {
                    m.forward(TransformerEncoderInput::new(x))
                })
                .unwrap();
            errors.push(rel_l2(
                &out.into_data().to_vec::<f32>().unwrap(),
                &reference,
            ));
        }
        println!(
            "{precision}: output error vs f32, view {:.2e}, op {:.2e}",
            errors[0], errors[1]
        );
        assert!(
            errors[1] > 0.0 && errors[1] * 2.0 < errors[0],
            "{precision}: {errors:?}"
        );
        assert_eq!(
            errors[2], errors[1],
            "{precision}: auto is op on Autocast<Flex>"
        );
    }
}

#[test]
fn op_needs_the_autocast_backend_and_bad_modes_are_named() {
    let _rng = common::rng_lock();
    let err = accelerator::<Autodiff<Flex>>("bf16-mixed", "op")
        .err()
        .expect("op on plain flex is refused")
        .to_string();
    assert!(
        err.contains("autocast") && err.contains("Autocast<B>"),
        "{err}"
    );
    assert!(accelerator::<Autodiff<Flex>>("bf16-mixed", "auto").is_ok());
    let err = "per-op".parse::<AutocastMode>().unwrap_err().to_string();
    assert!(
        err.contains("per-op") && err.contains("auto, op, view"),
        "{err}"
    );
}

/// Every parameter's gradient (in f32) and its dtype under `bf16-mixed` per op, with `policy`
/// checkpointing, the backward pass run by `backward` (the Accelerator's, or a plain
/// `loss.backward()`).
fn vit_grads<B: AutodiffBackend>(
    policy: afterburner_accelerator::CheckpointPolicy,
    backward: impl FnOnce(&Accelerator<B>, Tensor<B, 1>) -> <B as AutodiffBackend>::Gradients,
) -> (Vec<f32>, Vec<DType>) {
    let device = B::Device::default();
    let config = AcceleratorConfig {
        precision: "bf16-mixed".parse().unwrap(),
        autocast: AutocastMode::Op,
        gradient_checkpointing: policy,
        ..Default::default()
    };
    let acc = Accelerator::<B>::new(config, device.clone()).unwrap();
    B::seed(&device, 11);
    let model = acc
        .setup_model(common::tiny_vit().init::<B>(&device))
        .unwrap();
    let digits = afterburner_demos::digits::load().unwrap();
    let batch = digits
        .batcher()
        .batch(digits.items()[..16].to_vec(), &device);
    let logits = acc
        .forward(&model, batch.images, |m, x| m.forward(x))
        .unwrap();
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, batch.labels);
    let grads = backward(&acc, loss);
    struct Collect<'a, B: AutodiffBackend>(&'a B::Gradients, Vec<f32>, Vec<DType>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.0).expect("a gradient");
            self.2.push(grad.dtype());
            let grad = grad.cast(DType::F32);
            self.1.extend(grad.into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut collect = Collect::<B>(&grads, Vec::new(), Vec::new());
    model.visit(&mut collect);
    (collect.1, collect.2)
}

#[test]
fn checkpointed_blocks_recompute_under_the_forwards_autocast_policy() {
    use afterburner_accelerator::CheckpointPolicy::{All, None as Off};
    let _rng = common::rng_lock();
    let off = vit_grads::<B>(Off, |acc, loss| acc.raw_backward(loss));
    let on = vit_grads::<B>(All, |acc, loss| acc.raw_backward(loss));
    // Before the recompute ran under the forward's scope (its helper thread had none), the
    // two differed by 3.0e-3: the recomputed blocks ran their matmuls in f32.
    assert_eq!(
        on.0, off.0,
        "the same gradients with checkpointing on and off"
    );
    for dtypes in [&on.1, &off.1] {
        assert!(dtypes.iter().all(|d| *d == DType::F32), "{dtypes:?}");
    }
    // The backward pass runs in the scope too. Outside it the gradients differ, and the
    // head's bias gets the bf16 gradient of its half output.
    let plain = vit_grads::<B>(Off, |_, loss| loss.backward());
    assert!(plain.1.contains(&DType::BF16), "{:?}", plain.1);
    let err = rel_l2(&plain.0, &off.0);
    println!(
        "bf16-mixed per op: gradients with the backward outside the scope differ by {err:.2e}"
    );
    assert!(err > 1e-4, "{err}");
}

/// The full parameters after one epoch of 96 digits of the tiny ViT under bf16-mixed per op,
/// on `world` in-process ranks with `strategy`, checkpointing every block when `checkpoint`.
fn train_per_op<B: AutodiffBackend>(
    strategy: &'static str,
    checkpoint: bool,
    world: usize,
) -> Vec<f32> {
    let device = Default::default();
    B::seed(&device, 8);
    let initial = common::tiny_vit().init::<B>(&device);
    afterburner_accelerator::precision::materialize_params(&initial);
    let config = AcceleratorConfig {
        precision: "bf16-mixed".parse().unwrap(),
        autocast: AutocastMode::Op,
        gradient_checkpointing: match checkpoint {
            true => afterburner_accelerator::CheckpointPolicy::All,
            false => afterburner_accelerator::CheckpointPolicy::None,
        },
        gradient_accumulation_steps: 2,
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: match strategy.parse().unwrap() {
                afterburner_accelerator::StrategyConfig::Fsdp(_) => {
                    afterburner_accelerator::StrategyConfig::Fsdp(
                        afterburner_accelerator::FsdpConfig {
                            auto_wrap_policy: "TransformerEncoderLayer".parse().unwrap(),
                            ..Default::default()
                        },
                    )
                }
                other => other,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let ranks = Accelerator::<B>::launch(config, vec![device.clone(); world], move |mut acc| {
        let (mut model, mut optim) =
            acc.setup(initial.clone(), burn::optim::AdamWConfig::new().init())?;
        let items = afterburner_demos::digits::load()?.take(96);
        let loader = acc.dataloader(items, common::BATCHER, 8)?;
        let loss = CrossEntropyLossConfig::new().init(&device);
        for batch in loader.epoch(0) {
            let logits = acc.forward(&model, batch.images.clone(), |m, x| m.forward(x))?;
            acc.backward(loss.forward(logits, batch.labels.clone()), &model)?;
            model = acc.step(model, &mut optim, &mut 1e-3)?;
        }
        let full = acc.full_model(&model)?;
        let values = values_of(&full);
        assert!(
            values.1.iter().all(|d| *d == DType::F32),
            "f32 master parameters"
        );
        Ok(values.0)
    })
    .unwrap();
    ranks.into_iter().next().unwrap()
}

#[test]
fn fsdp_with_checkpointing_equals_ddp_under_per_op_autocast() {
    let _rng = common::rng_lock();
    let ddp = train_per_op::<B>("ddp", false, 2);
    let fsdp = train_per_op::<B>("fsdp", true, 2);
    let err = common::max_rel(&fsdp, &ddp, 1e-3);
    println!("bf16-mixed per op: fsdp x2 + checkpointing vs ddp x2, max relative {err:e}");
    assert!(err <= 1e-5, "{err}");
    B::seed(&Default::default(), 8);
    let start = values_of(&common::tiny_vit().init::<B>(&Default::default())).0;
    assert_ne!(ddp, start, "training moved the parameters");
}

/// Every float parameter's values (in f32) and dtype, in visit order.
fn values_of<B: Backend, M: Module<B>>(model: &M) -> (Vec<f32>, Vec<DType>) {
    struct Values(Vec<f32>, Vec<DType>);
    impl<B: Backend> ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            self.1.push(value.dtype());
            self.0
                .extend(value.cast(DType::F32).into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut values = Values(Vec::new(), Vec::new());
    model.visit(&mut values);
    (values.0, values.1)
}

/// The same stack with the casts recorded by Autodiff (`Autocast<Autodiff<Flex>>`): per op
/// through the Accelerator, checkpointed blocks recompute under the forward's policy (same
/// gradients on and off, every one f32, close to the casts below Autodiff), and FSDP with
/// checkpointing trains as DDP (both find Burn's `Autodiff` underneath).
#[test]
fn recorded_casts_checkpoint_and_shard_as_casts_below_autodiff() {
    use afterburner_accelerator::CheckpointPolicy::{All, None as Off};
    type Recorded = Autocast<Autodiff<Flex>>;
    let _rng = common::rng_lock();
    let off = vit_grads::<Recorded>(Off, |acc, loss| acc.raw_backward(loss));
    let on = vit_grads::<Recorded>(All, |acc, loss| acc.raw_backward(loss));
    assert_eq!(
        on.0, off.0,
        "the same gradients with checkpointing on and off"
    );
    assert!(off.1.iter().all(|d| *d == DType::F32), "{:?}", off.1);
    let below = vit_grads::<B>(Off, |acc, loss| acc.raw_backward(loss));
    let err = rel_l2(&off.0, &below.0);
    println!("bf16-mixed per op: recorded casts vs casts below Autodiff, gradients {err:.2e}");
    assert!(err < 2e-2, "{err}");
    let ddp = train_per_op::<Recorded>("ddp", false, 2);
    let fsdp = train_per_op::<Recorded>("fsdp", true, 2);
    let err = common::max_rel(&fsdp, &ddp, 1e-3);
    println!("recorded casts: fsdp x2 + checkpointing vs ddp x2, max relative {err:e}");
    assert!(err <= 1e-5, "{err}");
}
