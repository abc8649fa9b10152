//! Bringing your own: a strategy defined here (outside the workspace crates) trains through
//! `Accelerator::run_with` and through the Trainer; the Trainer over SGD with momentum, Adam
//! (given, or named by `optim`) equals the hand-written Accelerator loop bitwise.

mod common;

use afterburner::parallel::{ParallelError, ParallelStrategy, ProcessGroup, ReduceOp, StateSaving};
use afterburner::trainer::{
    HfSchedule, IntervalStrategy, OptimizerType, SchedulerType, TrainLoss, Trainer,
    TrainingArguments, optimizer_from_args,
};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, Group, StrategyConfig};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageDataset, digits};
use burn::backend::Flex;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use common::{B, BATCHER, flatten, params, rng_lock, vit};

/// 40 training digits (10 batches of 4) and 8 evaluation digits.
fn data() -> (ImageDataset, ImageDataset) {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[40..48].to_vec(), [1, 8, 8]).unwrap();
    (all.take(40), eval)
}

/// One epoch of 10 batches, accumulation 2: 5 optimizer steps, clipping on.
fn args(name: &str) -> TrainingArguments {
    TrainingArguments {
        output_dir: common::scratch_dir(&format!("plug-ins-{name}")),
        num_train_epochs: 1.0,
        per_device_train_batch_size: 4,
        learning_rate: 1e-2,
        weight_decay: 0.01,
        gradient_accumulation_steps: 2,
        warmup_steps: 1.0,
        lr_scheduler_type: SchedulerType::Cosine,
        save_strategy: IntervalStrategy::No,
        logging_steps: 1.0,
        ..Default::default()
    }
}

/// The run written by hand on the Accelerator with `optim` and `lr`.
fn hand_loop<O, L>(args: &TrainingArguments, seed: u64, mut optim: O, mut lr: L) -> Vec<f32>
where
    O: Optimizer<Vit<B>, B>,
    L: burn::optim::lr_scheduler::LrScheduler,
{
    let mut acc = Accelerator::<B>::new(args.accelerator_config(), Default::default()).unwrap();
    let mut model = acc.setup_model(vit(seed)).unwrap();
    let loader = acc
        .dataloader(data().0, BATCHER, args.per_device_train_batch_size)
        .unwrap()
        .prefetch(0);
    for batch in loader.epoch(0) {
        let loss = model.train_loss(&acc, batch).unwrap();
        acc.backward(loss, &model).unwrap();
        model = acc.step(model, &mut optim, &mut lr).unwrap();
    }
    assert_eq!(acc.counters().optimizer_steps, 5);
    flatten(&params(&model))
}

fn sgd_momentum() -> impl Optimizer<Vit<B>, B> {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

fn adam() -> impl Optimizer<Vit<B>, B> {
    AdamConfig::new().with_epsilon(1e-8).init()
}

#[test]
fn the_trainer_with_sgd_momentum_and_adam_equals_the_hand_written_loop_bitwise() {
    let _rng = rng_lock();
    let a = args("given");
    // Burn's own scheduler: a constant 1e-2 (an f64 is an LrScheduler).
    let (train, eval) = data();
    let mut t = Trainer::new(vit(5), a.clone(), train, eval, BATCHER)
        .unwrap()
        .with_optimizers(sgd_momentum(), 1e-2);
    assert_eq!(t.train().unwrap().global_step, 5);
    let trained = flatten(&params(t.model().unwrap()));
    assert_eq!(
        trained,
        hand_loop(&a, 5, sgd_momentum(), 1e-2),
        "SGD + momentum"
    );

    let schedule = || HfSchedule::new(SchedulerType::Cosine, 1e-2, 1, 5);
    let (train, eval) = data();
    let mut t = Trainer::new(vit(5), a.clone(), train, eval, BATCHER)
        .unwrap()
        .with_optimizers(adam(), schedule());
    t.train().unwrap();
    let trained = flatten(&params(t.model().unwrap()));
    assert_eq!(trained, hand_loop(&a, 5, adam(), schedule()), "Adam");
    assert_ne!(trained, hand_loop(&a, 5, sgd_momentum(), schedule()));
}

#[test]
fn optim_names_the_trainers_optimizer() {
    let _rng = rng_lock();
    let schedule = || HfSchedule::new(SchedulerType::Cosine, 1e-2, 1, 5);
    for (optim, by_hand) in [
        (
            OptimizerType::Sgd,
            flatten(&params(&{
                let a = args("sgd");
                let opt = SgdConfig::new()
                    .with_weight_decay(Some(burn::optim::decay::WeightDecayConfig::new(0.01)))
                    .init();
                return_model(&a, opt, schedule())
            })),
        ),
        (
            OptimizerType::Adam,
            flatten(&params(&{
                let a = args("adam");
                let opt = AdamConfig::new()
                    .with_epsilon(1e-8)
                    .with_weight_decay(Some(burn::optim::decay::WeightDecayConfig::new(0.01)))
                    .init();
                return_model(&a, opt, schedule())
            })),
        ),
    ] {
        let a = TrainingArguments {
            optim,
            ..args(&optim.to_string())
        };
        let (train, eval) = data();
        let mut t = Trainer::new(vit(5), a, train, eval, BATCHER).unwrap();
        t.train().unwrap();
        assert_eq!(flatten(&params(t.model().unwrap())), by_hand, "{optim}");
    }
    let bad = "--optim lamb".split(' ');
    let err = TrainingArguments::from_args(bad).unwrap_err().to_string();
    assert!(err.contains("optim") && err.contains("sgd"), "{err}");
}

/// [`hand_loop`]'s model rather than its parameters.
fn return_model<O: Optimizer<Vit<B>, B>>(
    args: &TrainingArguments,
    optim: O,
    lr: HfSchedule,
) -> Vit<B> {
    let values = hand_loop(args, 5, optim, lr);
    let model = vit(5);
    afterburner::parallel::with_flat_params::<B, _>(
        model,
        Tensor::from_floats(values.as_slice(), &Default::default()),
    )
}

/// A user's strategy, written against the public trait only: rank 0's parameters at setup,
/// then each parameter's gradient averaged over the ranks by its own all-reduce (DDP by
/// hand, one collective per tensor), and the optimizer steps it saw counted.
struct MeanPerTensor {
    group: Group<B>,
    steps: u64,
    all_reduces: u64,
}

impl MeanPerTensor {
    fn new(group: Option<Group<B>>) -> Result<Self, AccelerateError> {
        let group = group.ok_or_else(|| AccelerateError::Usage("needs several ranks".into()))?;
        Ok(Self {
            group,
            steps: 0,
            all_reduces: 0,
        })
    }
}

/// Replaces each gradient by its mean over the ranks.
struct MeanGrads<'a> {
    group: &'a dyn ProcessGroup<Flex>,
    grads: &'a mut GradientsParams,
    calls: u64,
    error: Option<ParallelError>,
}

impl ModuleVisitor<B> for MeanGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<Flex, D>(param.id) else {
            return;
        };
        let shape = grad.shape();
        let flat = grad.reshape([shape.num_elements()]);
        match self.group.all_reduce(flat, ReduceOp::Sum) {
            Ok(sum) => {
                let mean = sum.div_scalar(self.group.world_size() as f64);
                self.grads
                    .register::<Flex, D>(param.id, mean.reshape(shape));
                self.calls += 1;
            }
            Err(e) => self.error = Some(e),
        }
    }
}

impl StateSaving<B> for MeanPerTensor {}
impl ParallelStrategy<B> for MeanPerTensor {
    fn name(&self) -> &'static str {
        "mean-per-tensor"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Flex>> {
        Some(&*self.group)
    }

    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        afterburner::parallel::broadcast_from_rank0(&*self.group, model)
    }

    fn reduce_gradients<M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: &mut GradientsParams,
    ) -> Result<(), ParallelError> {
        let mut mean = MeanGrads {
            group: &*self.group,
            grads,
            calls: 0,
            error: None,
        };
        model.visit(&mut mean);
        self.all_reduces += mean.calls;
        mean.error.map_or(Ok(()), Err)
    }

    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        _optimizer: &mut O,
        _step: u64,
    ) -> Result<M, ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.steps += 1;
        Ok(model)
    }

    fn gradient_all_reduces(&self) -> u64 {
        self.all_reduces
    }

    fn averages_gradients(&self) -> bool {
        true
    }
}

/// Two ranks, each its half of 40 digits, batch 4, plain SGD: the full parameters per rank
/// and the strategy's step count.
fn two_ranks<S, MS>(config: AcceleratorConfig, make: MS) -> Vec<(Vec<f32>, u64)>
where
    S: ParallelStrategy<B> + StepsSeen,
    MS: Fn(Option<Group<B>>) -> Result<S, AccelerateError> + Send + Sync + 'static,
{
    let model = vit(9);
    Accelerator::<B, S>::run_with(config, make, move |mut acc| {
        let (mut model, mut optim) = acc.setup(model.clone(), SgdConfig::new().init())?;
        let loader = acc.dataloader(data().0, BATCHER, 4)?;
        for batch in loader.epoch(0) {
            let loss = model.train_loss(&acc, batch)?;
            acc.backward(loss, &model)?;
            model = acc.step(model, &mut optim, &mut 0.1)?;
        }
        Ok((flatten(&params(&model)), acc.strategy().steps_seen()))
    })
    .unwrap()
}

/// The optimizer steps a test strategy saw (DDP's: its gradient all-reduces).
trait StepsSeen {
    fn steps_seen(&self) -> u64;
}

impl StepsSeen for MeanPerTensor {
    fn steps_seen(&self) -> u64 {
        self.steps
    }
}

impl StepsSeen for afterburner::AnyStrategy<B> {
    fn steps_seen(&self) -> u64 {
        self.gradient_all_reduces()
    }
}

#[test]
fn a_strategy_from_another_crate_trains_through_run_with_like_the_built_in_ddp() {
    let _rng = rng_lock();
    let config = AcceleratorConfig {
        parallelism: afterburner::ParallelismConfig {
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let mine = two_ranks(config.clone(), MeanPerTensor::new);
    let ddp_config = config
        .clone()
        .with_strategy(StrategyConfig::Ddp(Default::default()));
    let built = ddp_config.clone();
    let ddp = two_ranks(ddp_config, move |group| {
        afterburner::AnyStrategy::<B>::from_config(&built, group, &Default::default())
    });
    // 20 items per rank, batch 4: 5 steps, every one seen by the strategy.
    assert_eq!(mine[0].1, 5);
    assert_eq!(mine[0].0, mine[1].0, "both ranks hold the same model");
    assert_eq!(mine[0].0, ddp[0].0, "the same as the built-in DDP");
}

#[test]
fn a_strategy_from_another_crate_trains_through_the_trainer() {
    let _rng = rng_lock();
    let a = TrainingArguments {
        max_steps: 3,
        ..args("custom-trainer")
    };
    let config = AcceleratorConfig {
        parallelism: afterburner::ParallelismConfig {
            devices: 2,
            ..a.accelerator_config().parallelism
        },
        ..a.accelerator_config()
    };
    let model = vit(4);
    let run_args = a.clone();
    let results =
        Accelerator::<B, MeanPerTensor>::run_with(config, MeanPerTensor::new, move |acc| {
            let (train, eval) = data();
            let mut t = Trainer::on(acc, model.clone(), run_args.clone(), train, eval, BATCHER)?;
            let summary = t.train()?;
            let (model, acc) = t.into_parts()?;
            Ok((
                summary.global_step,
                flatten(&params(&model)),
                acc.strategy().steps,
                acc.gradient_all_reduces(),
            ))
        })
        .unwrap();
    for (steps, _, seen, all_reduces) in &results {
        assert_eq!((*steps, *seen), (3, 3));
        assert!(*all_reduces >= 3, "{all_reduces}");
    }
    assert_eq!(results[0].1, results[1].1, "the ranks agree");
}

/// One Accelerator step of `model` on 16 digits from `start`.
fn one_step<O: Optimizer<Vit<B>, B>>(
    acc: &mut Accelerator<B>,
    model: Vit<B>,
    optim: &mut O,
    start: usize,
) -> Vit<B> {
    let batch = common::digits_batch(start, 16);
    let logits = acc
        .forward(&model, batch.images.clone(), |m, x| m.forward(x))
        .unwrap();
    acc.backward(common::cross_entropy(logits, &batch), &model)
        .unwrap();
    acc.step(model, optim, &mut 1e-3).unwrap()
}

#[test]
fn a_checkpoint_of_burns_plain_adamw_loads_into_the_trainers_optimizer() {
    // Before `optim`, the Trainer's optimizer was Burn's OptimizerAdaptor<AdamW>: a checkpoint
    // it saved loads into HfOptimizer (optim = "adamw") and the run continues as the plain
    // optimizer would, bitwise.
    let _rng = rng_lock();
    let args = TrainingArguments::default();
    let plain = || {
        AdamWConfig::new()
            .with_epsilon(args.adam_epsilon as f32)
            .with_weight_decay(args.weight_decay as f32)
            .init::<B, Vit<B>>()
    };
    let dir = common::scratch_dir("plain-adamw-checkpoint");
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let (mut model, mut optim) = acc.setup(vit(5), plain()).unwrap();
    for start in [0, 16] {
        model = one_step(&mut acc, model, &mut optim, start);
    }
    acc.save_state(&dir, &model, &optim, &1e-3).unwrap();
    let expected = flatten(&params(&one_step(&mut acc, model, &mut optim, 32)));

    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let (model, hf) = acc
        .setup(vit(6), optimizer_from_args::<B, Vit<B>>(&args))
        .unwrap();
    let (model, mut hf, _) = acc.load_state(&dir, model, hf, 1e-3).unwrap();
    let resumed = flatten(&params(&one_step(&mut acc, model, &mut hf, 32)));
    assert_eq!(resumed, expected);
    std::fs::remove_dir_all(dir).ok();
}
