//! Where afterburner's processes meet, with no Burn dependency (the line Burn draws between
//! burn-collective and burn-train): what `afterburner launch` and the workers share.
//!
//! - [`launched`]: the environment a launcher gives each worker ([`Launched`]: rank, world
//!   size, where the group meets, restarts, the given [`RestartPolicy`], the collective
//!   timeout), the
//!   shared [`TOKEN`](launched::TOKEN), and the bound on every timeout.
//! - [`Lighthouse`]: the coordinator of a fault-tolerant replica group. Every collective is a
//!   quorum of the replicas present: a replica that fails, leaves or misses
//!   [`QuorumConfig::timeout`] is dropped (a [`Departure`], kept in order), and the
//!   collective completes over the others, or fails when fewer than
//!   [`QuorumConfig::min_replicas`] are left; a live replica's state reaches a joining one.
//!   Host values only (f32): afterburner-parallel's `QuorumGroup` turns tensors into them.
//! - [`LighthouseServer`] and [`connect`]: the lighthouse over TCP, length-prefixed frames
//!   ([`wire`]); a replica's [`Connection`] is a [`Coordinator`], as the lighthouse itself is
//!   for replicas on threads of its process.
//! - The restart policy, settled at the rendezvous ([`PolicyRule`]): given to the launcher,
//!   or declared by the workers ([`Declaration`]: the strategy each runs and the policy it
//!   needs; a worker that does not fit is refused, naming both); the launcher reads it back
//!   ([`Lighthouse::restart_policy`], [`ask_restart_policy`] from another node).
//! - [`RendezvousError`]: what all of it reports, naming the rank or setting.
//!
//! `cargo run -p afterburner-rendezvous --example lighthouse -- --replicas 3` serves a
//! lighthouse for replicas in other processes (docs/fault-tolerance.md).

#![warn(missing_docs)]

mod agreement;
mod config;
mod coordinator;
pub mod engine;
mod error;
pub mod launched;
mod lighthouse;
mod round;
mod tcp;
pub mod wire;

pub use agreement::{Declaration, PolicyRule, Settled};
pub use config::QuorumConfig;
pub use coordinator::Coordinator;
pub use engine::Engine;
pub use error::RendezvousError;
pub use launched::{Launched, RestartPolicy};
pub use lighthouse::{Departure, Donation, Lighthouse, Reply, Session};
pub use round::Op;
pub use tcp::{Connection, LighthouseServer, ask_restart_policy, connect};
