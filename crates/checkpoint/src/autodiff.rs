//! The checkpointed call on Burn's `Autodiff<_, _>` backend, built from custom autodiff ops.
//!
//! Forward: the block runs on *untracked* copies of its input and parameters, so no activation
//! is recorded; one `Recompute` node is added whose parents are the input and the parameters
//! (joined by no-op `Link` nodes, since a node has a fixed number of parents).
//!
//! Backward of that node: the block runs again on a helper thread, on fresh leaves each seen
//! through a `Tap` node, and a nested backward is seeded with the incoming gradient (`Seed`).
//! Each tap sends its leaf's final gradient through a channel when the nested backward reaches
//! it; the outer step registers them under the input's and parameters' own nodes. The thread is
//! needed because Burn 0.21 runs a backward step while holding its graph's lock and ends every
//! backward by visiting all graphs: nesting on the same thread deadlocks. The helper finishes its
//! nested cleanup after the outer backward releases the lock.

use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::Duration;

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::FloatDType;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;

use crate::job::{BlockFn, Job};
use crate::scope::{self, ReplayContext};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;
/// Burn's autodiff float primitive (`AutodiffTensor<I>`): a value and its graph node.
type Tracked<I> = FloatTensor<Autodiff<I>>;
/// A gradient delivered by a tap: the slot it belongs to, `None` when none reached it.
type Delivery<I> = (usize, Option<FloatTensor<I>>);

/// How often the outer step checks that the helper is still alive while it waits.
const HELPER_POLL: Duration = Duration::from_millis(50);

/// The checkpointed call (see the module docs). Falls back to a plain call when `B` is not
/// Burn's `Autodiff` or the block uses a tracked tensor it was not given.
pub(crate) fn apply<B: AutodiffBackend>(job: Job<B>) -> FloatTensor<B> {
    let Job { slots, block } = job;
    let nodes: Result<Vec<Tracked<Inner<B>>>, _> = slots
        .iter()
        .cloned()
        .map(convert::<_, Tracked<Inner<B>>>)
        .collect();
    let Ok(nodes) = nodes else {
        warn_once(
            "the autodiff backend is not burn's Autodiff<_, _>: wrapped blocks run without \
             checkpointing",
        );
        return block(slots, false);
    };
    let tracked: Vec<(usize, NodeId)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.is_tracked())
        .map(|(slot, node)| (slot, node.node.id))
        .collect();
    if tracked.is_empty() {
        // Nothing needs a gradient: no graph is recorded anyway.
        return block(slots, false);
    }

    let untracked = slots
        .iter()
        .map(|t| B::from_inner(B::inner(t.clone())))
        .collect();
    let output: Tracked<Inner<B>> = expect_same(block(untracked, true));
    if output.is_tracked() {
        warn_once(
            "a checkpointed block used a tensor that requires gradients but is neither its \
             input nor one of its parameters (captured by the closure?): such calls run \
             without checkpointing",
        );
        return block(slots, false);
    }

    let anchor = tracked
        .iter()
        .map(|&(slot, _)| nodes[slot].clone())
        .reduce(link)
        .expect("at least one tracked slot");
    let state = RecomputeState::<B> {
        inputs: nodes.into_iter().map(|node| node.primitive).collect(),
        tracked,
        block: Arc::new(Mutex::new(block)),
        context: scope::replay_context(),
    };
    let prep = Recompute::<B>(PhantomData)
        .prepare::<NoCheckpointing>([anchor.node.clone()])
        .compute_bound()
        .stateful();
    let out = match prep {
        OpsKind::Tracked(prep) => prep.finish(state, output.primitive),
        OpsKind::UnTracked(prep) => prep.finish(output.primitive),
    };
    expect_same(out)
}

/// The backward node of a checkpointed call.
#[derive(Debug)]
struct Recompute<B>(PhantomData<B>);

/// What the recompute needs: the call's input and parameter values, which of them need a
/// gradient (slot, node), and the block.
struct RecomputeState<B: AutodiffBackend> {
    inputs: Vec<FloatTensor<Inner<B>>>,
    tracked: Vec<(usize, NodeId)>,
    block: Arc<Mutex<BlockFn<B>>>,
    /// The forward's replay context (`with_replay_context`): the recompute and its backward
    /// run inside it.
    context: Option<ReplayContext>,
}

impl<B: AutodiffBackend> Clone for RecomputeState<B> {
    fn clone(&self) -> Self {
        Self {
            inputs: self.inputs.clone(),
            tracked: self.tracked.clone(),
            block: self.block.clone(),
            context: self.context.clone(),
        }
    }
}

impl<B: AutodiffBackend> std::fmt::Debug for RecomputeState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecomputeState")
            .field("slots", &self.inputs.len())
            .field("tracked", &self.tracked)
            .finish()
    }
}

impl<B: AutodiffBackend> Backward<Inner<B>, 1> for Recompute<B> {
    type State = RecomputeState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Inner<B>>(&ops.node);
        for (node, grad) in recompute::<B>(ops.state, grad) {
            grads.register::<Inner<B>>(node, grad);
        }
    }
}

/// Runs the nested recompute on a helper thread and collects the gradients it delivers.
fn recompute<B: AutodiffBackend>(
    state: RecomputeState<B>,
    grad: FloatTensor<Inner<B>>,
) -> Vec<(NodeId, FloatTensor<Inner<B>>)> {
    let tracked = state.tracked.clone();
    let (sender, receiver) = mpsc::channel();
    let helper = thread::Builder::new()
        .name("afterburner-recompute".into())
        .spawn(move || match state.context.clone() {
            None => nested_backward::<B>(state, grad, sender),
            Some(context) => {
                let mut run = Some(move || nested_backward::<B>(state, grad, sender));
                context(&mut || {
                    if let Some(run) = run.take() {
                        run()
                    }
                });
            }
        })
        .unwrap_or_else(|e| panic!("afterburner-checkpoint: cannot start a recompute thread: {e}"));

    let mut received = Received::<Inner<B>> {
        tracked: &tracked,
        delivered: Vec::with_capacity(tracked.len()),
        pending: tracked.len(),
    };
    while received.pending > 0 {
        match receiver.recv_timeout(HELPER_POLL) {
            Ok(delivery) => received.accept(delivery),
            Err(RecvTimeoutError::Timeout) if !helper.is_finished() => {}
            Err(_) => match helper.join() {
                // The block panicked while recomputing: the panic goes on here, like an error
                // raised in PyTorch's recompute.
                Err(payload) => std::panic::resume_unwind(payload),
                // It ended normally: whatever it sent is in the channel.
                Ok(()) => {
                    while let Ok(delivery) = receiver.try_recv() {
                        received.accept(delivery);
                    }
                    if received.pending > 0 {
                        panic!(
                            "afterburner-checkpoint: the recompute ended without delivering \
                             every gradient"
                        );
                    }
                    break;
                }
            },
        }
    }
    // The helper is not joined: it finishes its nested cleanup once the outer backward ends.
    received.delivered
}

/// Gradients received so far from a recompute, under the outer nodes they belong to.
struct Received<'a, I: Backend> {
    tracked: &'a [(usize, NodeId)],
    delivered: Vec<(NodeId, FloatTensor<I>)>,
    pending: usize,
}

impl<I: Backend> Received<'_, I> {
    fn accept(&mut self, (slot, grad): Delivery<I>) {
        self.pending = self.pending.saturating_sub(1);
        let node = self
            .tracked
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, n)| *n);
        if let (Some(node), Some(grad)) = (node, grad) {
            self.delivered.push((node, grad));
        }
    }
}

/// The helper thread: fresh leaves behind taps, the block again, a nested backward seeded with
/// the incoming gradient.
fn nested_backward<B: AutodiffBackend>(
    state: RecomputeState<B>,
    grad: FloatTensor<Inner<B>>,
    sender: Sender<Delivery<Inner<B>>>,
) {
    let RecomputeState {
        inputs,
        tracked,
        block,
        ..
    } = state;
    let device = <Inner<B> as burn::tensor::ops::FloatTensorOps<Inner<B>>>::float_device(&grad);
    let tiny = <Inner<B> as burn::tensor::ops::FloatTensorOps<Inner<B>>>::float_zeros(
        [1].into(),
        &device,
        FloatDType::F32,
    );
    let probe: Tracked<Inner<B>> = expect_same(B::from_inner(tiny));

    let mut taps = Vec::with_capacity(tracked.len());
    let slots = inputs
        .into_iter()
        .enumerate()
        .map(|(slot, value)| {
            let value = B::from_inner(value);
            if !tracked.iter().any(|(s, _)| *s == slot) {
                return value;
            }
            let leaf = expect_same::<_, Tracked<Inner<B>>>(value).require_grad();
            let tap_state = TapState {
                slot,
                sender: sender.clone(),
                probe: probe.clone(),
            };
            let tap = match Tap
                .prepare::<NoCheckpointing>([leaf.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(tap_state, leaf.primitive.clone()),
                OpsKind::UnTracked(prep) => prep.finish(leaf.primitive.clone()),
            };
            taps.push(tap.clone());
            expect_same(tap)
        })
        .collect();
    drop(sender);

    let output: Tracked<Inner<B>> = {
        let block = block.lock().unwrap_or_else(|e| e.into_inner());
        expect_same(block(slots, true))
    };
    // Every tap is a parent of the root, so each one runs (and reports) even when the block
    // did not use its leaf.
    let anchor = taps.into_iter().reduce(link).expect("at least one tap");
    let seed = <Seed as Backward<Inner<B>, 2>>::prepare::<NoCheckpointing>(
        Seed,
        [output.node.clone(), anchor.node.clone()],
    );
    let root = match seed.compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(grad, probe.primitive.clone()),
        OpsKind::UnTracked(prep) => prep.finish(probe.primitive.clone()),
    };
    // Nothing but the root may outlive this point: the helper stays blocked in Burn's cleanup
    // until the outer backward ends, and anything it still held (the block output, the leaves)
    // would stay allocated until then.
    drop((output, anchor, probe));
    let _ = B::backward(expect_same(root));
}

/// Identity on a fresh leaf; in the nested backward it sends the leaf's final gradient.
#[derive(Debug)]
struct Tap;

#[derive(Debug, Clone)]
struct TapState<I: Backend> {
    slot: usize,
    sender: Sender<Delivery<I>>,
    /// A tensor whose node is swapped for the tap's, to take the tap's gradient if one exists
    /// (`Gradients::consume` panics when none does).
    probe: Tracked<I>,
}

impl<I: Backend> Backward<I, 1> for Tap {
    type State = TapState<I>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let TapState {
            slot,
            sender,
            mut probe,
        } = ops.state;
        probe.node = ops.node.clone();
        let grad = grads.remove::<I>(&probe);
        // The outer step may have stopped listening only if it is unwinding already.
        let _ = sender.send((slot, grad));
    }
}

/// Root of the nested backward: hands the incoming gradient to the block output.
#[derive(Debug)]
struct Seed;

impl<I: Backend> Backward<I, 2> for Seed {
    type State = FloatTensor<I>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [output, _anchor] = ops.parents;
        if let Some(output) = output {
            grads.register::<I>(output.id, ops.state);
        }
    }
}

/// A node with two parents and no gradient of its own: it only ties nodes into one graph.
#[derive(Debug)]
struct Link;

impl<I: Backend> Backward<I, 2> for Link {
    type State = ();

    fn backward(self, _: Ops<(), 2>, _: &mut Gradients, _: &mut Checkpointer) {}
}

fn link<I: Backend>(a: Tracked<I>, b: Tracked<I>) -> Tracked<I> {
    Link.prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateless(a.primitive.clone())
}

/// Moves a value to type `U` when `T` is `U` (how a `B::FloatTensorPrimitive` is seen as
/// Burn's autodiff tensor once `B` is known to be `Autodiff<_, _>`).
fn convert<T: 'static, U: 'static>(value: T) -> Result<U, T> {
    if TypeId::of::<T>() != TypeId::of::<U>() {
        return Err(value);
    }
    let mut slot = Some(value);
    let same = (&mut slot as &mut dyn Any).downcast_mut::<Option<U>>();
    Ok(same.and_then(Option::take).expect("T is U"))
}

/// [`convert`] where the types are known to match (checked once per call by `apply`).
fn expect_same<T: 'static, U: 'static>(value: T) -> U {
    match convert(value) {
        Ok(value) => value,
        Err(_) => unreachable!("the autodiff primitive was checked in `apply`"),
    }
}

fn warn_once(message: &'static str) {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| tracing::warn!("{message}"));
}
