//! The strategy's options reach the Trainer: DiLoCo's `sync_every`, Local SGD's
//! `local_sgd_steps` and FSDP's settings given in TOML or on the command line shape the run;
//! a user's strategy registered by name is chosen by the Trainer's command line.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use afterburner::parallel::{ParallelStrategy, ShardingStrategy, StateSaving};
use afterburner::trainer::{IntervalStrategy, Trainer, TrainingArguments};
use afterburner::{
    AccelerateError, Accelerator, AnyStrategy, Group, NamedStrategy, StrategyConfig,
    register_strategy,
};
use afterburner_demos::{ImageDataset, digits};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use common::{B, BATCHER, rng_lock, vit};

/// 32 training digits, 8 for evaluation.
fn data() -> (ImageDataset, ImageDataset) {
    let all = digits::load().unwrap();
    let eval = ImageDataset::new(all.items()[32..40].to_vec(), [1, 8, 8]).unwrap();
    (all.take(32), eval)
}

/// The program's defaults: 2 devices, batch 2, no saves, no evaluation.
fn defaults(name: &str) -> TrainingArguments {
    TrainingArguments {
        output_dir: common::scratch_dir(&format!("trainer-strategies-{name}")),
        per_device_train_batch_size: 2,
        learning_rate: 1e-3,
        save_strategy: IntervalStrategy::No,
        logging_steps: 100.0,
        disable_tqdm: true,
        parallelism: afterburner::ParallelismConfig {
            devices: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Trains `args` with the Trainer on its devices; returns what `read` reads of each rank's
/// Accelerator after training.
fn train_then<R: Send + 'static>(
    args: TrainingArguments,
    read: fn(&Accelerator<B>) -> R,
) -> Vec<R> {
    let _rng = rng_lock();
    let model = vit(5);
    let config = args.accelerator_config();
    Accelerator::<B>::run(config, move |acc| {
        let (train, eval) = data();
        let mut t = Trainer::on(acc, model.clone(), args.clone(), train, eval, BATCHER)?;
        t.train()?;
        Ok(read(t.accelerator()))
    })
    .unwrap()
}

/// Each rank's parameter syncs and whether (and how) it ran FSDP, after training `args`.
fn train(args: TrainingArguments) -> Vec<(u64, Option<(ShardingStrategy, usize)>)> {
    train_then(args, |acc| {
        let fsdp = acc.fsdp().map(|f| {
            let units = f.layout().map_or(0, |l| l.unit_paths().len());
            (f.config().sharding_strategy, units)
        });
        (acc.parameter_syncs(), fsdp)
    })
}

/// Each rank's (gradient all-reduces, whether the strategy reduced during backward), after
/// training `args`.
fn reductions(args: TrainingArguments) -> Vec<(u64, bool)> {
    train_then(args, |acc| {
        (
            acc.gradient_all_reduces(),
            acc.strategy().reduces_in_backward(),
        )
    })
}

fn toml_file(name: &str, text: &str) -> String {
    let dir = common::scratch_dir(&format!("trainer-strategies-toml-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn diloco_sync_every_from_toml_and_the_command_line_makes_7_step_rounds() {
    let file = toml_file(
        "diloco",
        "max_steps = 14\n[strategy.diloco]\nsync_every = 7\n",
    );
    let from_toml = defaults("diloco-toml")
        .with_args(["--config", file.as_str()], &[])
        .unwrap()
        .0;
    let from_cli = defaults("diloco-cli")
        .with_args(
            [
                "--max-steps",
                "14",
                "--strategy",
                "diloco",
                "--diloco.sync-every",
                "7",
            ],
            &[],
        )
        .unwrap()
        .0;
    assert_eq!(
        from_toml.parallelism.strategy,
        from_cli.parallelism.strategy
    );
    assert!(
        matches!(&from_cli.parallelism.strategy, StrategyConfig::DiLoCo(d) if d.sync_every == 7)
    );
    // 14 steps in rounds of 7: two outer steps; the default (500) would sync once, at the end.
    for args in [from_toml, from_cli] {
        for (syncs, fsdp) in train(args) {
            assert_eq!((syncs, fsdp), (2, None));
        }
    }
    let default = defaults("diloco-default")
        .with_args(["--max-steps", "14", "--strategy", "diloco"], &[])
        .unwrap()
        .0;
    assert_eq!(train(default)[0].0, 1);
}

#[test]
fn local_sgd_steps_and_fsdp_options_reach_the_strategy() {
    let args = defaults("local-sgd")
        .with_args(
            [
                "--max-steps",
                "6",
                "--strategy",
                "local-sgd",
                "--local-sgd.local-sgd-steps",
                "3",
            ],
            &[],
        )
        .unwrap()
        .0;
    for (syncs, _) in train(args) {
        assert_eq!(syncs, 2, "6 steps averaged every 3");
    }
    let file = toml_file(
        "fsdp",
        "max_steps = 2\n[strategy.fsdp]\nauto_wrap_policy = \"TransformerEncoderLayer\"\n",
    );
    let args = defaults("fsdp")
        .with_args(
            [
                "--config",
                file.as_str(),
                "--fsdp.sharding-strategy",
                "grad-op",
            ],
            &[],
        )
        .unwrap()
        .0;
    for (_, fsdp) in train(args) {
        let (sharding, units) = fsdp.expect("trained under FSDP");
        assert_eq!(sharding, ShardingStrategy::GradOp);
        assert!(units > 1, "the layers are units of their own: {units}");
    }
}

#[test]
fn ddp_bucket_cap_mb_and_overlap_from_toml_and_the_command_line_shape_the_reduction() {
    // The defaults: one 25 MiB bucket a step, reduced during backward (one micro-batch).
    for strategy in ["ddp", "zero-1"] {
        let args = defaults(strategy)
            .with_args(["--max-steps", "2", "--strategy", strategy], &[])
            .unwrap()
            .0;
        for (rank, (all_reduces, during)) in reductions(args).into_iter().enumerate() {
            assert_eq!((all_reduces, during), (2, true), "{strategy} rank {rank}");
        }
    }
    // 4 KiB buckets (the ViT's gradients take several) after backward.
    let file = toml_file(
        "ddp",
        "max_steps = 2\n[strategy.ddp]\nbucket_cap_mb = 0.004\n",
    );
    let args = defaults("ddp-buckets")
        .with_args(["--config", file.as_str(), "--ddp.overlap", "false"], &[])
        .unwrap()
        .0;
    assert!(
        matches!(&args.parallelism.strategy, StrategyConfig::Ddp(d) if d.bucket_cap_mb == 0.004 && !d.overlap)
    );
    for (rank, (all_reduces, during)) in reductions(args).into_iter().enumerate() {
        assert!(
            !during,
            "rank {rank}: overlap = false reduces after backward"
        );
        assert!(
            all_reduces > 2 && all_reduces % 2 == 0,
            "rank {rank}: several buckets in each of 2 steps: {all_reduces}"
        );
    }
}

#[test]
fn strategy_options_on_the_command_line_are_checked_by_name() {
    let parse = |args: &[&str]| {
        defaults("bad")
            .with_args(args.iter().copied(), &[])
            .unwrap_err()
            .to_string()
    };
    let err = parse(&["--strategy", "diloco", "--diloco.sync-evry", "7"]);
    assert!(
        err.contains("--diloco.sync-evry") && err.contains("sync-every"),
        "{err}"
    );
    let err = parse(&["--strategy", "ddp", "--diloco.sync-every", "7"]);
    assert!(
        err.contains("but the strategy is ddp (give --strategy diloco)"),
        "{err}"
    );
    let err = parse(&["--strategy", "ddp", "--ddp.bucket", "7"]);
    assert!(
        err.contains("--ddp.bucket") && err.contains("bucket-cap-mb"),
        "{err}"
    );
    let err = parse(&["--strategy", "ddp", "--ddp.bucket-cap-mb", "0"]);
    assert!(err.contains("bucket_cap_mb") && err.contains("0"), "{err}");
    let err = parse(&["--strategy", "zero-1", "--zero-1.overlap", "maybe"]);
    assert!(err.contains("overlap"), "{err}");
    let err = parse(&["--strategy", "dilco"]);
    assert!(
        err.contains("--strategy") && err.contains("did you mean diloco"),
        "{err}"
    );
    let err = parse(&["--strategy", "diloco", "--diloco.sync-every", "0"]);
    assert!(err.contains("sync_every"), "{err}");
}

/// A user's strategy: one device, counts its optimizer steps, with one option.
struct Counting {
    every: u64,
    steps: Arc<AtomicU64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CountingOptions {
    every: u64,
}

impl Default for CountingOptions {
    fn default() -> Self {
        Self { every: 1 }
    }
}

impl StateSaving<B> for Counting {}
impl ParallelStrategy<B> for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        _optimizer: &mut O,
        _step: u64,
    ) -> Result<M, afterburner::parallel::ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.steps.fetch_add(1, Ordering::SeqCst);
        Ok(model)
    }
}

impl NamedStrategy<B> for Counting {
    const NAME: &'static str = "counting";
    type Options = CountingOptions;

    fn build(group: Option<Group<B>>, options: CountingOptions) -> Result<Self, AccelerateError> {
        assert!(group.is_none(), "one device in this test");
        Ok(Self {
            every: options.every,
            steps: Arc::default(),
        })
    }

    fn option_about(key: &str) -> Option<&'static str> {
        (key == "every").then_some("Count every this many steps.")
    }
}

#[test]
fn a_registered_strategy_is_chosen_by_the_trainers_command_line() {
    register_strategy::<B, Counting>().unwrap();
    let args = defaults("registered")
        .with_args(
            [
                "--max-steps",
                "3",
                "--devices",
                "1",
                "--strategy",
                "counting",
                "--counting.every",
                "4",
            ],
            &[],
        )
        .unwrap()
        .0;
    assert_eq!(args.parallelism.strategy.name(), "counting");
    let config = args.accelerator_config();
    let _rng = rng_lock();
    let model = vit(5);
    let results = Accelerator::run_with(
        config.clone(),
        move |group| AnyStrategy::<B, Counting>::from_config(&config, group, &Default::default()),
        move |acc| {
            let (train, eval) = data();
            let mut t = Trainer::on(acc, model.clone(), args.clone(), train, eval, BATCHER)?;
            t.train()?;
            let counting = t
                .accelerator()
                .strategy()
                .user()
                .expect("the user's strategy");
            Ok((counting.every, counting.steps.load(Ordering::SeqCst)))
        },
    )
    .unwrap();
    assert_eq!(results, vec![(4, 3)]);
    // The name is listed where the built-in ones are, and a typo in its options is named.
    assert!(StrategyConfig::names().contains(&"counting".to_string()));
    let err = defaults("registered-typo")
        .with_args(["--strategy", "counting", "--counting.evry", "4"], &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("did you mean every"), "{err}");
    // --help lists its options with their descriptions.
    let help = match defaults("registered-help").with_args(["--help"], &[]) {
        Err(AccelerateError::Help(text)) => text,
        other => panic!("{:?}", other.map(|_| ())),
    };
    let line = help
        .lines()
        .find(|l| l.contains("--counting.every"))
        .unwrap_or_default();
    assert!(
        line.contains("Count every this many steps") && line.contains("[default: 1]"),
        "{help}"
    );
    // A built-in name cannot be taken.
    struct Impostor;
    impl StateSaving<B> for Impostor {}
    impl ParallelStrategy<B> for Impostor {
        fn name(&self) -> &'static str {
            "ddp"
        }
    }
    impl NamedStrategy<B> for Impostor {
        const NAME: &'static str = "ddp";
        type Options = ();
        fn build(_: Option<Group<B>>, _: ()) -> Result<Self, AccelerateError> {
            Ok(Self)
        }
    }
    assert!(register_strategy::<B, Impostor>().is_err());
}

#[test]
fn an_accelerator_built_with_other_strategy_options_is_refused_by_name() {
    let args = defaults("mismatch")
        .with_args(["--strategy", "diloco", "--diloco.sync-every", "7"], &[])
        .unwrap()
        .0;
    // Built from the arguments but with another `sync_every`: the Trainer would not run
    // what the arguments say.
    let mut config = args.accelerator_config();
    config.parallelism.strategy = StrategyConfig::from_name("diloco").unwrap();
    let _rng = rng_lock();
    let model = vit(5);
    let err = Accelerator::<B>::run(config, move |acc| {
        let (train, eval) = data();
        Trainer::on(acc, model.clone(), args.clone(), train, eval, BATCHER).map(|_| ())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("'strategy'"), "{err}");
}
