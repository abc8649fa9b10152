//! FSDP and a loss that reads the model outside `acc.forward`: refused by name (there each
//! rank holds only its shards), and the remedy the error names, the term inside the forward
//! closure, trains as DDP does with the term outside.

mod common;

use afterburner_accelerator::{AccelerateError, Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::digits;
use burn::module::Module;
use burn::optim::AdamWConfig;
use common::*;

/// Accumulation 2 and clipping, FSDP with the transformer layers as units.
fn config(strategy: &'static str) -> AcceleratorConfig {
    AcceleratorConfig {
        gradient_accumulation_steps: 2,
        max_grad_norm: Some(0.5),
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: match strategy.parse().unwrap() {
                StrategyConfig::Fsdp(mut fsdp) => {
                    fsdp.auto_wrap_policy = "TransformerEncoderLayer".parse().unwrap();
                    StrategyConfig::Fsdp(fsdp)
                }
                other => other,
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `1e-3 * sum(w^2)` over every parameter of `model` as it is.
fn penalty<M: Module<B>>(model: &M) -> burn::tensor::Tensor<B, 1> {
    struct Sum(Option<burn::tensor::Tensor<B, 1>>);
    impl burn::module::ModuleVisitor<B> for Sum {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            let term = param.val().powi_scalar(2).sum().mul_scalar(1e-3);
            self.0 = Some(match self.0.take() {
                Some(sum) => sum + term,
                None => term,
            });
        }
    }
    let mut sum = Sum(None);
    model.visit(&mut sum);
    sum.0.expect("a model with parameters")
}

/// Each rank's whole model after 2 optimizer steps of a loss with a weight penalty, computed
/// `inside` the forward closure (on the gathered parameters) or on the model outside it.
fn train_with_penalty(
    strategy: &'static str,
    inside: bool,
) -> Result<Vec<Vec<f32>>, AccelerateError> {
    let initial = vit(8);
    Accelerator::<B>::launch(
        config(strategy),
        vec![Default::default(); 2],
        move |mut acc| {
            let (mut model, mut optim) = acc.setup(initial.clone(), AdamWConfig::new().init())?;
            let loader = acc.dataloader(digits::load()?.take(64), BATCHER, 8)?;
            for batch in loader.epoch(0) {
                let images = batch.images.clone();
                let loss = match inside {
                    true => {
                        let (logits, penalty) =
                            acc.forward(&model, images, |m, x| (m.forward(x), penalty(m)))?;
                        cross_entropy(logits, &batch) + penalty
                    }
                    false => {
                        let logits = acc.forward(&model, images, |m, x| m.forward(x))?;
                        cross_entropy(logits, &batch) + penalty(&model)
                    }
                };
                acc.backward(loss, &model)?;
                model = acc.step(model, &mut optim, &mut 1e-3)?;
            }
            Ok(flatten(&params(&acc.full_model(&model)?)))
        },
    )
}

/// Outside `acc.forward` each rank of FSDP holds only its shards: a loss that reads the model
/// there is refused by name (it was a penalty on this rank's shards, not the one-device
/// loss), and the remedy it names, the term inside the forward closure, trains as DDP does
/// with the term outside.
#[test]
fn a_loss_reading_the_sharded_model_outside_forward_is_refused_by_name() {
    let _rng = rng_lock();
    let err = train_with_penalty("fsdp", false).unwrap_err().to_string();
    assert!(
        err.contains("outside acc.forward") && err.contains("inside the forward closure"),
        "{err}"
    );
    let ddp = train_with_penalty("ddp", false).unwrap();
    let fsdp = train_with_penalty("fsdp", true).unwrap();
    let err = max_rel(&fsdp[0], &ddp[0], 1e-3);
    println!("fsdp, penalty inside forward, vs ddp, penalty outside: {err:e}");
    assert!(err <= 1e-5, "{err}");
}
