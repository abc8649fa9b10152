//! TF32 emulated on any backend: inside [`emulate_tf32`], `Autocast<B>` rounds the f32 inputs
//! of every matmul and Linear (forward and gradients) to TF32's 11 significant bits before the
//! f32 product, as NVIDIA tensor cores stage f32 matmuls (and Burn 0.21's CUDA backend does
//! whenever it picks a tensor-core kernel, with no switch to turn it off). A check run on the
//! CPU under it measures what TF32 alone changes in its result: the error to allow the same
//! check on CUDA. Convolutions are not rounded.
//!
//! The rounding is Veltkamp's split with `s = 13`: `c = x * 8193; hi = c - (c - x)` keeps the
//! 24 - 13 = 11 leading bits of `x`, rounded to nearest, in three f32 ops.

use core::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};

thread_local! {
    /// Whether this thread's matmul inputs are rounded to TF32.
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the f32 inputs of matmuls and Linears rounded to TF32 on this thread (a
/// backend with `Autocast` in its stack; each in-process rank sets it on its own thread).
pub fn emulate_tf32<R>(f: impl FnOnce() -> R) -> R {
    let previous = ON.with(|on| on.replace(true));
    /// Puts the previous setting back, also when `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON.with(|on| on.set(self.0));
        }
    }
    let _restore = Restore(previous);
    f()
}

/// `tensor` rounded to TF32 when emulation is on and it is f32; as it is otherwise.
pub(super) fn round<B: Backend>(tensor: FloatTensor<B>) -> FloatTensor<B> {
    if !ON.with(Cell::get) || tensor.dtype() != DType::F32 {
        return tensor;
    }
    let c = B::float_mul_scalar(tensor.clone(), 8193.0f32.into());
    let low = B::float_sub(c.clone(), tensor);
    B::float_sub(c, low)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Autocast;
    use burn::backend::Flex;
    use burn::tensor::Tensor;

    #[test]
    fn keeps_eleven_significant_bits_rounded_to_nearest() {
        let device = Default::default();
        // 1 + 2^-10 is TF32; 1 + 2^-11 + 2^-12 rounds up to 1 + 2^-10; 3 + 2^-11 rounds to 3.
        let x = [
            1.0 + 2f32.powi(-10),
            1.0 + 2f32.powi(-11) + 2f32.powi(-12),
            3.0 + 2f32.powi(-11),
        ];
        let ones = Tensor::<Autocast<Flex>, 2>::from_floats([[1.0]], &device);
        let column = Tensor::<Autocast<Flex>, 2>::from_floats([[x[0]], [x[1]], [x[2]]], &device);
        let exact = column.clone().matmul(ones.clone());
        let rounded = emulate_tf32(|| column.matmul(ones));
        let values = |t: Tensor<Autocast<Flex>, 2>| t.into_data().to_vec::<f32>().unwrap();
        assert_eq!(values(exact), x.to_vec());
        assert_eq!(
            values(rounded),
            vec![1.0 + 2f32.powi(-10), 1.0 + 2f32.powi(-10), 3.0]
        );
    }
}
