//! Local SGD and DiLoCo for [Burn](https://burn.dev), over `afterburner-parallel`'s
//! collectives: workers take optimizer steps alone and sync parameters every K steps, so K
//! times fewer bytes cross a slow link.
//!
//! - [`LocalSgd`]: average the parameters every `local_sgd_steps` optimizer steps
//!   (Accelerate's `LocalSGD`).
//! - [`DiLoCo`]: every `sync_every` steps, an outer optimizer (SGD with Nesterov momentum)
//!   steps a global copy of the parameters along the averaged pseudo-gradient
//!   `global - local` (Douillard et al. 2023).
//!
//! Both are [`ParallelStrategy`](afterburner_parallel::ParallelStrategy)s: the `afterburner`
//! Accelerator runs them with `strategy = "local-sgd"` or `"diloco"`, or call their phases from
//! your own loop. With `fragments`, `delay` and `mixing` DiLoCo becomes Streaming DiLoCo
//! (Douillard et al. 2025), its outer gradients sent as f32, bf16, f16 or int8
//! ([`OuterDtype`]).

#![warn(missing_docs)]

mod codec;
mod config;
mod diloco;
mod fragments;
mod local_sgd;
mod outer;
mod overlap;

pub use codec::OuterDtype;
pub use config::{DiLoCoConfig, LocalSgdConfig};
pub use diloco::DiLoCo;
pub use fragments::Fragments;
pub use local_sgd::LocalSgd;
pub use outer::OuterSgd;
