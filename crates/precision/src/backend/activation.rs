//! `ActivationOps` for [`Autocast`]: every method forwarded to the inner backend, those on two
//! float tensors (the backward ops, `prelu`) after dtype promotion.

use burn::tensor::Scalar;
use burn::tensor::backend::Backend;
use burn::tensor::ops::ActivationOps;
use burn::tensor::ops::FloatTensor;

use super::{Autocast, forward, in_f32, nodes, promote, promoted, scope};

impl<B: Backend> ActivationOps<Self> for Autocast<B> {
    forward! { B;
        fn leaky_relu(tensor: FloatTensor<Self>, negative_slope: Scalar) -> FloatTensor<Self>;
        fn relu(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn gelu(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn hard_sigmoid(tensor: FloatTensor<Self>, alpha: Scalar, beta: Scalar) -> FloatTensor<Self>;
        fn log_sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn softmin(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self>;
    }

    promoted! {
        fn relu_backward(output, grad) -> FloatTensor<Self>;
        fn gelu_backward(x, grad) -> FloatTensor<Self>;
        fn sigmoid_backward(output, grad) -> FloatTensor<Self>;
        fn log_sigmoid_backward(x, grad) -> FloatTensor<Self>;
        fn prelu(tensor, alpha) -> FloatTensor<Self>;
    }

    in_f32! {
        fn log_softmax(tensor, dim: usize) -> FloatTensor<Self>;
    }

    /// In f32 inside a scope; on `Autocast<Autodiff<I>>`, as one autodiff node keeping a half
    /// copy of its output (`softmax_node.rs`).
    fn softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let tensor = match scope::autocast_dtype() {
            Some(half) => match nodes::softmax::<B>(tensor, dim, half) {
                Ok(out) => return out,
                Err(tensor) => tensor,
            },
            None => tensor,
        };
        B::softmax(scope::to_f32::<B>(tensor), dim)
    }
}
