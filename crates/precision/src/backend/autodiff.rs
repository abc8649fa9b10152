//! `Autocast` above Autodiff: `Autocast<Autodiff<B>>`, op-level autocast whose casts Autodiff
//! records, as `torch.autocast` under PyTorch's autograd.
//!
//! Under `Autodiff<Autocast<B>>` the casts happen below Autodiff, which saves each op's inputs
//! as it was given them: an f32 activation entering a half matmul is kept in f32 for the
//! backward pass. Above Autodiff, the cast to half is an op Autodiff records, the matmul
//! saves the half copy, and the cast's backward hands the f32 tensor its gradient in f32 —
//! what PyTorch keeps, and at most the memory of the half view. Promotion casts are recorded
//! the same way, so every backward op sees operands of one dtype.
//!
//! The tensors, gradients and inner backend are Autodiff's own, so checkpointing, FSDP,
//! collectives and Burn's optimizers see Burn's `Autodiff<B>` underneath (the inner backend is
//! `B`, the same as `Autodiff<B>`'s).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};

use super::Autocast;

impl<B: AutodiffBackend> AutodiffBackend for Autocast<B> {
    type InnerBackend = B::InnerBackend;
    type Gradients = B::Gradients;

    fn backward(tensor: FloatTensor<Self>) -> Self::Gradients {
        B::backward(tensor)
    }

    fn grad(
        tensor: &FloatTensor<Self>,
        grads: &Self::Gradients,
    ) -> Option<FloatTensor<Self::InnerBackend>> {
        B::grad(tensor, grads)
    }

    fn grad_remove(
        tensor: &FloatTensor<Self>,
        grads: &mut Self::Gradients,
    ) -> Option<FloatTensor<Self::InnerBackend>> {
        B::grad_remove(tensor, grads)
    }

    fn grad_replace(
        tensor: &FloatTensor<Self>,
        grads: &mut Self::Gradients,
        grad: FloatTensor<Self::InnerBackend>,
    ) {
        B::grad_replace(tensor, grads, grad)
    }

    fn inner(tensor: FloatTensor<Self>) -> FloatTensor<Self::InnerBackend> {
        B::inner(tensor)
    }

    fn int_inner(tensor: IntTensor<Self>) -> IntTensor<Self::InnerBackend> {
        B::int_inner(tensor)
    }

    fn bool_inner(tensor: BoolTensor<Self>) -> BoolTensor<Self::InnerBackend> {
        B::bool_inner(tensor)
    }

    fn q_inner(tensor: QuantizedTensor<Self>) -> QuantizedTensor<Self::InnerBackend> {
        B::q_inner(tensor)
    }

    fn from_inner(tensor: FloatTensor<Self::InnerBackend>) -> FloatTensor<Self> {
        B::from_inner(tensor)
    }

    fn int_from_inner(tensor: IntTensor<Self::InnerBackend>) -> IntTensor<Self> {
        B::int_from_inner(tensor)
    }

    fn bool_from_inner(tensor: BoolTensor<Self::InnerBackend>) -> BoolTensor<Self> {
        B::bool_from_inner(tensor)
    }

    fn q_from_inner(tensor: QuantizedTensor<Self::InnerBackend>) -> QuantizedTensor<Self> {
        B::q_from_inner(tensor)
    }
}
