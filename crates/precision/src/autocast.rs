//! Autocast: run a forward pass of an f32 model in a half dtype without touching its weights.
//!
//! Burn 0.21 has no autocast and no dtype promotion (an op mixing f32 and bf16 panics), so the
//! mixed modes use a **half view**: a clone of the model whose float parameters are `cast` to
//! the compute dtype. Casting is differentiable and the view keeps every [`ParamId`], so
//! `loss.backward()` delivers f32 gradients to the f32 master parameters and
//! `GradientsParams::from_grads(grads, &master)` finds them all.
//!
//! [`ParamId`]: burn::module::ParamId
//!
//! Three traps make a naive view silently produce zero gradients; each is handled here:
//! - lazy parameters: cloning a never-read `Param` re-runs its initializer, so the view would
//!   get other random weights. [`autocast_view`] first reads every parameter
//!   ([`materialize_params`]).
//! - one backward per view: a second backward through the same view yields zero gradients.
//!   Build a fresh view per forward pass (cheap: parameters are cast, not copied twice); the
//!   `afterburner` Accelerator does this for every micro-batch.
//! - view parameters are not leaves: never give the view to an optimizer, a checkpoint or a
//!   record. Keep it inside the forward pass.
//!
//! What runs in the half dtype: every op of the model's forward, since every parameter and the
//! input are half. Inside Burn's composite layers (`TransformerEncoder`, `MultiHeadAttention`)
//! LayerNorm and softmax therefore run in half too; the loss must be computed in f32 (cast the
//! output with [`CastFloats`]). See `docs/precision.md` for the measured effect.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Int, Tensor};

/// Reads every parameter once so lazily initialised ones get their value now.
///
/// Call after building or loading a model and before cloning it: a clone of an unread lazy
/// parameter would initialise again with other random values.
pub fn materialize_params<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            let _ = param.val();
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
}

/// Maps float parameters to `dtype` through a differentiable cast (the autocast view),
/// except those named in `keep`.
struct ViewCast<'a> {
    dtype: DType,
    keep: &'a [ParamId],
}

impl<B: Backend> ModuleMapper<B> for ViewCast<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.keep.contains(&param.id) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.dtype), mapper)
    }
}

/// Replaces float parameters by new leaves in `dtype` (the true-precision modes).
struct LeafCast(DType);

impl<B: AutodiffBackend> ModuleMapper<B> for LeafCast {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let leaf = Tensor::from_inner(tensor.inner().cast(self.0)).set_require_grad(require_grad);
        Param::from_mapped_value(id, leaf, mapper)
    }
}

/// A half view of `module` for one forward pass: same `ParamId`s, float parameters cast to
/// `dtype` through a differentiable cast, so gradients flow back to `module`'s parameters.
///
/// Build a new view for every forward pass (see the module docs).
///
/// Module state that clones share, such as the running statistics of Burn's `BatchNorm`
/// (a `RunningState`), stays in its own dtype and is shared with the view (updates made
/// during the forward reach `module`, as they do without a view); its f32 statistics meet the
/// half activations in f32 on a backend that promotes dtypes (`Autodiff<Autocast<B>>`). Burn
/// maps such state in place, so this function casts it and puts it back: fine in one thread.
/// Where clones of one model run on several threads, find the state once with
/// [`shared_float_state`] and use [`autocast_view_except`], which never touches it.
pub fn autocast_view<B: Backend, M: Module<B>>(module: &M, dtype: DType) -> M {
    autocast_view_except(module, dtype, &[])
}

/// [`autocast_view`] that leaves the float tensors with the ids in `keep` as they are (the
/// ids [`shared_float_state`] found), without casting them at all.
pub fn autocast_view_except<B: Backend, M: Module<B>>(
    module: &M,
    dtype: DType,
    keep: &[ParamId],
) -> M {
    materialize_params(module);
    let before = float_tensors(module);
    let view = module.clone().map(&mut ViewCast { dtype, keep });
    let changed: Vec<_> = float_tensors(module)
        .into_iter()
        .zip(before)
        .filter(|((_, now), (_, was))| now.dtype() != was.dtype())
        .map(|(_, was)| was)
        .collect();
    if !changed.is_empty() {
        // Shared state `keep` did not name: mapping a throw-away clone writes the originals
        // back into it.
        let _ = module.clone().map(&mut Restore(changed));
    }
    view
}

/// The ids of `module`'s float state that its clones share (Burn's `RunningState`, e.g.
/// BatchNorm's running statistics); empty for most models. Found on a copy (`valid()` builds
/// fresh state), so `module` and its clones are not touched; `probe` is a dtype the backend
/// supports other than the state's own (the mixed precision's half dtype). A model with such
/// state needs a backend that promotes dtypes (`Autodiff<Autocast<B>>`) for the mixed
/// precisions.
pub fn shared_float_state<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    probe: DType,
) -> Vec<ParamId> {
    materialize_params(module);
    let copy = module.valid();
    let before = float_tensors(&copy);
    let _ = copy.clone().map(&mut ViewCast {
        dtype: probe,
        keep: &[],
    });
    float_tensors(&copy)
        .into_iter()
        .zip(before)
        .filter(|((_, now), (_, was))| now.dtype() != was.dtype())
        .map(|((id, _), _)| id)
        .collect()
}

/// A float tensor of a module, boxed with its rank erased, and its id.
type AnyFloat<B> = (ParamId, Box<dyn FloatTensorAny<B>>);

/// A float tensor of any rank whose dtype can be read.
trait FloatTensorAny<B: Backend>: core::any::Any {
    fn dtype(&self) -> DType;
    fn as_any(&self) -> &dyn core::any::Any;
}

impl<B: Backend, const D: usize> FloatTensorAny<B> for Tensor<B, D> {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn as_any(&self) -> &dyn core::any::Any {
        self
    }
}

/// Every float tensor of `module` (parameters and shared state), in visiting order.
fn float_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<AnyFloat<B>> {
    struct Collect<B: Backend>(Vec<AnyFloat<B>>);
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push((param.id, Box::new(param.val())));
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Puts the given tensors back, by id.
struct Restore<B: Backend>(Vec<AnyFloat<B>>);

impl<B: Backend> ModuleMapper<B> for Restore<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let original = self
            .0
            .iter()
            .find(|(id, _)| *id == param.id)
            .and_then(|(_, t)| t.as_any().downcast_ref::<Tensor<B, D>>().cloned());
        match original {
            Some(tensor) => {
                let (id, _, mapper) = param.consume();
                Param::from_mapped_value(id, tensor, mapper)
            }
            None => param,
        }
    }
}

/// Casts a module's float parameters to `dtype` for good (the `*-true` modes): each becomes a
/// new leaf in `dtype` with the same `ParamId` and the same `require_grad`.
pub fn cast_module<B: AutodiffBackend, M: Module<B>>(module: M, dtype: DType) -> M {
    materialize_params(&module);
    module.map(&mut LeafCast(dtype))
}

/// Values whose float tensors can be cast to a dtype: model inputs and outputs.
///
/// Float tensors are cast, int and bool tensors pass unchanged; implemented for tuples,
/// `Option` and `Vec` so a forward's inputs and outputs can be any mix of them.
pub trait CastFloats {
    /// Casts every float tensor inside to `dtype`.
    fn cast_floats(self, dtype: DType) -> Self;
}

impl<B: Backend, const D: usize> CastFloats for Tensor<B, D> {
    fn cast_floats(self, dtype: DType) -> Self {
        self.cast(dtype)
    }
}

impl<B: Backend, const D: usize> CastFloats for Tensor<B, D, Int> {
    fn cast_floats(self, _dtype: DType) -> Self {
        self
    }
}

impl<B: Backend, const D: usize> CastFloats for Tensor<B, D, Bool> {
    fn cast_floats(self, _dtype: DType) -> Self {
        self
    }
}

impl CastFloats for () {
    fn cast_floats(self, _dtype: DType) -> Self {}
}

impl<T: CastFloats> CastFloats for Option<T> {
    fn cast_floats(self, dtype: DType) -> Self {
        self.map(|t| t.cast_floats(dtype))
    }
}

impl<T: CastFloats> CastFloats for Vec<T> {
    fn cast_floats(self, dtype: DType) -> Self {
        self.into_iter().map(|t| t.cast_floats(dtype)).collect()
    }
}

macro_rules! cast_floats_tuple {
    ($($name:ident),+) => {
        impl<$($name: CastFloats),+> CastFloats for ($($name,)+) {
            #[allow(non_snake_case)]
            fn cast_floats(self, dtype: DType) -> Self {
                let ($($name,)+) = self;
                ($($name.cast_floats(dtype),)+)
            }
        }
    };
}
cast_floats_tuple!(A);
cast_floats_tuple!(A, B2);
cast_floats_tuple!(A, B2, C);
cast_floats_tuple!(A, B2, C, D2);

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;
    use burn::tensor::Distribution;

    type AD = Autodiff<Flex>;

    fn rel_err<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
        let diff = (a.clone() - b).powi_scalar(2).sum().sqrt().into_scalar();
        let norm = a.powi_scalar(2).sum().sqrt().into_scalar();
        diff / norm
    }

    /// Loss and weight gradient of `linear` on `x`, optionally through a half view.
    fn weight_grad(linear: &Linear<AD>, x: &Tensor<AD, 2>, dtype: DType) -> Tensor<Flex, 2> {
        let view = autocast_view(linear, dtype);
        let y = view
            .forward(x.clone().cast_floats(dtype))
            .cast_floats(DType::F32);
        let grads = GradientsParams::from_grads(y.powi_scalar(2).mean().backward(), linear);
        grads
            .get::<Flex, 2>(linear.weight.id)
            .expect("the master weight gets a gradient")
    }

    #[test]
    fn view_grads_reach_f32_master_and_match_f32() {
        let device = Default::default();
        let linear = LinearConfig::new(32, 16).init::<AD>(&device);
        let x = Tensor::<AD, 2>::random([8, 32], Distribution::Normal(0.0, 1.0), &device);
        let reference = weight_grad(&linear, &x, DType::F32);
        let bf16 = weight_grad(&linear, &x, DType::BF16);
        assert_eq!(bf16.dtype(), DType::F32);
        assert_eq!(linear.weight.val().dtype(), DType::F32);
        let err = rel_err(reference, bf16);
        assert!(err < 2e-2 && err > 0.0, "bf16 relative error {err}");
    }

    /// Trap 1: a never-read lazy parameter would be re-initialised in the clone.
    #[test]
    fn lazy_parameters_are_materialised_before_the_view() {
        let device = Default::default();
        let fresh = LinearConfig::new(32, 16).init::<AD>(&device);
        assert!(!fresh.weight.is_initialized(), "Burn's Linear starts lazy");
        let x = Tensor::<AD, 2>::random([8, 32], Distribution::Normal(0.0, 1.0), &device);
        let through_view = weight_grad(&fresh, &x, DType::BF16);
        // The same model, read directly in f32: the view must have used the same weights.
        let reference = weight_grad(&fresh, &x, DType::F32);
        let err = rel_err(reference, through_view);
        assert!(err < 2e-2, "view used other weights: relative error {err}");
    }

    /// Trap 2: a fresh view per pass gives full gradients on every pass.
    #[test]
    fn fresh_view_per_pass_gives_gradients_each_time() {
        let device = Default::default();
        let linear = LinearConfig::new(8, 4).init::<AD>(&device);
        let x = Tensor::<AD, 2>::random([4, 8], Distribution::Normal(0.0, 1.0), &device);
        let first = weight_grad(&linear, &x, DType::BF16);
        let second = weight_grad(&linear, &x, DType::BF16);
        assert!(first.clone().abs().sum().into_scalar() > 0.0);
        assert_eq!(rel_err(first, second), 0.0);
    }

    /// Trap 3: the master keeps f32 leaves; the view's parameters are half non-leaves.
    #[test]
    fn master_stays_f32_leaf_and_view_is_half() {
        let device = Default::default();
        let linear = LinearConfig::new(8, 4).init::<AD>(&device);
        let view = autocast_view(&linear, DType::F16);
        assert_eq!(view.weight.val().dtype(), DType::F16);
        assert_eq!(view.weight.id, linear.weight.id);
        assert_eq!(linear.weight.val().dtype(), DType::F32);
        assert!(linear.weight.val().is_require_grad());
    }

    #[test]
    fn cast_module_makes_half_leaves_with_same_ids() {
        let device = Default::default();
        let linear = LinearConfig::new(8, 4).init::<AD>(&device);
        let id = linear.weight.id;
        let half = cast_module(linear, DType::BF16);
        assert_eq!(half.weight.id, id);
        assert_eq!(half.weight.val().dtype(), DType::BF16);
        let x = Tensor::<AD, 2>::ones([2, 8], &device).cast(DType::BF16);
        let grads = GradientsParams::from_grads(half.forward(x).sum().backward(), &half);
        let g = grads.get::<Flex, 2>(id).expect("half leaf gets a gradient");
        assert_eq!(g.dtype(), DType::BF16);
    }

    #[test]
    fn cast_floats_leaves_ints_alone() {
        let device = Default::default();
        let f = Tensor::<Flex, 1>::from_floats([1.0, 2.0], &device);
        let i = Tensor::<Flex, 1, Int>::from_ints([1, 2], &device);
        let (f, i) = (f, i).cast_floats(DType::BF16);
        assert_eq!(f.dtype(), DType::BF16);
        assert_eq!(i.dims(), [2]);
    }
}
