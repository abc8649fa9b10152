//! One case of the matrix: a value on every axis a user configures, and the generator of
//! every case ([`all_cases`]) and of CI's fixed sample ([`sample`]).

use afterburner::localsgd::LocalSgdConfig;
use afterburner::parallel::{AutoWrapPolicy, DdpConfig, FsdpConfig, ShardingStrategy};
use afterburner::{ParallelismConfig, Precision, StrategyConfig};

/// How the run is spread over devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// One device, no collectives.
    SingleDevice,
    /// DDP on 2 ranks (its defaults: one bucket, reduced during backward at one micro-batch
    /// per step).
    Ddp,
    /// DDP on 2 ranks in buckets of [`SMALL_BUCKET_MB`] (several a step), during backward.
    DdpBuckets,
    /// DDP on 2 ranks in buckets of [`SMALL_BUCKET_MB`], after backward (`overlap = false`).
    DdpAfterBackward,
    /// ZeRO-1 on 2 ranks.
    Zero1,
    /// FSDP on 2 ranks, every transformer block a unit, under a sharding strategy.
    Fsdp(ShardingStrategy),
    /// Tensor parallelism on 2 ranks (the demo transformer's plan).
    Tp2,
    /// 4 ranks: 2 data-parallel groups of tp 2, DDP across them.
    Dp2Tp2Ddp,
    /// 4 ranks: 2 data-parallel groups of tp 2, FSDP (full shard) across them.
    Dp2Tp2Fsdp,
    /// Local SGD on 2 ranks, averaging every step (K = 1): DDP's update under plain SGD.
    LocalSgd,
}

/// The bucket size of the DDP cases with several buckets: 4 KiB (the demo transformer's
/// gradients take several).
pub const SMALL_BUCKET_MB: f64 = 0.004;

impl Strategy {
    /// Every value, in the table's order.
    pub const ALL: [Strategy; 12] = [
        Strategy::SingleDevice,
        Strategy::Ddp,
        Strategy::DdpBuckets,
        Strategy::DdpAfterBackward,
        Strategy::Zero1,
        Strategy::Fsdp(ShardingStrategy::Full),
        Strategy::Fsdp(ShardingStrategy::GradOp),
        Strategy::Fsdp(ShardingStrategy::NoShard),
        Strategy::Tp2,
        Strategy::Dp2Tp2Ddp,
        Strategy::Dp2Tp2Fsdp,
        Strategy::LocalSgd,
    ];

    /// Ranks of the run.
    pub fn devices(self) -> usize {
        match self {
            Strategy::SingleDevice => 1,
            Strategy::Dp2Tp2Ddp | Strategy::Dp2Tp2Fsdp => 4,
            _ => 2,
        }
    }

    /// Ranks of a tensor-parallel group.
    pub fn tp_size(self) -> usize {
        match self {
            Strategy::Tp2 | Strategy::Dp2Tp2Ddp | Strategy::Dp2Tp2Fsdp => 2,
            _ => 1,
        }
    }

    /// Data-parallel ranks: how many ways each micro-batch of the step is split.
    pub fn dp_size(self) -> usize {
        self.devices() / self.tp_size()
    }

    /// The Accelerator's (and the Trainer's) parallelism settings.
    pub fn parallelism(self) -> ParallelismConfig {
        let fsdp = |sharding_strategy| {
            StrategyConfig::Fsdp(FsdpConfig {
                sharding_strategy,
                auto_wrap_policy: "TransformerBlock"
                    .parse::<AutoWrapPolicy>()
                    .expect("a module type name is a wrap policy"),
                ..Default::default()
            })
        };
        let strategy = match self {
            Strategy::SingleDevice => StrategyConfig::SingleDevice,
            Strategy::Ddp | Strategy::Tp2 | Strategy::Dp2Tp2Ddp => {
                StrategyConfig::Ddp(Default::default())
            }
            Strategy::DdpBuckets => StrategyConfig::Ddp(DdpConfig {
                bucket_cap_mb: SMALL_BUCKET_MB,
                overlap: true,
            }),
            Strategy::DdpAfterBackward => StrategyConfig::Ddp(DdpConfig {
                bucket_cap_mb: SMALL_BUCKET_MB,
                overlap: false,
            }),
            Strategy::Zero1 => StrategyConfig::Zero1(Default::default()),
            Strategy::Fsdp(sharding) => fsdp(sharding),
            Strategy::Dp2Tp2Fsdp => fsdp(ShardingStrategy::Full),
            Strategy::LocalSgd => StrategyConfig::LocalSgd(LocalSgdConfig {
                local_sgd_steps: 1,
                ..Default::default()
            }),
        };
        ParallelismConfig {
            strategy,
            devices: self.devices(),
            tp_size: self.tp_size(),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::SingleDevice => write!(f, "single-device"),
            Strategy::Ddp => write!(f, "ddp"),
            Strategy::DdpBuckets => write!(f, "ddp 4 KiB buckets"),
            Strategy::DdpAfterBackward => write!(f, "ddp 4 KiB buckets after backward"),
            Strategy::Zero1 => write!(f, "zero-1"),
            Strategy::Fsdp(sharding) => write!(f, "fsdp {sharding}"),
            Strategy::Tp2 => write!(f, "tp 2"),
            Strategy::Dp2Tp2Ddp => write!(f, "dp 2 x tp 2 ddp"),
            Strategy::Dp2Tp2Fsdp => write!(f, "dp 2 x tp 2 fsdp"),
            Strategy::LocalSgd => write!(f, "local-sgd K=1"),
        }
    }
}

/// How the loss of a step is normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Norm {
    /// Whole windows (no padding), the mean over each micro-batch's targets.
    Mean,
    /// Padded windows, the step's loss summed over every rank's and micro-batch's targets
    /// and divided by their number (HF's `num_items_in_batch`, the Trainer's `per-item`).
    PerItem,
}

/// What the loss reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossShape {
    /// The model's output through `acc.forward` only.
    Plain,
    /// And a weight penalty on the model read outside `acc.forward`
    /// ([`super::data::aux_term`]).
    Aux,
    /// And a term from a second, plain forward of the model outside `acc.forward`.
    SecondForward,
}

impl LossShape {
    /// Every value, in the table's order.
    pub const ALL: [LossShape; 3] = [LossShape::Plain, LossShape::Aux, LossShape::SecondForward];
}

/// Who decides the step (and so the optimizer: the device-decided step is the Trainer's
/// gated AdamW, the host-decided one plain SGD, under which every error in a gradient shows
/// in the update).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `acc.step` with plain SGD (the Trainer's `optim = "sgd"`).
    Host,
    /// `DeviceAdamW` / `acc.step_on_device` (the Trainer's default AdamW).
    Device,
}

/// Who writes the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entry {
    /// A hand-written Accelerator loop.
    Loop,
    /// The Trainer.
    Trainer,
}

/// One combination of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    /// How the run is spread.
    pub strategy: Strategy,
    /// Micro-batches per optimizer step (gradient accumulation).
    pub micro_batches: usize,
    /// Loss normalisation.
    pub norm: Norm,
    /// Precision policy.
    pub precision: Precision,
    /// Activation checkpointing of every block ("all") or none.
    pub checkpointing: bool,
    /// What the loss reads.
    pub loss: LossShape,
    /// Who decides the step.
    pub step: Step,
    /// Who writes the loop.
    pub entry: Entry,
}

/// The precisions of the matrix.
pub fn precisions() -> [Precision; 3] {
    ["32-true", "bf16-mixed", "16-mixed"].map(|p| p.parse().expect("a precision"))
}

/// Who may decide the steps of `strategy` in the matrix: both, but Local SGD is in it with
/// plain SGD only (the host-decided step): under AdamW its ranks' moments see only their own
/// gradients, so no run of it equals one device, by design.
pub fn steps(strategy: Strategy) -> &'static [Step] {
    match strategy {
        Strategy::LocalSgd => &[Step::Host],
        _ => &[Step::Host, Step::Device],
    }
}

/// The loss shapes of `strategy` in the matrix: all, but FSDP that shards parameters (full,
/// grad-op, dp x tp) has no second plain forward: outside `acc.forward` its model holds
/// shards, and a forward on them panics inside Burn (an embedding index out of bounds), not
/// yet a named error (docs/equivalence.md). Its weight penalty is refused by name.
pub fn losses(strategy: Strategy) -> &'static [LossShape] {
    match strategy {
        Strategy::Fsdp(ShardingStrategy::Full | ShardingStrategy::GradOp)
        | Strategy::Dp2Tp2Fsdp => &[LossShape::Plain, LossShape::Aux],
        _ => &LossShape::ALL,
    }
}

/// Every case of the matrix, axis by axis (the strategy outermost).
pub fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for strategy in Strategy::ALL {
        for micro_batches in [1, 3] {
            for norm in [Norm::Mean, Norm::PerItem] {
                for precision in precisions() {
                    for checkpointing in [false, true] {
                        for &loss in losses(strategy) {
                            for &step in steps(strategy) {
                                for entry in [Entry::Loop, Entry::Trainer] {
                                    cases.push(Case {
                                        strategy,
                                        micro_batches,
                                        norm,
                                        precision,
                                        checkpointing,
                                        loss,
                                        step,
                                        entry,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    cases
}

/// CI's fixed sample: for every strategy, `per_strategy` cases that walk the other axes
/// together, so that every value of every axis appears and (from 4 per strategy) each
/// strategy meets both entries and both steps.
pub fn sample(per_strategy: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for (s, strategy) in Strategy::ALL.into_iter().enumerate() {
        for k in 0..per_strategy {
            // Bit `b` of `k + s`, so that the two-valued axes take every combination.
            let bit = |b: u32| ((k + s) >> b) & 1;
            cases.push(Case {
                strategy,
                micro_batches: [1, 3][bit(0)],
                norm: [Norm::Mean, Norm::PerItem][bit(1)],
                precision: precisions()[(k + 2 * s) % 3],
                checkpointing: [false, true][bit(2)],
                loss: losses(strategy)[(k + s + k / 3) % losses(strategy).len()],
                step: steps(strategy)[k % steps(strategy).len()],
                entry: [Entry::Loop, Entry::Trainer][(k / 2) % 2],
            });
        }
    }
    cases
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} | {} | {} | {} | {} | {} | {} | {}",
            self.strategy,
            self.micro_batches,
            match self.norm {
                Norm::Mean => "mean",
                Norm::PerItem => "per-item",
            },
            self.precision,
            match self.checkpointing {
                true => "all",
                false => "none",
            },
            match self.loss {
                LossShape::Plain => "plain",
                LossShape::Aux => "aux",
                LossShape::SecondForward => "forward",
            },
            match self.step {
                Step::Host => "host",
                Step::Device => "device",
            },
            match self.entry {
                Entry::Loop => "loop",
                Entry::Trainer => "trainer",
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_takes_every_value_of_every_axis() {
        let sample = sample(16);
        let all = all_cases();
        assert!(sample.iter().all(|case| all.contains(case)));
        let seen = |pick: &dyn Fn(&Case) -> String| {
            let mut values: Vec<String> = sample.iter().map(pick).collect();
            values.sort();
            values.dedup();
            values.len()
        };
        assert_eq!(seen(&|c| c.strategy.to_string()), Strategy::ALL.len());
        assert_eq!(seen(&|c| c.micro_batches.to_string()), 2);
        assert_eq!(seen(&|c| format!("{:?}", c.norm)), 2);
        assert_eq!(seen(&|c| c.precision.to_string()), 3);
        assert_eq!(seen(&|c| c.checkpointing.to_string()), 2);
        assert_eq!(seen(&|c| format!("{:?}", c.loss)), 3);
        assert_eq!(seen(&|c| format!("{:?}", c.step)), 2);
        assert_eq!(seen(&|c| format!("{:?}", c.entry)), 2);
        // Every strategy meets both entries under each step it has.
        for strategy in Strategy::ALL {
            for &step in steps(strategy) {
                for entry in [Entry::Loop, Entry::Trainer] {
                    assert!(
                        sample
                            .iter()
                            .any(|c| c.strategy == strategy && c.step == step && c.entry == entry),
                        "{strategy} {step:?} {entry:?}"
                    );
                }
            }
        }
    }
}
