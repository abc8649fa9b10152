//! `ModuleOps` for [`Autocast`]: every method forwarded to the inner backend; Linear on the 2-D
//! view of its input, and the operands of Linear and the convolutions promoted to one dtype.

use burn::tensor::backend::Backend;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::ops::BoolTensor;
use burn::tensor::ops::ConvOptions;
use burn::tensor::ops::ConvTransposeOptions;
use burn::tensor::ops::DeformConv2dBackward;
use burn::tensor::ops::DeformConvOptions;
use burn::tensor::ops::FloatTensor;
use burn::tensor::ops::IntTensor;
use burn::tensor::ops::InterpolateOptions;
use burn::tensor::ops::MaxPool1dBackward;
use burn::tensor::ops::MaxPool1dWithIndices;
use burn::tensor::ops::MaxPool2dBackward;
use burn::tensor::ops::MaxPool2dWithIndices;
use burn::tensor::ops::ModuleOps;
use burn::tensor::ops::UnfoldOptions;

use burn::tensor::TensorMetadata;

use super::{Autocast, forward, linear, nodes, promote, promoted, scope};
use crate::flops;

/// A convolution's (or transposed convolution's) forward and backward ops, on operands
/// promoted to one float dtype (`promote.rs`): an f32 activation meets half weights in f32.
/// Inside an op-level scope the forward and the input and weight gradients run in half
/// (`scope::half_backward`) and the bias gradient, a sum, in f32. `$x_args` are the input
/// gradient's tensor arguments (`x, weight, output_grad`; a transposed convolution's take no
/// `x`).
macro_rules! promoted_conv {
    ($conv:ident, $x_backward:ident($($x_args:ident),+), $weight_backward:ident,
     $bias_backward:ident, $options:ty, transposed = $transposed:literal) => {
        fn $conv(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: Option<FloatTensor<Self>>,
            options: $options,
        ) -> FloatTensor<Self> {
            let (x_shape, weight_shape) = (x.shape(), weight.shape());
            let (x, weight, bias) = scope::half_operands::<B>(x, weight, bias);
            let output = B::$conv(x, weight, bias, options);
            flops::add(flops::conv(&x_shape, &output.shape(), &weight_shape, $transposed));
            output
        }

        fn $x_backward($($x_args: FloatTensor<Self>,)+ options: $options) -> FloatTensor<Self> {
            // The arguments end with the weight and the output gradient.
            let shapes: Vec<_> = [$(&$x_args),+].iter().map(|t| t.shape()).collect();
            let (weight_shape, output_shape) = (&shapes[shapes.len() - 2], &shapes[shapes.len() - 1]);
            let x_grad = scope::half_backward::<B, _>([$($x_args),+], |[$($x_args),+]| {
                B::$x_backward($($x_args,)+ options)
            });
            flops::add(flops::conv(&x_grad.shape(), output_shape, weight_shape, $transposed));
            x_grad
        }

        fn $weight_backward(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
            options: $options,
        ) -> FloatTensor<Self> {
            flops::add(flops::conv(&x.shape(), &output_grad.shape(), &weight.shape(), $transposed));
            scope::half_backward::<B, 3>([x, weight, output_grad], |[x, weight, output_grad]| {
                B::$weight_backward(x, weight, output_grad, options)
            })
        }

        fn $bias_backward(
            x: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            output_grad: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let output_grad = scope::to_f32::<B>(output_grad);
            let (x, bias, output_grad) = promote::three::<B>(x, bias, output_grad);
            B::$bias_backward(x, bias, output_grad)
        }
    };
}

impl<B: Backend> ModuleOps<Self> for Autocast<B> {
    /// The gradient comes back in the weights' dtype (a half gradient from a half matmul
    /// meets f32 embedding weights).
    fn embedding_backward(
        weights: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let output_grad = promote::like::<B>(&weights, output_grad);
        B::embedding_backward(weights, output_grad, indices)
    }

    forward! { B;
        fn embedding(weights: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self>;
        fn unfold4d(x: FloatTensor<Self>, kernel_size: [usize; 2], options: UnfoldOptions) -> FloatTensor<Self>;
        fn avg_pool1d(x: FloatTensor<Self>, kernel_size: usize, stride: usize, padding: usize, count_include_pad: bool, ceil_mode: bool) -> FloatTensor<Self>;
        fn avg_pool2d(x: FloatTensor<Self>, kernel_size: [usize; 2], stride: [usize; 2], padding: [usize; 2], count_include_pad: bool, ceil_mode: bool) -> FloatTensor<Self>;
        fn adaptive_avg_pool2d(x: FloatTensor<Self>, output_size: [usize; 2]) -> FloatTensor<Self>;
        fn adaptive_avg_pool1d(x: FloatTensor<Self>, output_size: usize) -> FloatTensor<Self>;
        fn max_pool1d(x: FloatTensor<Self>, kernel_size: usize, stride: usize, padding: usize, dilation: usize, ceil_mode: bool) -> FloatTensor<Self>;
        fn max_pool2d(x: FloatTensor<Self>, kernel_size: [usize; 2], stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2], ceil_mode: bool) -> FloatTensor<Self>;
        fn interpolate(x: FloatTensor<Self>, output_size: [usize; 2], options: InterpolateOptions) -> FloatTensor<Self>;
        fn ctc_loss(log_probs: FloatTensor<Self>, targets: IntTensor<Self>, input_lengths: IntTensor<Self>, target_lengths: IntTensor<Self>, blank: usize) -> FloatTensor<Self>;
        fn has_ctc_loss_backward() -> bool;
        fn ctc_loss_backward(log_probs: FloatTensor<Self>, targets: IntTensor<Self>, input_lengths: IntTensor<Self>, target_lengths: IntTensor<Self>, grad_loss: FloatTensor<Self>, blank: usize) -> FloatTensor<Self>;
        fn rfft(signal: FloatTensor<Self>, dim: usize, n: Option<usize>) -> (FloatTensor<Self>, FloatTensor<Self>);
        fn irfft(spectrum_re: FloatTensor<Self>, spectrum_im: FloatTensor<Self>, dim: usize, n: Option<usize>) -> FloatTensor<Self>;
    }

    promoted_conv!(
        conv_transpose1d,
        conv_transpose1d_x_backward(weight, output_grad),
        conv_transpose1d_weight_backward,
        conv_transpose1d_bias_backward,
        ConvTransposeOptions<1>,
        transposed = true
    );
    promoted_conv!(
        conv_transpose2d,
        conv_transpose2d_x_backward(weight, output_grad),
        conv_transpose2d_weight_backward,
        conv_transpose2d_bias_backward,
        ConvTransposeOptions<2>,
        transposed = true
    );
    promoted_conv!(
        conv_transpose3d,
        conv_transpose3d_x_backward(weight, output_grad),
        conv_transpose3d_weight_backward,
        conv_transpose3d_bias_backward,
        ConvTransposeOptions<3>,
        transposed = true
    );

    /// Fused attention (what a backend without Autodiff runs; Autodiff decomposes it into
    /// matmuls and a softmax, which the policy covers): query, key and value in half inside a
    /// scope, as PyTorch's `scaled_dot_product_attention`; the bias in their dtype.
    fn attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        attn_bias: Option<FloatTensor<Self>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Self> {
        let qkv = [query, key, value].map(scope::to_half::<B>).to_vec();
        let [query, key, value]: [FloatTensor<B>; 3] = match promote::all::<B>(qkv).try_into() {
            Ok(qkv) => qkv,
            Err(_) => unreachable!("three tensors in, three out"),
        };
        let attn_bias = attn_bias.map(|bias| promote::like::<B>(&query, bias));
        flops::add(flops::attention(
            &query.shape(),
            &key.shape(),
            &value.shape(),
        ));
        B::attention(query, key, value, mask, attn_bias, options)
    }

    /// Deformable convolution in f32 inside a scope (torchvision's autocast runs it in f32);
    /// its operands promoted to one dtype.
    fn deform_conv2d(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        options: DeformConvOptions<2>,
    ) -> FloatTensor<Self> {
        let (x, offset, weight, mask, bias) = deform_operands::<B>(x, offset, weight, mask, bias);
        B::deform_conv2d(x, offset, weight, mask, bias, options)
    }

    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        flops::add(flops::linear(&x.shape(), last_dim(&weight.shape())));
        linear::forward::<B>(x, weight, bias)
    }

    fn linear_x_backward(
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flops::add(flops::linear(&output_grad.shape(), weight.shape()[0]));
        linear::x_backward::<B>(weight, output_grad)
    }

    fn linear_weight_backward(
        x: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flops::add(flops::linear(&x.shape(), last_dim(&output_grad.shape())));
        linear::weight_backward::<B>(x, output_grad)
    }

    fn linear_bias_backward(output_grad: FloatTensor<Self>) -> FloatTensor<Self> {
        linear::bias_backward::<B>(output_grad)
    }

    promoted_conv!(
        conv1d,
        conv1d_x_backward(x, weight, output_grad),
        conv1d_weight_backward,
        conv1d_bias_backward,
        ConvOptions<1>,
        transposed = false
    );
    promoted_conv!(
        conv2d,
        conv2d_x_backward(x, weight, output_grad),
        conv2d_weight_backward,
        conv2d_bias_backward,
        ConvOptions<2>,
        transposed = false
    );
    promoted_conv!(
        conv3d,
        conv3d_x_backward(x, weight, output_grad),
        conv3d_weight_backward,
        conv3d_bias_backward,
        ConvOptions<3>,
        transposed = false
    );

    promoted! {
        fn avg_pool1d_backward(x, grad, kernel_size: usize, stride: usize, padding: usize, count_include_pad: bool, ceil_mode: bool) -> FloatTensor<Self>;
        fn avg_pool2d_backward(x, grad, kernel_size: [usize; 2], stride: [usize; 2], padding: [usize; 2], count_include_pad: bool, ceil_mode: bool) -> FloatTensor<Self>;
        fn adaptive_avg_pool2d_backward(x, grad) -> FloatTensor<Self>;
        fn adaptive_avg_pool1d_backward(x, grad) -> FloatTensor<Self>;
        fn interpolate_backward(x, grad, output_size: [usize; 2], options: InterpolateOptions) -> FloatTensor<Self>;
    }

    /// Layer norm in f32 inside an op-level autocast scope, on operands of one dtype (above
    /// Autodiff, as one autodiff node: `nodes.rs`).
    fn layer_norm(
        tensor: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        let (tensor, gamma, beta) = match scope::autocast_dtype() {
            Some(_) => match nodes::layer_norm::<B>(tensor, gamma, beta, epsilon) {
                Ok(out) => return out,
                Err(operands) => operands,
            },
            None => (tensor, gamma, beta),
        };
        let (tensor, gamma, beta) =
            promote::with_bias::<B>(scope::to_f32::<B>(tensor), gamma, beta);
        B::layer_norm(tensor, gamma, beta, epsilon)
    }

    fn deform_conv2d_backward(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        output_grad: FloatTensor<Self>,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Self> {
        let (x, offset, weight, mask, bias) = deform_operands::<B>(x, offset, weight, mask, bias);
        let output_grad = promote::like::<B>(&x, output_grad);
        let grads = B::deform_conv2d_backward(x, offset, weight, mask, bias, output_grad, options);
        DeformConv2dBackward {
            x_grad: grads.x_grad,
            offset_grad: grads.offset_grad,
            weight_grad: grads.weight_grad,
            mask_grad: grads.mask_grad,
            bias_grad: grads.bias_grad,
        }
    }

    fn max_pool1d_with_indices(
        x: FloatTensor<Self>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
    ) -> MaxPool1dWithIndices<Self> {
        let pooled =
            B::max_pool1d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool1dWithIndices {
            output: pooled.output,
            indices: pooled.indices,
        }
    }

    fn max_pool1d_with_indices_backward(
        x: FloatTensor<Self>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> MaxPool1dBackward<Self> {
        let (x, output_grad) = promote::pair::<B>(x, output_grad);
        let grads = B::max_pool1d_with_indices_backward(
            x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
            output_grad,
            indices,
        );
        MaxPool1dBackward {
            x_grad: grads.x_grad,
        }
    }

    fn max_pool2d_with_indices(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Self> {
        let pooled =
            B::max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dWithIndices {
            output: pooled.output,
            indices: pooled.indices,
        }
    }

    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> MaxPool2dBackward<Self> {
        let (x, output_grad) = promote::pair::<B>(x, output_grad);
        let grads = B::max_pool2d_with_indices_backward(
            x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
            output_grad,
            indices,
        );
        MaxPool2dBackward {
            x_grad: grads.x_grad,
        }
    }
}

/// A deformable convolution's float operands: in f32 inside a scope, then in one dtype.
type DeformOperands<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
    Option<FloatTensor<B>>,
);

fn deform_operands<B: Backend>(
    x: FloatTensor<B>,
    offset: FloatTensor<B>,
    weight: FloatTensor<B>,
    mask: Option<FloatTensor<B>>,
    bias: Option<FloatTensor<B>>,
) -> DeformOperands<B> {
    let (has_mask, has_bias) = (mask.is_some(), bias.is_some());
    let operands = [Some(x), Some(offset), Some(weight), mask, bias]
        .into_iter()
        .flatten()
        .map(scope::to_f32::<B>)
        .collect();
    let mut all = promote::all::<B>(operands).into_iter();
    let mut next = || all.next().expect("as many tensors out as in");
    let (x, offset, weight) = (next(), next(), next());
    let mask = has_mask.then(&mut next);
    let bias = has_bias.then(&mut next);
    (x, offset, weight, mask, bias)
}

/// A shape's last dim (1 for a scalar).
fn last_dim(shape: &burn::tensor::Shape) -> usize {
    shape.as_slice().last().copied().unwrap_or(1)
}
