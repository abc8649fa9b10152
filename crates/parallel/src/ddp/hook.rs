//! DDP's forward view: each parameter behind a gradient hook, an autodiff node whose forward
//! passes the parameter on and whose backward hands its gradient to the
//! [`Reducer`](super::reducer::Reducer), which keeps it for the step (the parameter itself
//! gets only what reaches it outside the view; `Ddp::after_backward` adds the two).
//!
//! Burn runs backward by node depth, deepest first, and a parameter's depth is 0: a hook on
//! the parameter alone would run at the very end. So the view's parameters are lazy: a
//! [`Checkpointed`](afterburner_checkpoint::Checkpointed) block reads them when it starts,
//! with its input as the block input ([`afterburner_checkpoint::block_input`]), and the hook
//! takes that input as a second parent (which gets no gradient from it). Its depth is then
//! the input's plus one: below every op of the block, above every op before it, so it runs
//! right after the block's backward, once the block's gradients are complete.
//!
//! A parameter read outside such a block (any module of Burn's own: `Linear`, a
//! `TransformerEncoder`) has no input at hand: its hook takes as second parent an anchor of
//! the depth the forward pass has reached, at most the autodiff nodes made since the view was
//! (Burn numbers them in order; an op's depth is at most its number). The hook then sits at
//! or above the ops that read the parameter's input, so it runs once every op reading the
//! parameter has given its gradient and before the ops that came before: the gradients reach
//! the thread in the order backward completes them, as PyTorch's hooks do. The anchors are
//! untracked nodes of a [`Ladder`], one per depth, made once (no device work): they take no
//! gradient and cost the graph nothing.

use std::sync::{Arc, Mutex, PoisonError};

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use std::marker::PhantomData;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Shape, Tensor, TensorPrimitive};

use super::reducer::Reducer;
use crate::fsdp::gather::{Tracked, downcast};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The deepest anchor a [`Ladder`] makes: a hook deeper than this runs at this depth (later
/// than it could, never wrongly).
const DEEPEST: usize = 1 << 14;

/// Untracked autodiff nodes of depth 1, 2, ... (each the parent of the next), made as deeper
/// ones are asked for and kept: a hook's second parent, which sets its depth.
pub(crate) struct Ladder<I: Backend>(Mutex<Vec<Tracked<I>>>);

impl<I: Backend> Default for Ladder<I> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<I: Backend> Ladder<I> {
    /// An anchor of depth `depth` (at most [`DEEPEST`]), on `like`'s device (the anchors share
    /// one value of one element, never read).
    fn at(&self, depth: usize, like: &Tracked<I>) -> Tracked<I> {
        let mut rungs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let depth = depth.clamp(1, DEEPEST);
        while rungs.len() < depth {
            let next = match rungs.last() {
                Some(below) => deeper(below),
                None => {
                    let device = I::float_device(&like.primitive);
                    let value = I::float_zeros(Shape::new([1]), &device, FloatDType::F32);
                    deeper(&Tracked::<I>::new(value))
                }
            };
            rungs.push(next);
        }
        rungs[depth - 1].clone()
    }
}

/// An untracked node one deeper than `below` (the same value: no device work).
fn deeper<I: Backend>(below: &Tracked<I>) -> Tracked<I> {
    RungNode
        .prepare::<NoCheckpointing>([below.node.clone()])
        .compute_bound()
        .stateless(below.primitive.clone())
}

/// A ladder rung's backward node (never run: a rung takes no gradient).
#[derive(Debug)]
struct RungNode;

impl<I: Backend> Backward<I, 1> for RungNode {
    type State = ();

    fn backward(self, _: Ops<(), 1>, _: &mut Gradients, _: &mut Checkpointer) {}
}

/// Autodiff nodes made so far in this process (Burn numbers them in order).
fn nodes_made() -> u64 {
    NodeId::new().value
}

/// `model` with every float parameter behind a hook of pass `pass`, cast to `compute` when
/// given; hooks outside a `Checkpointed` block are placed by `ladder`'s anchors.
pub(crate) fn hooked_view<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    reducer: &Arc<Reducer<Inner<B>>>,
    ladder: &Arc<Ladder<Inner<B>>>,
    pass: u64,
    compute: Option<DType>,
) -> M {
    struct Hooks<'a, I: Backend> {
        reducer: &'a Arc<Reducer<I>>,
        ladder: &'a Arc<Ladder<I>>,
        start: u64,
        pass: u64,
        index: usize,
        compute: Option<DType>,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Hooks<'_, Inner<B>> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, _mapper) = param.consume();
            let (index, pass, compute) = (self.index, self.pass, self.compute);
            self.index += 1;
            let (device, require_grad) = (value.device(), value.is_require_grad());
            let shape: Shape = value.shape();
            let (reducer, ladder, start) = (self.reducer.clone(), self.ladder.clone(), self.start);
            Param::uninitialized(
                id,
                move |_, _| {
                    let place = Place {
                        ladder: &ladder,
                        start,
                    };
                    let hooked = hook(value.clone(), index, &reducer, pass, place);
                    match compute {
                        Some(dtype) if hooked.dtype() != dtype => hooked.cast(dtype),
                        _ => hooked,
                    }
                },
                device,
                require_grad,
                shape,
            )
        }
    }
    model.clone().map(&mut Hooks {
        reducer,
        ladder,
        start: nodes_made(),
        pass,
        index: 0,
        compute,
    })
}

/// Where a hook outside a `Checkpointed` block goes: `ladder`'s anchor as deep as the nodes
/// made since `start` (the view's making).
struct Place<'a, I: Backend> {
    ladder: &'a Ladder<I>,
    start: u64,
}

/// `value` behind a hook for parameter `index` (unchanged where `B` is not Burn's autodiff or
/// `value` needs no gradient).
fn hook<B: AutodiffBackend, const D: usize>(
    value: Tensor<B, D>,
    index: usize,
    reducer: &Arc<Reducer<Inner<B>>>,
    pass: u64,
    place: Place<'_, Inner<B>>,
) -> Tensor<B, D> {
    if !value.is_require_grad() {
        return value;
    }
    let primitive = value.clone().into_primitive().tensor();
    let Some(param) = downcast::<_, Tracked<Inner<B>>>(primitive) else {
        return value;
    };
    let state = HookState {
        reducer: reducer.clone(),
        pass,
        index,
    };
    let anchor = afterburner_checkpoint::block_input::<B>()
        .and_then(downcast::<_, Tracked<Inner<B>>>)
        .unwrap_or_else(|| {
            let depth = nodes_made().saturating_sub(place.start);
            place
                .ladder
                .at(usize::try_from(depth).unwrap_or(DEEPEST), &param)
        });
    let inner = param.primitive.clone();
    let out = finish(
        HookNode.prepare::<NoCheckpointing>([param.node.clone(), anchor.node.clone()]),
        state,
        inner,
    );
    let out = downcast::<_, FloatTensor<B>>(out).expect("B is Burn's Autodiff (checked above)");
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn finish<I: Backend>(
    prep: burn::backend::autodiff::ops::OpsPrep<HookNode, I, HookState<I>, NoCheckpointing, 2>,
    state: HookState<I>,
    inner: FloatTensor<I>,
) -> Tracked<I> {
    match prep.compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, inner),
        OpsKind::UnTracked(prep) => prep.finish(inner),
    }
}

/// The hook's backward node (2 parents: the parameter, and the block input or an anchor).
#[derive(Debug)]
struct HookNode;

struct HookState<I: Backend> {
    reducer: Arc<Reducer<I>>,
    pass: u64,
    index: usize,
}

impl<I: Backend> Clone for HookState<I> {
    fn clone(&self) -> Self {
        Self {
            reducer: self.reducer.clone(),
            pass: self.pass,
            index: self.index,
        }
    }
}

impl<I: Backend> std::fmt::Debug for HookState<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookState")
            .field("pass", &self.pass)
            .field("index", &self.index)
            .finish()
    }
}

impl<I: Backend> Backward<I, 2> for HookNode {
    type State = HookState<I>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let Some(param) = &ops.parents[0] else {
            return; // the parameter takes no gradient
        };
        let state = ops.state;
        let numel = burn::tensor::TensorMetadata::shape(&grad).num_elements();
        let flat = I::float_reshape(grad.clone(), Shape::new([numel]));
        let flat = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(flat)).cast(DType::F32);
        // Kept by the reducer, not registered on the parameter: what reaches the parameter
        // otherwise (the model used outside the view) then shows at the step
        // (`Ddp::after_backward` adds the two, and the step reduces that sum instead). The
        // hook of an older view than the reducer's pass hands it to the parameter, as Burn
        // would.
        if !state
            .reducer
            .ready(state.pass, state.index, grad.clone(), flat)
        {
            grads.register::<I>(param.id, grad);
        }
    }
}

/// Adds the view's gradients (`local`, in visit order, as backward produced them) to the
/// parameters' in `grads`.
pub(crate) struct AddViewGrads<'a, B: AutodiffBackend, L> {
    pub(crate) grads: &'a mut GradientsParams,
    pub(crate) local: L,
    pub(crate) backend: PhantomData<B>,
}

impl<B, L> ModuleVisitor<B> for AddViewGrads<'_, B, L>
where
    B: AutodiffBackend,
    L: Iterator<Item = Option<FloatTensor<Inner<B>>>>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(Some(view)) = self.local.next() else {
            return;
        };
        let view = Tensor::<Inner<B>, D>::from_primitive(TensorPrimitive::Float(view));
        let grad = match self.grads.remove::<Inner<B>, D>(param.id) {
            Some(outside) => {
                let dtype = outside.dtype();
                outside.add(view.cast(dtype))
            }
            None => view,
        };
        self.grads.register::<Inner<B>, D>(param.id, grad);
    }
}
