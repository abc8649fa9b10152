//! DDP on 2 CPU workers equals single-device training on the combined batch.

mod common;

use afterburner_parallel::{Ddp, LaunchConfig, ProcessGroup, launch};
use burn::backend::Flex;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use common::mlp::*;
use common::*;

/// Adds `b`'s gradients into `a` (in the model's visit order).
fn accumulate(model: &Mlp<B>, a: &mut GradientsParams, mut b: GradientsParams) {
    struct Add<'a> {
        a: &'a mut GradientsParams,
        b: &'a mut GradientsParams,
    }
    impl ModuleVisitor<B> for Add<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if let Some(g) = self.b.remove::<Flex, D>(p.id) {
                let sum = match self.a.remove::<Flex, D>(p.id) {
                    Some(old) => old + g,
                    None => g,
                };
                self.a.register::<Flex, D>(p.id, sum);
            }
        }
    }
    model.visit(&mut Add { a, b: &mut b });
}

/// 2 workers, each with its half of every batch split into `micro` micro-batches; returns
/// every rank's final parameters and gradient all-reduce count.
fn data_parallel(micro: usize) -> Vec<(Vec<f32>, u64)> {
    data_parallel_in_buckets(micro, afterburner_parallel::DEFAULT_BUCKET_CAP_MB)
}

/// [`data_parallel`] with gradient buckets of at most `cap_mb` MiB.
fn data_parallel_in_buckets(micro: usize, cap_mb: f64) -> Vec<(Vec<f32>, u64)> {
    let data = data();
    // Built here, not in the workers: Flex has one process-wide RNG, which concurrent workers
    // would draw from in any order. Rank 1 starts from other weights: setup must give it
    // rank 0's.
    let initial = [
        Mlp::<B>::new(1, &Default::default()),
        Mlp::<B>::new(1000, &Default::default()),
    ];
    launch::<Flex, _, String, _>(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        move |group| {
            let rank = group.rank();
            let mut ddp = Ddp::<B, _>::new(group)
                .with_bucket_cap_mb(cap_mb)
                .map_err(|e| e.to_string())?;
            let mut model = ddp
                .setup(initial[rank].clone())
                .map_err(|e| e.to_string())?;
            let mut optim = SgdConfig::new().init();
            let per_micro = BATCH / micro;
            for step in &data {
                let mut grads = GradientsParams::new();
                for m in 0..micro {
                    let from = rank * BATCH + m * per_micro;
                    let l = loss(&model, step, from, per_micro, 1.0 / micro as f64);
                    let g = GradientsParams::from_grads(l.backward(), &model);
                    accumulate(&model, &mut grads, g);
                }
                ddp.sync_gradients(&model, &mut grads)
                    .map_err(|e| e.to_string())?;
                model = optim.step(0.1, model, grads);
            }
            Ok((params(&model.valid()), ddp.all_reduce_count()))
        },
    )
    .unwrap()
}

#[test]
fn two_workers_equal_one_device_on_the_double_batch() {
    let _rng = rng_lock();
    let reference = single_device();
    let ranks = data_parallel(1);
    assert_eq!(ranks[0].0, ranks[1].0, "replicas must be identical");
    let err = max_rel(&ranks[0].0, &reference);
    println!(
        "DDP 2 x {BATCH} vs 1 x {}: max relative difference {err:e}",
        2 * BATCH
    );
    assert!(err <= 1e-5, "{err}");
    assert_eq!(ranks[0].1, STEPS as u64);
    assert_ne!(
        params(&Mlp::<B>::new(1, &Default::default())),
        reference,
        "training moved"
    );
}

#[test]
fn accumulation_syncs_once_per_step_with_the_same_result() {
    let _rng = rng_lock();
    let reference = single_device();
    let ranks = data_parallel(4);
    assert_eq!(ranks[0].0, ranks[1].0);
    for (rank, (_, count)) in ranks.iter().enumerate() {
        assert_eq!(
            *count, STEPS as u64,
            "rank {rank}: one all-reduce per optimizer step"
        );
    }
    let err = max_rel(&ranks[0].0, &reference);
    println!(
        "DDP 2 x (4 x {}) vs 1 x {}: max relative difference {err:e}",
        BATCH / 4,
        2 * BATCH
    );
    assert!(err <= 1e-5, "{err}");
}

#[test]
fn buckets_give_the_one_buffer_result_and_one_all_reduce_each() {
    let _rng = rng_lock();
    let one = data_parallel(1);
    let tensors = {
        struct Count(usize);
        impl ModuleVisitor<B> for Count {
            fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<B, D>>) {
                self.0 += 1;
            }
        }
        let mut count = Count(0);
        Mlp::<B>::new(1, &Default::default()).visit(&mut count);
        count.0
    };
    // A cap below any parameter: one bucket per parameter tensor.
    let each = data_parallel_in_buckets(1, 1e-9);
    let again = data_parallel_in_buckets(1, 1e-9);
    assert_eq!(each[0].0, each[1].0, "replicas must be identical");
    assert_eq!(each[0].0, again[0].0, "deterministic run to run");
    assert_eq!(
        each[0].1,
        (STEPS * tensors) as u64,
        "one all-reduce per bucket"
    );
    let err = max_rel(&each[0].0, &one[0].0);
    println!("{tensors} buckets vs one: max relative difference {err:e}");
    assert!(err <= 1e-6, "{err}");
    let refused =
        launch::<Flex, _, String, _>(vec![Default::default()], LaunchConfig::default(), |group| {
            let error = Ddp::<B, _>::new(group).with_bucket_cap_mb(0.0).err();
            Ok(error.map(|e| e.to_string()).unwrap_or_default())
        })
        .unwrap();
    assert!(refused[0].contains("bucket_cap_mb"), "{}", refused[0]);
}
