//! The training state as a set of named parts: models, optimizers, LR schedulers and any
//! [`Stateful`] object (a Trainer's counters, DiLoCo's outer optimizer), each saved as its own
//! checksummed file by [`Accelerator::save_parts`](crate::Accelerator::save_parts) and restored
//! in place by [`Accelerator::load_parts`](crate::Accelerator::load_parts), like Accelerate's
//! `register_for_checkpointing`.
//!
//! Loading is two-phase: every part is decoded and checked first ("staged"); only when all of
//! them succeeded on every rank is anything replaced ("committed").

mod checks;
mod slots;

pub(crate) use checks::refuse_nonfinite_models;

use std::any::Any;
use std::path::Path;

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;
use serde::de::DeserializeOwned;

use afterburner_parallel::ParallelStrategy;

use crate::{AccelerateError, Accelerator, AnyStrategy};
use slots::{ModelSlot, OptimizerSlot, SchedulerSlot, ValueSlot};

/// An object saved with the training state as one named part, by hand-written conversions
/// (a serde type needs none: add it with [`StateParts::serde`]).
pub trait Stateful: Sized {
    /// This object's state as bytes.
    fn to_state_bytes(&self) -> Result<Vec<u8>, String>;

    /// This object with `bytes` (from [`to_state_bytes`](Self::to_state_bytes)) loaded, as a
    /// new value: `self` stays unchanged until every part of the state has loaded.
    fn with_state_bytes(&self, bytes: &[u8]) -> Result<Self, String>;
}

/// The named parts of a training state, borrowed for one save or load:
///
/// ```ignore
/// let mut parts = StateParts::new()
///     .model("model", &mut model)
///     .optimizer::<MyModel<B>, _>("optimizer", &mut optim)
///     .optimizer::<MyModel<B>, _>("critic_optimizer", &mut critic_optim)
///     .scheduler("scheduler", &mut lr)
///     .serde("trainer", &mut counters);   // any serde type
/// acc.save_parts(&dir, &parts)?;
/// // later, in a fresh run built the same way:
/// acc.load_parts(&dir, &mut parts)?;
/// ```
///
/// A name is letters, digits, `-` and `_`, unique (ignoring case: file systems may), and not
/// `accelerator` (the Accelerator's own part: counters, loss scale, seed, data position).
/// Loading needs exactly the parts the state holds: a missing or an unknown part is an error
/// naming it. Every rank builds the same parts in the same order.
pub struct StateParts<'a, B: AutodiffBackend, S: ParallelStrategy<B> = AnyStrategy<B>> {
    pub(crate) parts: Vec<Part<'a, B, S>>,
}

/// A named part.
pub(crate) type Part<'a, B, S> = (String, Box<dyn Slot<B, S> + 'a>);

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Default for StateParts<'_, B, S> {
    fn default() -> Self {
        Self { parts: Vec::new() }
    }
}

impl<'a, B: AutodiffBackend, S: ParallelStrategy<B>> StateParts<'a, B, S> {
    /// No parts yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A model (the one `setup`/`step` returned). Under a strategy that gathers a full state
    /// (FSDP with `state_dict_type = "full"`), its optimizers are gathered with it.
    pub fn model<M: AutodiffModule<B> + 'static>(mut self, name: &str, model: &'a mut M) -> Self {
        self.push(name, ModelSlot::new(model));
        self
    }

    /// An optimizer of a model of type `M`. A gathered (full) state saves it with the first
    /// model part of type `M`.
    pub fn optimizer<M, O>(mut self, name: &str, optimizer: &'a mut O) -> Self
    where
        M: AutodiffModule<B> + 'static,
        O: Optimizer<M, B>,
    {
        self.push(name, OptimizerSlot::<M, O, B>::new(optimizer));
        self
    }

    /// An LR scheduler.
    pub fn scheduler<L: LrScheduler>(mut self, name: &str, scheduler: &'a mut L) -> Self {
        self.push(name, SchedulerSlot::new(scheduler));
        self
    }

    /// Any serde value (a Trainer's counters, a user's tally), saved as named MessagePack.
    pub fn serde<T: Serialize + DeserializeOwned>(mut self, name: &str, value: &'a mut T) -> Self {
        self.push(name, ValueSlot::serde(value));
        self
    }

    /// Any [`Stateful`] object (hand-written conversions to and from bytes).
    pub fn stateful<T: Stateful>(mut self, name: &str, value: &'a mut T) -> Self {
        self.push(name, ValueSlot::stateful(value));
        self
    }

    fn push(&mut self, name: &str, slot: impl Slot<B, S> + 'a) {
        self.parts.push((name.to_string(), Box::new(slot)));
    }

    /// The part names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.parts.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Errors on a name that is empty, not plain, reserved or repeated.
    pub(crate) fn check_names(&self) -> Result<(), AccelerateError> {
        for (i, (name, _)) in self.parts.iter().enumerate() {
            let plain = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            let reason = if !plain {
                "a part name is letters, digits, '-' and '_'"
            } else if name.eq_ignore_ascii_case(ACCELERATOR_PART) {
                "'accelerator' is the Accelerator's own part"
            } else if name.eq_ignore_ascii_case(STRATEGY_PART) {
                "'strategy' is the strategy's own part"
            } else if self.parts[..i]
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                "the name is used twice (ignoring case)"
            } else {
                continue;
            };
            return Err(AccelerateError::InvalidPart {
                part: name.clone(),
                reason: reason.into(),
            });
        }
        Ok(())
    }

    /// The model part of type `M` (the first), for an optimizer of it.
    pub(crate) fn model_of<M: 'static>(&self) -> Option<&M> {
        self.parts
            .iter()
            .find_map(|(_, s)| s.model()?.downcast_ref())
    }
}

/// The reserved name of the Accelerator's own part.
pub(crate) const ACCELERATOR_PART: &str = "accelerator";
/// The reserved name of the strategy's own part.
pub(crate) const STRATEGY_PART: &str = "strategy";

/// The file a part is saved in.
pub(crate) fn part_file(name: &str) -> String {
    format!("{name}.mpk")
}

/// Whether a load reads each rank's own values or a gathered (full) state.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Each rank's own values.
    Local,
    /// A full state, to shard (every rank runs the part's collectives, in the same order).
    Gathered,
}

/// One part, type-erased: how it encodes, stages a load and commits it.
pub(crate) trait Slot<B: AutodiffBackend, S: ParallelStrategy<B>> {
    /// This rank's bytes of the part: local work only, no collective.
    fn encode(&self, acc: &Accelerator<B, S>) -> Result<Vec<u8>, AccelerateError>;

    /// Under a gathered save, after every rank encoded: the bytes rank 0 writes, from this
    /// rank's `local` ones (collectives; every rank calls, in the same order). `parts` gives
    /// an optimizer its model. Default: `local`.
    fn gather(
        &self,
        _acc: &Accelerator<B, S>,
        _parts: &StateParts<'_, B, S>,
        local: Vec<u8>,
    ) -> Result<Vec<u8>, AccelerateError> {
        Ok(local)
    }

    /// Collectives a gathered load needs before any part decodes (so a part that fails to
    /// decode on one rank cannot leave the others waiting in a collective).
    fn prepare_load(
        &mut self,
        _acc: &Accelerator<B, S>,
        _mode: Mode,
    ) -> Result<(), AccelerateError> {
        Ok(())
    }

    /// Decodes `bytes` and keeps the result; changes nothing visible.
    fn stage(
        &mut self,
        acc: &Accelerator<B, S>,
        mode: Mode,
        bytes: Vec<u8>,
        path: &Path,
        models: &[Part<'_, B, S>],
    ) -> Result<(), AccelerateError>;

    /// Replaces the borrowed object with the staged one.
    fn commit(&mut self, acc: &mut Accelerator<B, S>, mode: Mode) -> Result<(), AccelerateError>;

    /// The model, for model parts.
    fn model(&self) -> Option<&dyn Any> {
        None
    }

    /// The staged model, for model parts.
    fn staged_model(&self) -> Option<&dyn Any> {
        None
    }

    /// Whether this is a model part (staged first).
    fn is_model(&self) -> bool {
        false
    }

    /// Whether a model part holds an inf/NaN parameter (on this rank).
    fn has_nonfinite(&self) -> bool {
        false
    }

    /// Whether a gathered save needs this part's local bytes before gathering.
    fn encodes_locally(&self) -> bool {
        true
    }

    /// Under a load of per-rank states saved at another world size (ZeRO-1, FSDP): this
    /// part's bytes merged from every saved rank (`ranks[k]`: rank k's directory, read one at
    /// a time with [`rank_files`]), or `None` to take rank 0's. `name` is this part's name;
    /// `parts` gives an optimizer its model. Local work only.
    fn merge_ranks(
        &self,
        _acc: &Accelerator<B, S>,
        _parts: &StateParts<'_, B, S>,
        _name: &str,
        _ranks: &[std::path::PathBuf],
    ) -> Result<Option<Vec<u8>>, AccelerateError> {
        Ok(None)
    }
}

/// The verified bytes of each file `names` of the saved rank directory `dir` (the rest of the
/// directory is dropped at once).
pub(crate) fn rank_files<const N: usize>(
    checkpointer: &dyn crate::Checkpointer,
    dir: &std::path::Path,
    names: [&str; N],
) -> Result<[Vec<u8>; N], AccelerateError> {
    let mut files = checkpointer.read(dir)?;
    let mut take = |name: &str| {
        files
            .iter()
            .position(|(n, _)| n == name)
            .map(|i| files.swap_remove(i).1)
            .ok_or_else(|| AccelerateError::corrupt(dir.join(name), "missing"))
    };
    let mut out: [Vec<u8>; N] = std::array::from_fn(|_| Vec::new());
    for (slot, name) in out.iter_mut().zip(names) {
        *slot = take(name)?;
    }
    Ok(out)
}
