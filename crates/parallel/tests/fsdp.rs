//! FSDP (full and grad-op) on 2 and 4 CPU workers trains exactly like DDP, while each rank
//! keeps about 1/N of the parameters and optimizer state.

mod common;

use afterburner_parallel::{
    AutoWrapPolicy, Ddp, Fsdp, FsdpConfig, LaunchConfig, ProcessGroup, ShardingStrategy,
    SharedGroup, launch,
};
use burn::backend::Flex;
use burn::module::{AutodiffModule, Module};
use burn::nn::{Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use common::*;

const STEPS: usize = 5;
const BATCH: usize = 4; // per worker
const WIDTH: usize = 33; // odd: shards need padding
const BLOCKS: usize = 3;

#[derive(Module, Debug)]
struct Block<B: Backend> {
    norm: LayerNorm<B>,
    fc1: Linear<B>,
    act: Gelu,
    fc2: Linear<B>,
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    embed: Linear<B>,
    blocks: Vec<Block<B>>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(seed: u64, device: &B::Device) -> Self {
        B::seed(device, seed);
        let block = || Block {
            norm: LayerNormConfig::new(WIDTH).init(device),
            fc1: LinearConfig::new(WIDTH, 2 * WIDTH).init(device),
            act: Gelu::new(),
            fc2: LinearConfig::new(2 * WIDTH, WIDTH).init(device),
        };
        let net = Self {
            embed: LinearConfig::new(6, WIDTH).init(device),
            blocks: (0..BLOCKS).map(|_| block()).collect(),
            head: LinearConfig::new(WIDTH, 3).init(device),
        };
        let _ = params(&net); // initialise lazy parameters now
        net
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut x = self.embed.forward(x);
        for b in &self.blocks {
            let h = b
                .fc2
                .forward(b.act.forward(b.fc1.forward(b.norm.forward(x.clone()))));
            x = x + h;
        }
        self.head.forward(x)
    }
}

/// Fixed data: per step, 4 x BATCH rows (enough for 4 workers) of 6 features, 3 targets.
fn data() -> Vec<(Vec<f32>, Vec<f32>)> {
    let device = Default::default();
    Flex::seed(&device, 99);
    let rows = 4 * BATCH;
    let random = |cols| {
        Tensor::<Flex, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), &device)
            .into_data()
            .to_vec()
            .unwrap()
    };
    (0..STEPS).map(|_| (random(6), random(3))).collect()
}

/// Mean squared error of `model` on this rank's rows of a step.
fn loss(model: &Net<B>, step: &(Vec<f32>, Vec<f32>), rank: usize) -> Tensor<B, 1> {
    let from = rank * BATCH;
    let out = model.forward(rows(&step.0, 6, from, BATCH));
    (out - rows(&step.1, 3, from, BATCH)).powi_scalar(2).mean()
}

fn record_bytes<O: Optimizer<Net<B>, B>>(optim: &O) -> usize {
    NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .record(optim.to_record(), ())
        .unwrap()
        .len()
}

/// What a rank reports: final full parameters, local parameter elements, optimizer record
/// bytes, unit count, gathers and reduce-scatters.
#[derive(Debug, Clone)]
struct Report {
    params: Vec<f32>,
    local_params: usize,
    optim_bytes: usize,
    units: usize,
    gathers: u64,
    reduce_scatters: u64,
}

/// Trains on `world` workers, with DDP when `fsdp` is `None`.
fn train(world: usize, fsdp: Option<FsdpConfig>) -> Vec<Report> {
    let data = data();
    // Built before launch: Flex has one process-wide RNG. Rank 0's weights win at setup.
    let initial: Vec<Net<B>> = (0..world)
        .map(|r| Net::new(1 + 1000 * r as u64, &Default::default()))
        .collect();
    launch::<Flex, _, String, _>(
        vec![Default::default(); world],
        LaunchConfig::default(),
        move |group| {
            let rank = group.rank();
            let group = SharedGroup::new(group);
            let err = |e: afterburner_parallel::ParallelError| e.to_string();
            let mut ddp = Ddp::<B, _>::new(group.clone());
            let mut model = ddp.setup(initial[rank].clone()).map_err(err)?;
            let mut optim = AdamWConfig::new().with_weight_decay(0.01).init();
            let Some(config) = fsdp.clone() else {
                for step in &data {
                    let mut grads =
                        GradientsParams::from_grads(loss(&model, step, rank).backward(), &model);
                    ddp.sync_gradients(&model, &mut grads).map_err(err)?;
                    model = optim.step(1e-2, model, grads);
                }
                return Ok(Report {
                    params: params(&model.valid()),
                    local_params: model.num_params(),
                    optim_bytes: record_bytes(&optim),
                    units: 0,
                    gathers: 0,
                    reduce_scatters: 0,
                });
            };
            let fsdp = Fsdp::<B, _>::new(group, config).map_err(err)?;
            model = fsdp.shard(model).map_err(err)?;
            for step in &data {
                let view = fsdp.view(&model, None).map_err(err)?;
                let mut grads =
                    GradientsParams::from_grads(loss(&view, step, rank).backward(), &model);
                fsdp.finish_backward(&model, &mut grads).map_err(err)?;
                model = optim.step(1e-2, model, grads);
                fsdp.after_step(&model).map_err(err)?;
            }
            let (gathers, reduce_scatters) = (fsdp.all_gathers(), fsdp.reduce_scatters());
            let full = fsdp.full_model(&model).map_err(err)?;
            Ok(Report {
                params: params(&full.valid()),
                local_params: model.num_params(),
                optim_bytes: record_bytes(&optim),
                units: fsdp.layout().map_or(0, |l| l.unit_paths().len()),
                gathers,
                reduce_scatters,
            })
        },
    )
    .unwrap()
}

fn blocks() -> AutoWrapPolicy {
    AutoWrapPolicy::Modules(vec!["Block".into()])
}

fn check_against_ddp(world: usize, config: FsdpConfig) -> (Report, Report) {
    let ddp = train(world, None);
    let fsdp = train(world, Some(config.clone()));
    for r in &fsdp {
        assert_eq!(
            r.params, fsdp[0].params,
            "every rank gathers the same model"
        );
    }
    let err = max_rel(&fsdp[0].params, &ddp[0].params);
    let full = ddp[0].local_params;
    let local: Vec<f64> = fsdp
        .iter()
        .map(|r| r.local_params as f64 / full as f64)
        .collect();
    let optim: Vec<f64> = fsdp
        .iter()
        .map(|r| r.optim_bytes as f64 / ddp[0].optim_bytes as f64)
        .collect();
    println!(
        "{} / {} at {world} workers vs DDP after {STEPS} AdamW steps: max relative difference \
         {err:e}; per-rank parameters {local:.3?} of {full}, optimizer record bytes {optim:.3?} \
         of {}",
        config.sharding_strategy, config.auto_wrap_policy, ddp[0].optim_bytes
    );
    assert!(err <= 1e-5, "{err}");
    assert_ne!(
        params(&Net::<B>::new(1, &Default::default())),
        ddp[0].params,
        "training moved"
    );
    let n = world as f64;
    for (l, o) in local.iter().zip(&optim) {
        assert!(*l <= 1.0 / n + 0.01, "parameters per rank {l} of the model");
        assert!(
            *o <= 1.0 / n + 0.05,
            "optimizer state per rank {o} of DDP's"
        );
    }
    (fsdp[0].clone(), ddp[0].clone())
}

#[test]
fn full_sharding_equals_ddp_at_two_and_four_workers() {
    let _rng = rng_lock();
    for world in [2, 4] {
        let config = FsdpConfig {
            sharding_strategy: ShardingStrategy::Full,
            auto_wrap_policy: blocks(),
            ..Default::default()
        };
        let (fsdp, _) = check_against_ddp(world, config);
        // Units: the three blocks, plus the root (embed, head).
        assert_eq!(fsdp.units, BLOCKS + 1);
        // Each unit gathered once per forward (and once for the final full model), and its
        // gradient reduce-scattered once per backward.
        assert_eq!(fsdp.reduce_scatters, (STEPS * (BLOCKS + 1)) as u64);
        assert_eq!(fsdp.gathers, (STEPS * (BLOCKS + 1)) as u64);
    }
}

#[test]
fn grad_op_and_size_policy_equal_ddp() {
    let _rng = rng_lock();
    let config = FsdpConfig {
        sharding_strategy: ShardingStrategy::GradOp,
        auto_wrap_policy: AutoWrapPolicy::Size(2000),
        ..Default::default()
    };
    let (fsdp, _) = check_against_ddp(2, config);
    // grad-op: no gather in the forward pass, one per unit after each step.
    assert_eq!(fsdp.gathers, (STEPS * fsdp.units) as u64);
    assert_eq!(fsdp.reduce_scatters, (STEPS * fsdp.units) as u64);
    let whole = FsdpConfig::default();
    let (fsdp, _) = check_against_ddp(2, whole);
    assert_eq!(fsdp.units, 1);
}

#[test]
fn an_auto_wrap_name_that_matches_no_module_is_named() {
    let _rng = rng_lock();
    let initial = Net::<B>::new(1, &Default::default());
    let errors = launch::<Flex, _, String, _>(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        move |group| {
            let config = FsdpConfig {
                auto_wrap_policy: AutoWrapPolicy::Modules(vec!["Block".into(), "Blok".into()]),
                ..Default::default()
            };
            let fsdp =
                Fsdp::<B, _>::new(SharedGroup::new(group), config).map_err(|e| e.to_string())?;
            match fsdp.shard(initial.clone()) {
                Ok(_) => Err("a misspelt unit type must not shard silently as one unit".into()),
                Err(e) => Ok(e.to_string()),
            }
        },
    )
    .unwrap();
    for e in errors {
        assert!(
            e.contains("fsdp.auto_wrap_policy") && e.contains("Blok") && e.contains("Block"),
            "{e}"
        );
    }
}
