//! Running a case: through a hand-written Accelerator loop or through the Trainer, on as
//! many in-process ranks as its strategy has; the result is the whole model's parameters
//! after [`STEPS`] optimizer steps (every rank's, which must agree).

use afterburner::parallel::ReduceOp;
use afterburner::trainer::{
    Components, DeviceAdamW, DeviceAdamWConfig, HfSchedule, IntervalStrategy, LossNormalization,
    OptimizerType, ReportTo, SchedulerType, TrainLoss, Trainer, TrainingArguments,
};
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, Autocast, ParallelStrategy, Precision,
};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::case::{Case, Entry, LossShape, Norm, Step};
use super::data::{EqBatch, EqBatcher, EqItem, aux_term, dataset, loss_sum};
use crate::models::{Transformer, TransformerConfig};
use crate::text::TokenBatch;
use burn::train::ClassificationOutput;

/// The matrix's backend: flex under `Autocast` (per-op autocast for the mixed precisions, as
/// on a GPU) and autodiff.
pub type B = Autodiff<Autocast<Flex>>;

/// Optimizer steps of every run.
pub const STEPS: usize = 2;
/// Items of every micro-batch over all data-parallel ranks.
pub const GLOBAL_BATCH: usize = 4;
/// Plain SGD's learning rate (the host-decided step).
pub const SGD_LR: f64 = 0.1;
/// AdamW's learning rate (the device-decided step), constant.
pub const ADAMW_LR: f64 = 1e-3;
/// AdamW's epsilon: the Trainer's and `DeviceAdamW`'s, set alike.
pub const ADAMW_EPSILON: f32 = 1e-6;
/// The data and the Accelerator's shuffle.
pub const SEED: u64 = 17;

/// The model every run starts from: a 2-block transformer over bytes (width 16, 4 heads).
pub fn initial_model() -> Transformer<B> {
    let device = Default::default();
    <B as Backend>::seed(&device, 3);
    let model = TransformerConfig::new()
        .with_d_model(16)
        .with_n_heads(4)
        .with_n_layers(2)
        .with_max_seq_len(super::data::SEQ_LEN)
        .init::<B>(&device);
    let _ = model.forward(Tensor::<B, 2, Int>::zeros(
        [1, super::data::SEQ_LEN],
        &device,
    ));
    model
}

/// The items of a run of `micro_batches` per step.
fn items(micro_batches: usize) -> usize {
    STEPS * micro_batches * GLOBAL_BATCH
}

/// The Accelerator's settings of `case` (the Trainer derives the same from its arguments).
fn accelerator_config(case: &Case) -> AcceleratorConfig {
    AcceleratorConfig {
        precision: case.precision,
        gradient_accumulation_steps: case.micro_batches,
        seed: SEED,
        gradient_checkpointing: checkpointing(case.checkpointing),
        parallelism: case.strategy.parallelism(),
        ..Default::default()
    }
}

fn checkpointing(all: bool) -> afterburner::CheckpointPolicy {
    let policy = if all { "all" } else { "none" };
    policy.parse().expect("a checkpointing policy")
}

/// The whole model's parameters, flattened in visit order.
fn flat<M: AutodiffModule<B>>(model: &M) -> Vec<f32> {
    crate::testing::flat_params::<B, M>(model)
}

/// The parameters `case` trains to, from `initial`: rank 0's, after checking that every
/// rank holds the same model.
pub fn run_case(case: &Case, initial: &Transformer<B>) -> Result<Vec<f32>, AccelerateError> {
    let ranks = match case.entry {
        Entry::Loop => run_loop(case, initial)?,
        Entry::Trainer => run_trainer(case, initial)?,
    };
    if let Some(rank) = ranks.iter().position(|p| *p != ranks[0]) {
        return Err(AccelerateError::Usage(format!(
            "the ranks' models differ after training (rank {rank} and rank 0)"
        )));
    }
    Ok(ranks.into_iter().next().unwrap_or_default())
}

/// The one-device run every case is compared with: `split` micro-batches of
/// `GLOBAL_BATCH * micro_batches / split` items per step (1: the whole step at once), the
/// host-decided step with `step`'s optimizer, `precision`, no checkpointing.
pub fn run_one_device(
    norm: Norm,
    loss: LossShape,
    step: Step,
    precision: Precision,
    micro_batches: usize,
    split: usize,
    initial: &Transformer<B>,
) -> Result<Vec<f32>, AccelerateError> {
    let config = AcceleratorConfig {
        precision,
        gradient_accumulation_steps: split,
        seed: SEED,
        ..Default::default()
    };
    let initial = initial.clone();
    let batch = GLOBAL_BATCH * micro_batches / split;
    let mut acc = Accelerator::<B>::new(config, Default::default())?;
    let data = dataset(items(micro_batches), norm == Norm::PerItem);
    let loader = acc.dataloader(data, EqBatcher { loss }, batch)?;
    let model = match step {
        Step::Host => host_steps(&mut acc, initial, sgd(), SGD_LR, &loader, norm)?,
        Step::Device => host_steps(&mut acc, initial, adamw(), ADAMW_LR, &loader, norm)?,
    };
    Ok(flat(&model))
}

fn sgd<M: AutodiffModule<B>>() -> impl Optimizer<M, B> {
    SgdConfig::new().init()
}

/// Burn's AdamW as the Trainer's and `DeviceAdamW` are set here.
fn adamw<M: AutodiffModule<B>>() -> impl Optimizer<M, B> {
    AdamWConfig::new()
        .with_epsilon(ADAMW_EPSILON)
        .with_weight_decay(0.0)
        .init()
}

fn device_adamw_config() -> DeviceAdamWConfig {
    DeviceAdamWConfig {
        epsilon: ADAMW_EPSILON,
        weight_decay: 0.0,
        ..Default::default()
    }
}

/// The loss of `batch` as a loop writes it: the mean over its targets, or (per-item) its
/// sum times `per_item` (ranks x micro-batches / the step's targets over every rank, so the
/// averaged gradient is the step's per-target mean); plus the auxiliary term (per target,
/// under per-item).
fn loop_loss<S: ParallelStrategy<B>>(
    acc: &Accelerator<B, S>,
    model: &Transformer<B>,
    batch: &EqBatch<B>,
    norm: Norm,
    per_item: f64,
) -> Result<Tensor<B, 1>, AccelerateError> {
    let logits = acc.forward(model, batch.inputs.clone(), |m, x| m.forward(x))?;
    let sum = loss_sum(logits, batch);
    Ok(match (norm, aux_term(model, batch)) {
        (Norm::Mean, None) => sum.div_scalar(batch.count as f64),
        (Norm::Mean, Some(aux)) => sum.div_scalar(batch.count as f64) + aux,
        (Norm::PerItem, None) => sum.mul_scalar(per_item),
        (Norm::PerItem, Some(aux)) => {
            (sum + aux.mul_scalar(batch.count as f64)).mul_scalar(per_item)
        }
    })
}

/// The factor of a per-item loss for the micro-batches of one optimizer step (HF's
/// `num_items_in_batch`): ranks x micro-batches / the targets of the step on every rank,
/// counted on the host and summed across ranks (one read per step).
fn per_item_factor<S: ParallelStrategy<B>>(
    acc: &Accelerator<B, S>,
    cycle: &[EqBatch<B>],
) -> Result<f64, AccelerateError> {
    let local: usize = cycle.iter().map(|b| b.count).sum();
    let counts = Tensor::<B, 1>::from_data(TensorData::new(vec![local as f32], [1]), acc.device());
    let total = acc.reduce(counts, ReduceOp::Sum)?.into_scalar();
    Ok((acc.world_size() * cycle.len()) as f64 / f64::from(total))
}

/// The loader's first epoch in cycles of `micro` batches, each cycle's batches taken before
/// it trains (to count its items).
fn cycles(loader: &Loader, micro: usize) -> impl Iterator<Item = Vec<EqBatch<B>>> {
    let mut epoch = loader.epoch(0);
    std::iter::from_fn(move || {
        let cycle: Vec<EqBatch<B>> = epoch.by_ref().take(micro).collect();
        (!cycle.is_empty()).then_some(cycle)
    })
}

/// The matrix's training loader.
type Loader = afterburner::data::DataLoaderShard<B, EqItem, EqBatch<B>>;

/// Trains the loader's epoch with `optim` and `acc.step`, the micro-batches of each step
/// counted together for per-item.
fn host_steps<S: ParallelStrategy<B>, O: Optimizer<Transformer<B>, B>>(
    acc: &mut Accelerator<B, S>,
    model: Transformer<B>,
    optim: O,
    lr: f64,
    loader: &Loader,
    norm: Norm,
) -> Result<Transformer<B>, AccelerateError> {
    let (mut model, mut optim) = acc.setup(model, optim)?;
    let micro = acc.config().gradient_accumulation_steps;
    for cycle in cycles(loader, micro) {
        let per_item = per_item_factor(acc, &cycle)?;
        for batch in &cycle {
            let loss = loop_loss(acc, &model, batch, norm, per_item)?;
            acc.backward(loss, &model)?;
            model = acc.step(model, &mut optim, &mut lr.clone())?;
        }
    }
    acc.full_model(&model)
}

/// `case` through a hand-written loop on its ranks.
fn run_loop(case: &Case, initial: &Transformer<B>) -> Result<Vec<Vec<f32>>, AccelerateError> {
    let (case, initial) = (*case, initial.clone());
    Accelerator::<B>::run(accelerator_config(&case), move |mut acc| {
        let model = match case.strategy.tp_size() {
            1 => initial.clone(),
            _ => acc.parallelize(initial.clone())?,
        };
        let data = dataset(items(case.micro_batches), case.norm == Norm::PerItem);
        let batch = GLOBAL_BATCH / case.strategy.dp_size();
        let batcher = EqBatcher { loss: case.loss };
        let loader = acc.dataloader(data, batcher, batch)?;
        let model = match case.step {
            Step::Host => host_steps(&mut acc, model, sgd(), SGD_LR, &loader, case.norm)?,
            Step::Device => {
                let schedule = HfSchedule::new(SchedulerType::Constant, ADAMW_LR, 0, STEPS);
                let mut optim = DeviceAdamW::new(device_adamw_config(), schedule);
                let mut model = acc.setup_model(model)?;
                for cycle in cycles(&loader, case.micro_batches) {
                    let per_item = per_item_factor(&acc, &cycle)?;
                    for batch in &cycle {
                        let loss = loop_loss(&acc, &model, batch, case.norm, per_item)?;
                        acc.backward(loss, &model)?;
                        model = optim.step(&mut acc, model)?;
                    }
                }
                optim.settle(&mut acc);
                acc.full_model(&model)?
            }
        };
        Ok(flat(&model))
    })
}

impl<S: ParallelStrategy<B>> TrainLoss<B, EqBatch<B>, S> for Transformer<B> {
    fn train_loss(
        &self,
        acc: &Accelerator<B, S>,
        batch: EqBatch<B>,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        loop_loss(acc, self, &batch, Norm::Mean, 1.0)
    }

    fn train_loss_sum(
        &self,
        acc: &Accelerator<B, S>,
        batch: EqBatch<B>,
    ) -> Result<(Tensor<B, 1>, usize), AccelerateError> {
        let count = batch.count;
        Ok((loop_loss(acc, self, &batch, Norm::PerItem, 1.0)?, count))
    }

    fn parallelize(self, acc: &Accelerator<B, S>) -> Result<Self, AccelerateError> {
        acc.parallelize(self)
    }
}

type Inner = Autocast<Flex>;

/// The Trainer of the matrix's model and batches.
type EqTrainer = Trainer<
    Components<
        B,
        Transformer<B>,
        EqItem,
        EqBatch<B>,
        TokenBatch<Inner>,
        ClassificationOutput<Inner>,
    >,
>;

/// `case` through the Trainer on its ranks.
fn run_trainer(case: &Case, initial: &Transformer<B>) -> Result<Vec<Vec<f32>>, AccelerateError> {
    let (case, initial) = (*case, initial.clone());
    let args = TrainingArguments {
        output_dir: std::env::temp_dir()
            .join(format!("afterburner-equivalence-{}", std::process::id())),
        max_steps: STEPS as i64,
        per_device_train_batch_size: GLOBAL_BATCH / case.strategy.dp_size(),
        gradient_accumulation_steps: case.micro_batches,
        optim: match case.step {
            Step::Host => OptimizerType::Sgd,
            Step::Device => OptimizerType::AdamW,
        },
        learning_rate: match case.step {
            Step::Host => SGD_LR,
            Step::Device => ADAMW_LR,
        },
        weight_decay: 0.0,
        adam_epsilon: f64::from(ADAMW_EPSILON),
        max_grad_norm: 0.0,
        lr_scheduler_type: SchedulerType::Constant,
        loss_normalization: match case.norm {
            Norm::Mean => LossNormalization::BatchMean,
            Norm::PerItem => LossNormalization::PerItem,
        },
        precision: case.precision,
        gradient_checkpointing: checkpointing(case.checkpointing),
        eval_strategy: IntervalStrategy::No,
        logging_strategy: IntervalStrategy::No,
        save_strategy: IntervalStrategy::No,
        report_to: ReportTo::None,
        disable_tqdm: true,
        seed: SEED,
        parallelism: case.strategy.parallelism(),
        ..Default::default()
    };
    Accelerator::<B>::run(args.accelerator_config(), move |acc| {
        let data = dataset(items(case.micro_batches), case.norm == Norm::PerItem);
        let eval = dataset(0, false);
        let batcher = EqBatcher { loss: case.loss };
        let mut trainer = EqTrainer::on(acc, initial.clone(), args.clone(), data, eval, batcher)?;
        trainer.train()?;
        let (model, acc) = trainer.into_parts()?;
        Ok(flat(&acc.full_model(&model)?))
    })
}
