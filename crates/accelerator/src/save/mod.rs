//! The save stack (Fabric's `CheckpointIO`, Accelerate's `save_state`): everything between
//! the training loop and the state directories on disk, in one module.
//!
//! The entry point is the Accelerator's save and load methods, implemented here:
//! `save_state` / `load_state` (model, optimizer, scheduler), `save_parts` / `load_parts`
//! (any named [`StateParts`]) and `save_checkpoint` / `load_checkpoint` (numbered, rotated).
//! Where the files go is a value the Accelerator holds, its [`Checkpointer`]
//! ([`FileCheckpointer`], directories on disk, by default; `with_checkpointer` swaps it).
//! Inside, one file per job:
//!
//! - `checkpointer`: the [`Checkpointer`] trait (write, read, list, stage and commit, remove);
//! - `file_store`: [`FileCheckpointer`], the store on disk;
//! - `state`: the flow of a save and a load (check, stage every part, agree, commit) and the
//!   Accelerator's own part (`accelerator.json`);
//! - `parts`: the named parts and how each kind encodes, stages and commits;
//! - `codec`: a Burn record as the bytes of its part file;
//! - `files`: one directory on disk (what `file_store` uses): atomic write, manifest, verified read, crash debris;
//! - `sharded`: per-rank directories and the two-phase commit of a sharded save;
//! - `source`: where a load reads (the state, this rank's part, or every saved rank's merged);
//! - `rotation`: numbered checkpoints, the newest `keep_last` kept.
//!
//! What a strategy writes is its own ([`StateSaving`](afterburner_parallel::StateSaving));
//! the cross-rank votes are afterburner-parallel's ([`afterburner_parallel::same_on_every_rank`]).

mod checkpointer;
mod codec;
mod file_store;
mod files;
mod parts;
mod rotation;
mod sharded;
mod source;
mod state;

pub use checkpointer::{Checkpointer, StateFiles};
pub use file_store::FileCheckpointer;
pub use files::is_state_dir;
pub use parts::{StateParts, Stateful};
