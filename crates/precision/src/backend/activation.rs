//! `ActivationOps` for [`Autocast`]: every method forwarded to the inner backend.

use burn::tensor::Scalar;
use burn::tensor::backend::Backend;
use burn::tensor::ops::ActivationOps;
use burn::tensor::ops::FloatTensor;

use super::{Autocast, forward};

impl<B: Backend> ActivationOps<Self> for Autocast<B> {
    forward! { B;
        fn leaky_relu(tensor: FloatTensor<Self>, negative_slope: Scalar) -> FloatTensor<Self>;
        fn relu(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn relu_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
        fn gelu(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn prelu(tensor: FloatTensor<Self>, alpha: FloatTensor<Self>) -> FloatTensor<Self>;
        fn gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
        fn sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn sigmoid_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
        fn hard_sigmoid(tensor: FloatTensor<Self>, alpha: Scalar, beta: Scalar) -> FloatTensor<Self>;
        fn log_sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self>;
        fn softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self>;
        fn log_softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self>;
        fn softmin(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self>;
        fn log_sigmoid_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
    }
}
