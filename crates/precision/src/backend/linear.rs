//! Linear on the 2-D view of its input: `[d0, ..., dk, d_in]` is computed as
//! `[d0 * ... * dk, d_in]`.
//!
//! Burn 0.21's default `linear_weight_backward` on a 3-D input swaps the last two dims of `x`
//! and runs one batched matmul `[batch, d_in, seq] x [batch, seq, d_out]`, then sums the
//! `[batch, d_in, d_out]` result over the batch: `batch` small matmuls and a temporary `batch`
//! times the weight's size. On the 2-D view it is one `[d_in, N] x [N, d_out]` matmul. The
//! forward and the input gradient likewise become one matmul each instead of a broadcast batched
//! one. Same sums, same values up to the order of float additions. Operands of different float
//! dtypes are promoted first (`promote.rs`).

use burn::tensor::Shape;
use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::{scope, tf32};

/// `[d0, ..., dk, last]` as `[d0 * ... * dk, last]`, with the leading dims to restore later;
/// `None` for a tensor that is already 2-D or less.
fn flatten<B: Backend>(tensor: FloatTensor<B>) -> (FloatTensor<B>, Option<Vec<usize>>) {
    let dims = tensor.shape().to_vec();
    if dims.len() <= 2 {
        return (tensor, None);
    }
    let (leading, last) = dims.split_at(dims.len() - 1);
    let rows = leading.iter().product::<usize>();
    let flat = B::float_reshape(tensor, Shape::new([rows, last[0]]));
    (flat, Some(leading.to_vec()))
}

/// Puts back the leading dims `flatten` took off.
fn unflatten<B: Backend>(tensor: FloatTensor<B>, leading: Option<Vec<usize>>) -> FloatTensor<B> {
    match leading {
        None => tensor,
        Some(mut dims) => {
            dims.push(tensor.shape()[1]);
            B::float_reshape(tensor, Shape::from(dims))
        }
    }
}

/// `x @ weight + bias` computed on the 2-D view of `x` (in half inside an op-level autocast
/// scope).
pub(crate) fn forward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let (x, weight, bias) = scope::half_operands::<B>(x, weight, bias);
    let (x, weight) = (tf32::round::<B>(x), tf32::round::<B>(weight));
    let (x, leading) = flatten::<B>(x);
    unflatten::<B>(B::linear(x, weight, bias), leading)
}

/// The input gradient `output_grad @ weight^T`, computed on the 2-D view of `output_grad` (in
/// half inside a scope, `scope::half_backward`).
pub(crate) fn x_backward<B: Backend>(
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    scope::half_backward::<B, 2>([weight, output_grad], |[weight, output_grad]| {
        let (weight, output_grad) = (tf32::round::<B>(weight), tf32::round::<B>(output_grad));
        let (output_grad, leading) = flatten::<B>(output_grad);
        unflatten::<B>(B::linear_x_backward(weight, output_grad), leading)
    })
}

/// The weight gradient `x^T @ output_grad` as one matmul over the 2-D views (in half inside a
/// scope).
pub(crate) fn weight_backward<B: Backend>(
    x: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    scope::half_backward::<B, 2>([x, output_grad], |[x, output_grad]| {
        let (x, output_grad) = (tf32::round::<B>(x), tf32::round::<B>(output_grad));
        let (x, _) = flatten::<B>(x);
        let (output_grad, _) = flatten::<B>(output_grad);
        B::linear_weight_backward(x, output_grad)
    })
}

/// The bias gradient: `output_grad` summed over every row of its 2-D view (in f32 inside a
/// scope, as sums are).
pub(crate) fn bias_backward<B: Backend>(output_grad: FloatTensor<B>) -> FloatTensor<B> {
    let (output_grad, _) = flatten::<B>(scope::to_f32::<B>(output_grad));
    B::linear_bias_backward(output_grad)
}
