//! Op-level autocast, as `torch.autocast` does it: inside [`autocast_ops`], `Autocast<B>` runs
//! matmul, Linear, fused attention and the (transposed) convolutions in the half dtype, the
//! deformable convolution and grid sampling in f32, and the precision-sensitive ops
//! (exp, log, sums, means, products, cumulative sums, powers, reciprocals, softmax, layer
//! norm) in f32; everything else runs in its inputs' dtype, mixed dtypes promoting to the
//! wider one (`promote.rs`). Parameters stay f32; the casts happen per op.
//!
//! The scope is per thread (each in-process rank has its own) and nests; outside it
//! `Autocast<B>` computes as `B` does. Autodiff records the ops as called (an f32 matmul
//! whose result happens to be half), so gradients reach the f32 parameters. The backward pass
//! runs under the scope that is current where `backward()` is called: `Accelerator::backward`
//! opens the forward's, so the backward ops of Linear and the convolutions run in half and
//! deliver their gradients in their operands' widest dtype (`half_backward`), and
//! checkpointed blocks recompute under the same policy as their forward. Outside a scope the
//! backward runs as the ops come (a half gradient meeting an f32 saved input in f32).

use core::cell::Cell;

use burn::tensor::DType;
use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::{nodes, promote};

thread_local! {
    /// The half dtype of the innermost [`autocast_ops`] scope on this thread.
    static HALF: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with op-level autocast to `half` (`DType::BF16` or `DType::F16`) on this thread,
/// for a backend with `Autocast` in its stack (`Autodiff<Autocast<B>>`): matmul, Linear and
/// convolutions in `half`, reductions, exp/log, powers and normalisations in f32. Any other
/// dtype turns it off inside `f` (`DType::F32`: a region in full precision, like
/// `torch.autocast(enabled=False)`).
pub fn autocast_ops<R>(half: DType, f: impl FnOnce() -> R) -> R {
    let half = matches!(half, DType::BF16 | DType::F16).then_some(half);
    let previous = HALF.with(|h| h.replace(half));
    /// Puts the enclosing scope back, also when `f` panics.
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HALF.with(|h| h.set(self.0));
            if self.0.is_none() {
                nodes::clear_cached_casts();
            }
        }
    }
    let _restore = Restore(previous);
    f()
}

/// The half dtype of the current scope on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    HALF.with(Cell::get)
}

/// `tensor` in the scope's half dtype when it is wider (an op autocast runs in half).
pub(super) fn to_half<B: Backend>(tensor: FloatTensor<B>) -> FloatTensor<B> {
    match autocast_dtype() {
        Some(half) if matches!(tensor.dtype(), DType::F32 | DType::F64) => {
            nodes::cached_cast::<B>(tensor, half)
        }
        _ => tensor,
    }
}

/// `tensor` in f32 when a scope is on and it is half (an op autocast runs in f32).
pub(super) fn to_f32<B: Backend>(tensor: FloatTensor<B>) -> FloatTensor<B> {
    match autocast_dtype() {
        Some(_) if matches!(tensor.dtype(), DType::F16 | DType::BF16) => {
            promote::cast::<B>(tensor, DType::F32)
        }
        _ => tensor,
    }
}

/// The operands of an op that autocast runs in half (Linear, the convolutions): in half inside a
/// scope, then promoted to one dtype (an f32 activation meeting half weights outside a scope
/// runs in f32).
pub(super) fn half_operands<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let (x, weight) = (to_half::<B>(x), to_half::<B>(weight));
    promote::with_bias::<B>(x, weight, bias.map(to_half::<B>))
}

/// A backward op of an op that autocast runs in half (Linear, the convolutions): inside a
/// scope, its operands in half and its result back in the widest dtype they came in, so an f32
/// parameter's gradient is computed in half and delivered in f32, as PyTorch's autograd casts
/// a gradient to its tensor's dtype (a half product that overflows is inf in f32 too, which
/// is what the 16-mixed loss scaler must see). Outside a scope the operands are promoted to
/// one dtype and the result is the op's.
pub(super) fn half_backward<B: Backend, const N: usize>(
    operands: [FloatTensor<B>; N],
    op: impl FnOnce([FloatTensor<B>; N]) -> FloatTensor<B>,
) -> FloatTensor<B> {
    let Some(widest) = promote::widest::<B>(&operands) else {
        return op(operands);
    };
    if autocast_dtype().is_some() {
        return promote::cast::<B>(op(operands.map(to_half::<B>)), widest);
    }
    op(operands.map(|t| promote::cast::<B>(t, widest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_end() {
        assert_eq!(autocast_dtype(), None);
        autocast_ops(DType::BF16, || {
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            autocast_ops(DType::F32, || assert_eq!(autocast_dtype(), None));
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        });
        assert_eq!(autocast_dtype(), None);
        let caught = std::panic::catch_unwind(|| autocast_ops(DType::F16, || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(autocast_dtype(), None, "a panic inside ends the scope");
    }
}
