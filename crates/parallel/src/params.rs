//! A model's float parameters as one flat f32 tensor and back: what parameter averaging
//! (Local SGD, DiLoCo) and broadcasts exchange. Parameters are taken in the model's visit
//! order, so ranks pair them by position, never by `ParamId`.

use std::marker::PhantomData;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

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
