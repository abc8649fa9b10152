//! [`Checkpointed`]: the block wrapper, and [`checkpoint`] for a parameter-free function.

use std::marker::PhantomData;
use std::sync::{Arc, Once};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::BlockKind;
use crate::derived::{self, DerivedParams};
use crate::engine;
use crate::job::{BlockFn, Job};
use crate::scope;

/// A block whose inner activations are dropped after the forward pass and recomputed in the
/// backward pass (`torch.utils.checkpoint`).
///
/// Only the block's input is kept. In the backward pass the block runs again with autodiff on
/// and its gradients reach the input and the block's parameters, merged into the normal
/// gradients: an optimizer sees nothing unusual, and the gradients equal those of the plain
/// block.
///
/// Whether a given call is recomputed is decided by the [`CheckpointPolicy`] in force
/// ([`with_policy`]; the Accelerator sets it from its config); outside any policy the block
/// runs plain and leaves the backend RNG alone, so wrapping makes a model *checkpointable*
/// without changing how it trains. Randomness inside the block
/// (dropout) replays identically: inside a policy scope the block seeds the backend from a
/// per-call seed before it runs, both times. On a backend without autodiff the block simply runs.
///
/// ```
/// use afterburner_checkpoint::{CheckpointPolicy, Checkpointed, with_policy};
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
///
/// type B = Autodiff<Flex>;
/// afterburner_checkpoint::enable::<B>(); // once per backend (the Accelerator does it)
/// let device = Default::default();
/// let block = Checkpointed::new(LinearConfig::new(4, 4).init::<B>(&device));
/// let x = Tensor::<B, 2>::ones([2, 4], &device).require_grad();
/// let y = with_policy(CheckpointPolicy::All, || {
///     block.forward(x.clone(), |linear: &Linear<B>, x| linear.forward(x).tanh())
/// });
/// let grads = y.sum().backward();
/// assert!(x.grad(&grads).is_some());
/// assert!(block.block.weight.grad(&grads).is_some());
/// ```
///
/// The closure runs twice (forward, then recompute on a helper thread), so it must be `Fn`,
/// `Send` and `'static`: give it what it needs through the block and the input. A tensor it
/// captures that requires gradients is detected and the call runs without checkpointing (a
/// warning is logged once).
///
/// [`CheckpointPolicy`]: crate::CheckpointPolicy
/// [`with_policy`]: crate::with_policy
#[derive(Module, Debug)]
pub struct Checkpointed<B: Backend, T: Module<B>> {
    /// The wrapped block.
    pub block: T,
    #[module(skip)]
    kind: BlockKind,
    #[module(skip)]
    replay_rng: bool,
    backend: PhantomData<B>,
}

impl<B: Backend, T: Module<B>> Checkpointed<B, T> {
    /// Wraps a whole block ([`BlockKind::Block`]).
    pub fn new(block: T) -> Self {
        Self::with_kind(block, BlockKind::Block)
    }

    /// Wraps a part that is cheap to recompute ([`BlockKind::Cheap`]: norms, activations,
    /// softmax), the part the `selective` policy recomputes.
    pub fn cheap(block: T) -> Self {
        Self::with_kind(block, BlockKind::Cheap)
    }

    /// Wraps `block` as `kind`.
    pub fn with_kind(block: T, kind: BlockKind) -> Self {
        Self {
            block,
            kind,
            replay_rng: true,
            backend: PhantomData,
        }
    }

    /// Turns the RNG replay off (PyTorch's `preserve_rng_state=False`): the block then draws
    /// from the backend RNG as it is, and a recompute of a block with dropout draws other masks.
    pub fn without_rng_replay(mut self) -> Self {
        self.replay_rng = false;
        self
    }

    /// What this wrapper holds.
    pub fn kind(&self) -> BlockKind {
        self.kind
    }

    /// Runs `forward(&self.block, input)`, checkpointed when the policy in force says so.
    pub fn forward<const D: usize, const D2: usize, F>(
        &self,
        input: Tensor<B, D>,
        forward: F,
    ) -> Tensor<B, D2>
    where
        T: 'static,
        F: Fn(&T, Tensor<B, D>) -> Tensor<B, D2> + Send + 'static,
    {
        if !B::ad_enabled(&input.device()) {
            return forward(&self.block, input);
        }
        let recompute = scope::decide(self.kind);
        let apply = if recompute {
            engine::lookup::<B>()
        } else {
            None
        };
        // Reading the parameters initialises lazy ones now, before the block's seed is set:
        // an initialisation inside the seeded region would shift the block's random draws.
        // Derived parameters are not read when the block is recomputed: their sources are.
        let input = input.into_primitive().tensor();
        let mut collect = CollectParams {
            slots: vec![input.clone()],
            params: Vec::new(),
            groups: Vec::new(),
            derive: match apply {
                Some(_) => derivable_groups(&self.block),
                None => Vec::new(),
            },
        };
        crate::anchor::with_block_input::<B, _>(input, || self.block.visit(&mut collect));
        let seed = (self.replay_rng && scope::replays_rng()).then(scope::next_block_seed);
        let CollectParams {
            mut slots,
            params,
            groups,
            ..
        } = collect;
        let Some(apply) = apply else {
            if recompute {
                warn_not_enabled::<B>();
            }
            let input = from_float(slots.swap_remove(0)); // the parameters are not needed
            return run_block(&self.block, input, &forward, seed, false);
        };

        // The derived groups' sources follow the input and the plain parameters.
        let starts: Vec<usize> = groups
            .iter()
            .map(|group| {
                let start = slots.len();
                slots.extend(group.sources.iter().cloned());
                start
            })
            .collect();
        let block = self.block.clone();
        let run: BlockFn<B> = Box::new(move |slots, recomputed| {
            let built: Vec<Vec<FloatTensor<B>>> = groups
                .iter()
                .zip(&starts)
                .map(|(group, &start)| {
                    (group.build)(slots[start..start + group.sources.len()].to_vec())
                })
                .collect();
            let module = block.clone().map(&mut AssignParams {
                params: params.iter(),
                slots: &slots,
                built: &built,
            });
            run_block(
                &module,
                from_float(slots[0].clone()),
                &forward,
                seed,
                recomputed,
            )
            .into_primitive()
            .tensor()
        });
        from_float(apply(Job { slots, block: run }))
    }
}

/// Checkpoints a function without parameters of its own (a softmax, an activation, a chain of
/// elementwise ops): only `input` is kept, the rest is recomputed in the backward pass.
///
/// `kind` says which policies recompute it ([`BlockKind::Cheap`] for `selective`).
pub fn checkpoint<B, const D: usize, const D2: usize, F>(
    kind: BlockKind,
    input: Tensor<B, D>,
    function: F,
) -> Tensor<B, D2>
where
    B: Backend,
    F: Fn(Tensor<B, D>) -> Tensor<B, D2> + Send + 'static,
{
    Checkpointed::<B, PhantomData<B>>::with_kind(PhantomData, kind)
        .forward(input, move |_, x| function(x))
}

/// Seeds the backend for the block (when replaying RNG), marks the region, runs the block.
fn run_block<B, M, const D: usize, const D2: usize>(
    module: &M,
    input: Tensor<B, D>,
    forward: &impl Fn(&M, Tensor<B, D>) -> Tensor<B, D2>,
    seed: Option<u64>,
    recomputed: bool,
) -> Tensor<B, D2>
where
    B: Backend,
{
    if let Some(seed) = seed {
        B::seed(&input.device(), seed);
    }
    let _region = scope::enter_block(seed, recomputed);
    forward(module, input)
}

fn from_float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn warn_not_enabled<B: Backend>() {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "activation checkpointing is not enabled for backend {}: wrapped blocks run without \
             checkpointing. Call afterburner_checkpoint::enable::<B>() once (the afterburner \
             Accelerator does).",
            std::any::type_name::<B>()
        )
    });
}

/// Where a block parameter's value comes from in the checkpointed call.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// This slot (the parameter's own value).
    Slot(usize),
    /// Position `1` of what derived group `0` builds.
    Derived(usize, usize),
}

/// The derived groups whose parameters all belong to `block` (a group reaching outside the
/// block would be built whole for every block that holds part of it: such parameters are
/// read as values instead).
fn derivable_groups<B: Backend, M: Module<B>>(block: &M) -> Vec<Arc<DerivedParams<B>>> {
    struct Count<B: Backend>(Vec<(Arc<DerivedParams<B>>, usize)>);
    impl<B: Backend> ModuleVisitor<B> for Count<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some((group, _)) = derived::lookup::<B>(param.id) {
                match self.0.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &group)) {
                    Some((_, seen)) => *seen += 1,
                    None => self.0.push((group, 1)),
                }
            }
        }
    }
    let mut count = Count(Vec::new());
    block.visit(&mut count);
    count
        .0
        .into_iter()
        .filter(|(group, seen)| *seen == group.ids.len())
        .map(|(group, _)| group)
        .collect()
}

/// Collects the float parameters in visit order: their values as slots (reading lazy ones
/// initialises them), or, for groups in `derive`, the derived group they belong to (not read).
struct CollectParams<B: Backend> {
    slots: Vec<FloatTensor<B>>,
    params: Vec<Source>,
    groups: Vec<Arc<DerivedParams<B>>>,
    derive: Vec<Arc<DerivedParams<B>>>,
}

impl<B: Backend> ModuleVisitor<B> for CollectParams<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let derived = derived::lookup::<B>(param.id)
            .filter(|(group, _)| self.derive.iter().any(|g| Arc::ptr_eq(g, group)));
        let source = match derived {
            Some((group, position)) => {
                let index = match self.groups.iter().position(|g| Arc::ptr_eq(g, &group)) {
                    Some(index) => index,
                    None => {
                        self.groups.push(group);
                        self.groups.len() - 1
                    }
                };
                Source::Derived(index, position)
            }
            None => {
                self.slots.push(param.val().into_primitive().tensor());
                Source::Slot(self.slots.len() - 1)
            }
        };
        self.params.push(source);
    }
}

/// Puts the slots' and the built groups' tensors in place of the float parameters, in visit
/// order (ids kept). A derived parameter is not read (it would build itself again).
struct AssignParams<'a, B: Backend, I> {
    params: I,
    slots: &'a [FloatTensor<B>],
    built: &'a [Vec<FloatTensor<B>>],
}

impl<'a, B, I> ModuleMapper<B> for AssignParams<'a, B, I>
where
    B: Backend,
    I: Iterator<Item = &'a Source>,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.params.next() {
            Some(Source::Slot(slot)) => {
                let (id, _, mapper) = param.consume();
                Param::from_mapped_value(id, from_float(self.slots[*slot].clone()), mapper)
            }
            Some(Source::Derived(group, position)) => {
                let value = from_float(self.built[*group][*position].clone());
                Param::initialized(param.id, value)
            }
            None => param,
        }
    }
}
