//! A model's float parameters as one flat f32 tensor and back: what parameter averaging
//! (Local SGD, DiLoCo) and broadcasts exchange. Parameters are taken in the model's visit
//! order, so ranks pair them by position, never by `ParamId`.

use std::marker::PhantomData;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::ddp::{Flatten, Unflatten};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Every float parameter of `model`, flattened to f32 in visit order and concatenated (not
/// tracked); `None` for a model without float parameters.
pub fn flat_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
) -> Option<Tensor<Inner<B>, 1>> {
    let mut flat = Flatten::<B>::default();
    model.visit(&mut flat);
    flat.concat()
}

/// `model` with its float parameters replaced by consecutive slices of `values` (visit order,
/// cast back to each parameter's dtype; ids and `require_grad` kept). `values` must hold as
/// many values as [`flat_params`] returned.
pub fn with_flat_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    values: Tensor<Inner<B>, 1>,
) -> M {
    model.map(&mut Unflatten::<B> {
        values,
        offset: 0,
        backend: PhantomData,
    })
}

/// `model`'s parameter ids with their positions in visit order: how the optimizer records of
/// ranks whose ids differ are paired.
pub fn param_positions<B: Backend, M: Module<B>>(model: &M) -> crate::ParamPositions {
    param_ids(model)
        .into_iter()
        .enumerate()
        .map(|(position, id)| (id, position))
        .collect()
}

/// The ids of `model`'s float parameters in visit order, as optimizer records name them
/// (`ParamId::serialize`): position `i` is the `i`-th parameter.
pub fn param_ids<B: Backend, M: Module<B>>(model: &M) -> Vec<String> {
    struct Ids(Vec<String>);
    impl<B: Backend> ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.id.serialize());
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}
