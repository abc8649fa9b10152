//! Host reads on the threads that do a rank's step besides its own count towards the step:
//! DDP's communication thread (the ring engine copies each bucket to the host) and the helper
//! that recomputes a checkpointed block. `Accelerator::host_reads` (and
//! `host_reads_counted`) take them in; `host_reads_on_this_thread` keeps the step thread's own.

use std::sync::Arc;

use afterburner_accelerator::parallel::{Lighthouse, LocalReplicas, QuorumConfig};
use afterburner_accelerator::{
    Accelerator, AcceleratorConfig, Autocast, CheckpointPolicy, Checkpointed, NonFinitePolicy,
    ParallelismConfig, host_reads_on_this_thread,
};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

type B = Autodiff<Autocast<Flex>>;

/// Three checkpointable linear blocks.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    blocks: Vec<Checkpointed<B, Linear<B>>>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let blocks = (0..3)
            .map(|_| Checkpointed::new(LinearConfig::new(8, 8).init(device)))
            .collect();
        Self { blocks }
    }

    /// The blocks in turn; the first reads its input on the host when `read_in_block` (each
    /// time it runs: its forward, and its recompute when checkpointed).
    fn forward(&self, mut x: Tensor<B, 2>, read_in_block: bool) -> Tensor<B, 2> {
        for (index, block) in self.blocks.iter().enumerate() {
            let read = read_in_block && index == 0;
            x = block.forward(x, move |linear: &Linear<B>, x: Tensor<B, 2>| {
                if read {
                    let _ = x.clone().into_data();
                }
                linear.forward(x).tanh()
            });
        }
        x
    }
}

/// A config reading nothing in `step` (no skip guard, no clipping) under `strategy`.
fn config(strategy: &str, checkpointing: CheckpointPolicy) -> AcceleratorConfig {
    AcceleratorConfig {
        nonfinite_gradients: NonFinitePolicy::Apply,
        gradient_checkpointing: checkpointing,
        parallelism: ParallelismConfig {
            strategy: strategy.parse().unwrap(),
            ..Default::default()
        },
        seed: 3,
        ..Default::default()
    }
}

/// Per step of a 4-step loop (one micro-batch per step: DDP reduces during backward): the
/// reads of the step counted with its helper threads, and the step thread's own.
fn steps(acc: &mut Accelerator<B>, read_in_block: bool) -> Vec<(u64, u64)> {
    let device = *acc.device();
    let mut model = acc.setup_model(Net::<B>::new(&device)).unwrap();
    let mut optim = SgdConfig::new().init();
    let mut counted = Vec::new();
    for _ in 0..4 {
        let x = Tensor::<B, 2>::random([4, 8], Distribution::Default, &device);
        let (all, own) = (acc.host_reads(), host_reads_on_this_thread());
        let out = acc
            .forward(&model, x, |m, x| m.forward(x, read_in_block))
            .unwrap();
        acc.backward(out.powi_scalar(2).mean(), &model).unwrap();
        model = acc.step(model, &mut optim, &mut 0.1).unwrap();
        // The communication thread has handed back this step's sums: its reads are in.
        counted.push((acc.host_reads() - all, host_reads_on_this_thread() - own));
    }
    counted
}

#[test]
fn a_recomputed_blocks_host_read_counts_towards_the_step() {
    for (checkpointing, expected) in [(CheckpointPolicy::None, 1), (CheckpointPolicy::All, 2)] {
        let mut acc =
            Accelerator::<B>::new(config("single-device", checkpointing), Default::default())
                .unwrap();
        let counted = steps(&mut acc, true);
        // The forward's read on the step thread; its recompute's on the helper thread.
        assert_eq!(
            counted,
            vec![(expected, 1); 4],
            "{checkpointing:?}: (the step's reads, the step thread's own) per step"
        );
    }
}

#[test]
fn ddp_over_the_ring_counts_its_communication_threads_bucket_copies() {
    // The ring engine (the launcher's) on 2 in-process ranks: the communication thread copies
    // the one bucket (25 MiB holds every gradient) to the host each step.
    let lighthouse = Lighthouse::new(QuorumConfig::new(2)).unwrap();
    let ranks: Vec<Vec<(u64, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let lighthouse = Arc::clone(&lighthouse);
                scope.spawn(move || {
                    let device = Default::default();
                    let group = lighthouse
                        .replica::<Autocast<Flex>>(rank, &device)
                        .unwrap()
                        .failing_together();
                    let config = config("ddp", CheckpointPolicy::None);
                    let mut acc =
                        Accelerator::<B>::with_group(config, device, Box::new(group)).unwrap();
                    steps(&mut acc, false)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, counted) in ranks.iter().enumerate() {
        assert_eq!(
            counted,
            &vec![(1, 0); 4],
            "rank {rank}: (the step's reads, the step thread's own) per step"
        );
    }

    // burn-collective's in-process engine exchanges device tensors: nothing read anywhere.
    let ranks = Accelerator::<B>::launch(
        config("ddp", CheckpointPolicy::None),
        vec![Default::default(); 2],
        |mut acc| Ok(steps(&mut acc, false)),
    )
    .unwrap();
    for (rank, counted) in ranks.iter().enumerate() {
        assert_eq!(counted, &vec![(0, 0); 4], "rank {rank}, in-process engine");
    }
}
