//! Mixed precision for [Burn](https://burn.dev) training loops.
//!
//! - [`Precision`]: the precision policy, parsed from Lightning's strings (`"bf16-mixed"`, ...)
//!   or HF's `bf16` / `fp16` flags.
//! - [`Autocast`] and [`autocast_ops`]: op-level autocast, as `torch.autocast` (a backend
//!   decorator used as `Autodiff<Autocast<B>>`; inside the scope matmuls run in half and
//!   reductions in f32, mixed dtypes promote).
//! - [`autocast`]: the half-precision *view* of an f32 model used for one forward pass under the
//!   mixed modes on any backend, and [`CastFloats`] to move inputs and outputs between dtypes.
//! - [`GradScaler`]: dynamic loss scaling for `16-mixed` (PyTorch's defaults).
//! - [`PrecisionPlugin`]: all of the above as one value a training loop holds (like
//!   Lightning's `Precision` plugin): the model's dtypes, the forward and backward passes, the
//!   loss scaler's step gate and its saved state.
//! - [`grads`]: whole-model gradient operations Burn 0.21 lacks: scaling, the global norm,
//!   global-norm clipping, the inf/NaN check.
//!
//! The crate works in any Burn loop on its own; the `afterburner` facade composes it with
//! accumulation and checkpointing.
//!
//! ```
//! use afterburner_precision::Precision;
//! let p: Precision = "bf16-mixed".parse().unwrap();
//! assert!(p.is_mixed());
//! assert!("bf16-mixd".parse::<Precision>().is_err());
//! ```
//!
//! ## Alone, in a plain Burn loop
//!
//! bf16-mixed and 16-mixed with a `GradScaler` in an ordinary Burn loop, per op and through the
//! view, without the `afterburner` facade (`examples/mixed_precision_loop.rs`, run as this doctest; `cargo run -p
//! afterburner-precision --example mixed_precision_loop`):
//!
//! ```
#![doc = include_str!("../examples/mixed_precision_loop.rs")]
//! ```

#![warn(missing_docs)]

pub mod autocast;
mod backend;
mod device_scaler;
mod error;
mod flops;
pub mod grads;
mod host_reads;
mod mode;
mod plugin;
mod policy;
mod scaler;

pub use autocast::{
    CastFloats, autocast_view, autocast_view_except, cast_module, materialize_params,
    shared_float_state,
};
pub use backend::{
    Autocast, autocast_dtype, autocast_ops, emulate_tf32, promotes_dtypes, record_autocast_nodes,
};
pub use device_scaler::DeviceScaler;
pub use error::PrecisionError;
pub use flops::{count_flops, flops_counted, set_flop_counting};
pub use host_reads::{
    HostReadTally, count_host_reads, host_reads_counted, host_reads_on_this_thread, spawn_counted,
};
pub use mode::AutocastMode;
pub use plugin::{OpScope, PrecisionPlugin};
pub use policy::Precision;
pub use scaler::{GradScaler, GradScalerConfig, GradScalerState};
