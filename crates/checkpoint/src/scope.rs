//! Per-thread checkpointing context: the policy of the current forward pass, the block counter
//! that `every-<k>` needs, whether we are inside a recomputed region, and the seed stream that
//! makes randomness inside a block replay identically.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::LocalKey;

use crate::{BlockKind, CheckpointPolicy};

/// Seed of the block seed stream until [`seed_blocks`] is called.
const DEFAULT_STREAM: u64 = 0x5EED_B10C_4A11_0C8E;

struct Scope {
    /// The policy of the innermost [`with_policy`]; `None` outside any.
    policy: Option<CheckpointPolicy>,
    next_block: usize,
    in_recomputed_region: bool,
    stream: u64,
}

thread_local! {
    static SCOPE: RefCell<Scope> = const {
        RefCell::new(Scope {
            policy: None,
            next_block: 0,
            in_recomputed_region: false,
            stream: DEFAULT_STREAM,
        })
    };
}

/// Runs `forward` with `policy` deciding which wrapped blocks are recomputed. Blocks are
/// counted from 0 for `every-<k>`. Nested calls apply the inner policy inside.
///
/// Outside any `with_policy` nothing is recomputed: a model whose blocks are `Checkpointed`
/// trains as usual until a policy turns checkpointing on (like HF's
/// `gradient_checkpointing_enable()`; the Accelerator sets its config's policy).
pub fn with_policy<R>(policy: CheckpointPolicy, forward: impl FnOnce() -> R) -> R {
    let saved = SCOPE.with_borrow_mut(|s| {
        let saved = (s.policy, s.next_block);
        s.policy = Some(policy);
        s.next_block = 0;
        saved
    });
    let _restore = Restore(move || {
        SCOPE.with_borrow_mut(|s| (s.policy, s.next_block) = saved);
    });
    forward()
}

/// Runs a closure under per-thread state that a block's recompute must see as its forward did
/// (an op-level autocast scope, say). Recomputes run on a helper thread, where the forward
/// thread's thread-locals are not set.
pub type ReplayContext = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

thread_local! {
    static REPLAY: RefCell<Option<ReplayContext>> = const { RefCell::new(None) };
}

/// Runs `forward` with `context` recorded by every block checkpointed inside it: each
/// recompute of such a block (the block's forward again and its nested backward) runs inside
/// `context`, on the helper thread that runs it, as
/// `torch.utils.checkpoint` restores the forward's autocast state. The `afterburner`
/// Accelerator passes its op-level autocast scope; nested calls apply the inner context.
pub fn with_replay_context<R>(context: ReplayContext, forward: impl FnOnce() -> R) -> R {
    let saved = REPLAY.with_borrow_mut(|r| r.replace(context));
    let mut saved = Some(saved);
    let _restore = Restore(move || {
        if let Some(saved) = saved.take() {
            REPLAY.with_borrow_mut(|r| *r = saved);
        }
    });
    forward()
}

/// The context of the innermost [`with_replay_context`] on this thread.
pub(crate) fn replay_context() -> Option<ReplayContext> {
    REPLAY.with_borrow(Clone::clone)
}

/// The policy in force on this thread (`none` outside [`with_policy`]).
pub fn current_policy() -> CheckpointPolicy {
    SCOPE.with_borrow(|s| s.policy.unwrap_or_default())
}

/// Whether wrapped blocks replay their randomness here: inside any [`with_policy`] (`none`
/// included, so a run with checkpointing off draws the same as one with it on) and inside a
/// recomputed block. Outside, a wrapper leaves the backend RNG alone, exactly like the
/// unwrapped block.
pub(crate) fn replays_rng() -> bool {
    SCOPE.with_borrow(|s| s.policy.is_some() || s.in_recomputed_region)
}

/// Restarts this thread's block seed stream from `seed`.
///
/// Each wrapped block draws one seed from the stream per forward pass and seeds the backend
/// with it before running, so its random ops (dropout) draw the same values when recomputed.
/// The `afterburner` Accelerator calls this at every step from its own seed.
pub fn seed_blocks(seed: u64) {
    SCOPE.with_borrow_mut(|s| s.stream = seed);
}

/// Decides whether the next wrapper of `kind` is recomputed, and counts it.
pub(crate) fn decide(kind: BlockKind) -> bool {
    SCOPE.with_borrow_mut(|s| {
        if s.in_recomputed_region {
            // Already inside a recomputed block: nested wrappers run plain.
            return false;
        }
        let index = s.next_block;
        if kind == BlockKind::Block {
            s.next_block += 1;
        }
        s.policy.unwrap_or_default().checkpoints(kind, index)
    })
}

/// The next seed of this thread's block seed stream.
pub(crate) fn next_block_seed() -> u64 {
    SCOPE.with_borrow_mut(|s| {
        s.stream = s.stream.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(s.stream)
    })
}

/// Enters a block's region: its nested wrappers draw from a stream derived from `seed` (so they
/// replay too), and, when `recomputed`, run plain. Undone when the guard drops.
pub(crate) fn enter_block(seed: Option<u64>, recomputed: bool) -> impl Drop {
    let saved = SCOPE.with_borrow_mut(|s| {
        let saved = (s.stream, s.in_recomputed_region);
        if let Some(seed) = seed {
            s.stream = mix(seed ^ 0xB10C_0000_0000_0001);
        }
        s.in_recomputed_region |= recomputed;
        saved
    });
    Restore(move || {
        SCOPE.with_borrow_mut(|s| (s.stream, s.in_recomputed_region) = saved);
    })
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs its closure when dropped (restores a scope, also on unwinding).
pub(crate) struct Restore<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for Restore<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// A thread's values, one per backend type (each box holds that backend's value).
pub(crate) type ByBackend = RefCell<HashMap<TypeId, Box<dyn Any>>>;

/// Runs `run` with `value` as `slot`'s value for backend `B`, putting back what was there
/// after (also on unwinding).
pub(crate) fn with_value<B: 'static, R>(
    slot: &'static LocalKey<ByBackend>,
    value: Box<dyn Any>,
    run: impl FnOnce() -> R,
) -> R {
    let key = TypeId::of::<B>();
    let mut saved = Some(slot.with_borrow_mut(|map| map.insert(key, value)));
    let _restore = Restore(move || {
        slot.with_borrow_mut(|map| match saved.take().flatten() {
            Some(previous) => map.insert(key, previous),
            None => map.remove(&key),
        });
    });
    run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn every_kth_counts_blocks_per_scope() {
        let every2 = CheckpointPolicy::EveryKth(NonZeroUsize::new(2).unwrap());
        let picks = with_policy(every2, || {
            (0..4).map(|_| decide(BlockKind::Block)).collect::<Vec<_>>()
        });
        assert_eq!(picks, [true, false, true, false]);
        // A new scope restarts the count; outside any scope nothing is recomputed.
        assert!(with_policy(every2, || decide(BlockKind::Block)));
        assert!(!decide(BlockKind::Block));
        assert_eq!(current_policy(), CheckpointPolicy::None);
    }

    #[test]
    fn nested_wrappers_in_a_recomputed_block_run_plain_and_state_is_restored() {
        with_policy(CheckpointPolicy::All, || {
            {
                let _g = enter_block(Some(1), true);
                assert!(!decide(BlockKind::Block));
            }
            assert!(decide(BlockKind::Block));
        });
    }

    #[test]
    fn block_streams_replay() {
        seed_blocks(7);
        let first = next_block_seed();
        let inner_a = {
            let _g = enter_block(Some(first), false);
            next_block_seed()
        };
        let inner_b = {
            let _g = enter_block(Some(first), true);
            next_block_seed()
        };
        assert_eq!(inner_a, inner_b);
        assert_ne!(next_block_seed(), first);
        seed_blocks(7);
        assert_eq!(next_block_seed(), first);
    }
}
