//! afterburner: training acceleration for [Burn](https://burn.dev), what Lightning Fabric,
//! HuggingFace Accelerate and HF's Trainer give PyTorch users.
//!
//! Keep an ordinary Burn training loop, change about six lines, and train in bf16 or fp16
//! mixed precision with gradient accumulation, global-norm clipping, activation checkpointing,
//! data parallel or fully sharded training, Local SGD or DiLoCo, and a resumable state; or
//! hand a model and datasets to the [`trainer::Trainer`].
//!
//! - [`Accelerator`] + [`AcceleratorConfig`] (from `afterburner-accelerator`, re-exported
//!   whole): `setup`, `forward`, `backward`, `step`, `clip_grad_norm`, `save_state` /
//!   `load_state` (and any named [`StateParts`]), `dataloader`; its strategy
//!   ([`StrategyConfig`], [`AnyStrategy`]) spreads training.
//! - [`data`]: a device-aware data loader over Burn's `Dataset` and `Batcher` (prefetched on
//!   a background thread).
//! - [`rng`]: the one seeded generator (data shuffles and backend seeds).
//! - [`precision`]: re-export of `afterburner-precision` (policies, autocast, loss scaling).
//! - [`checkpoint`]: re-export of `afterburner-checkpoint` (`Checkpointed` blocks and the
//!   policies behind the config's `gradient_checkpointing`).
//! - [`parallel`]: re-export of `afterburner-parallel`; `strategy = "ddp"`, `"zero-1"` or
//!   `"fsdp"` with [`Accelerator::launch`] trains on one worker thread per device, and with
//!   `Accelerator::launch_mpi` (feature `mpi`) on one process per device under `mpirun`.
//! - [`localsgd`]: re-export of `afterburner-localsgd`; `strategy = "local-sgd"` or
//!   `"diloco"` average parameters every K steps instead of gradients every step.
//! - [`trainer`]: HF's Trainer and TrainingArguments over the Accelerator.
//! - [`weights`]: pretrained weights from safetensors and PyTorch files.
//!
//! Saves are atomic (all ranks or none), rotated with `save_checkpoint` (`[project]`
//! `keep_last`), and a run can stop gracefully on SIGTERM (`stop_on_signal`). The reference
//! models and built-in data of the examples are in `afterburner-demos`.

#![warn(missing_docs)]

pub use afterburner_accelerator::*;

pub mod trainer;
