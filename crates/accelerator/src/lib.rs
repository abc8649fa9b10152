//! afterburner-accelerator: the `Accelerator` of [afterburner](https://crates.io/crates/afterburner),
//! training acceleration for [Burn](https://burn.dev) (Lightning Fabric's and HF Accelerate's
//! counterpart). Keep an ordinary Burn training loop, change about six lines, and train in
//! bf16 or fp16 mixed precision with gradient accumulation, global-norm clipping, activation
//! checkpointing, data parallel or sharded training and a resumable state. `afterburner`
//! re-exports everything here, beside its Trainer.
//!
//! - [`Accelerator`] + [`AcceleratorConfig`]: the facade (Fabric/Accelerate style): `setup`,
//!   `forward`, `backward`, `step`, `clip_grad_norm`, `save_state` / `load_state` (and any
//!   named [`StateParts`]), `dataloader`; its strategy ([`AnyStrategy`]) spreads training and
//!   its [`Checkpointer`] ([`FileCheckpointer`] by default) stores the saved states.
//! - [`ParallelismConfig`]: how training is spread over devices as one value (the strategy, the
//!   devices, `tp_size`), flattened into [`AcceleratorConfig`] and the Trainer's arguments.
//! - [`data`]: a device-aware data loader over Burn's `Dataset` and `Batcher` (prefetched on
//!   a background thread).
//! - [`rng`]: the one seeded generator (data shuffles and backend seeds).
//! - [`precision`]: re-export of `afterburner-precision` (policies, autocast, loss scaling).
//! - [`checkpoint`]: re-export of `afterburner-checkpoint` (`Checkpointed` blocks and the
//!   policies behind the config's `gradient_checkpointing`).
//!
//! - [`parallel`]: re-export of `afterburner-parallel`; `strategy = "ddp"`, `"zero-1"` or
//!   `"fsdp"` with [`Accelerator::launch`] trains on one worker thread per device, and with
//!   `Accelerator::launch_mpi` (feature `mpi`) on one process per device under `mpirun`.
//!
//! - [`localsgd`]: re-export of `afterburner-localsgd`; `strategy = "local-sgd"` or
//!   `"diloco"` average parameters every K steps instead of gradients every step.
//! - [`weights`]: pretrained weights from safetensors and PyTorch files.
//! - [`throughput`]: re-export of `afterburner-throughput` (samples, tokens, FLOP/s and MFU
//!   over a window of steps, peak memory).
//!
//! Saves are atomic (all ranks or none), rotated with `save_checkpoint` (`[project]`
//! `keep_last`), and a run can stop gracefully on SIGTERM (`stop_on_signal`).

#![warn(missing_docs)]

mod accelerator;
mod config;
pub mod data;
mod device_step;
mod distributed;
mod error;
mod finite;
mod forward;
mod gradients;
mod group;
mod join;
mod launched;
mod outcome;
mod parallelism;
mod quiet;
mod save;
mod stop;
mod strategy;
pub mod suggest;
pub mod weights;

pub use accelerator::{Accelerator, Counters, StepOutcome};
pub use afterburner_checkpoint as checkpoint;
pub use afterburner_checkpoint::{CheckpointPolicy, Checkpointed};
pub use afterburner_localsgd as localsgd;
pub use afterburner_parallel as parallel;
pub use afterburner_parallel::rng;
pub use afterburner_parallel::{
    AutoWrapPolicy, FsdpConfig, ParallelStrategy, ShardingStrategy, StateDictType, StateSaving,
};
pub use afterburner_precision as precision;
pub use afterburner_precision::{
    Autocast, HostReadTally, Precision, count_flops, count_host_reads, flops_counted,
    host_reads_counted, host_reads_on_this_thread,
};
pub use afterburner_throughput as throughput;
pub use config::{AcceleratorConfig, AutocastMode, NonFinitePolicy, ProjectConfig};
pub use device_step::SettledSteps;
pub use error::AccelerateError;
pub use group::Group;
pub use parallelism::ParallelismConfig;
pub use save::{Checkpointer, FileCheckpointer, StateFiles, StateParts, Stateful, is_state_dir};
pub use strategy::{
    AnyStrategy, NamedStrategy, NoStrategy, RegisteredConfig, StrategyConfig, register_strategy,
};
