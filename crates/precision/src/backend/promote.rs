//! Float dtype promotion for the ops that take two float tensors, as PyTorch promotes: an op
//! on an f32 and a bf16 tensor runs in f32 (Burn's backends assert on such a mix instead).
//!
//! Ops that combine their operands (`add`, `mul`, `matmul`, comparisons, `cat`,
//! `mask_where`) run in the wider dtype; ops that write values into a tensor (`slice_assign`,
//! `scatter_add`, `select_add`, `scatter_nd`) cast the values to the tensor's dtype, as an
//! in-place write does in PyTorch.

use burn::tensor::DType;
use burn::tensor::FloatDType;
use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// How wide a float dtype is, for promotion; `None` for dtypes that are not floats.
fn width(dtype: DType) -> Option<u8> {
    match dtype {
        DType::F64 => Some(3),
        DType::F32 | DType::Flex32 => Some(2),
        DType::F16 | DType::BF16 => Some(1),
        _ => None,
    }
}

/// The dtype two float dtypes meet at: the wider one; f32 for f16 with bf16 (neither holds
/// the other). `None` when nothing should change (equal dtypes, or a dtype that is not a
/// float).
pub(super) fn common(a: DType, b: DType) -> Option<DType> {
    if a == b {
        return None;
    }
    let (wa, wb) = (width(a)?, width(b)?);
    Some(match wa.cmp(&wb) {
        core::cmp::Ordering::Greater => a,
        core::cmp::Ordering::Less => b,
        core::cmp::Ordering::Equal => DType::F32,
    })
}

/// `tensor` in `dtype` (unchanged when it already is, or when `dtype` is not a float).
pub(super) fn cast<B: Backend>(tensor: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if tensor.dtype() == dtype || width(dtype).is_none() {
        tensor
    } else {
        B::float_cast(tensor, FloatDType::from(dtype))
    }
}

/// Both operands in the dtype they meet at.
pub(super) fn pair<B: Backend>(
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    match common(lhs.dtype(), rhs.dtype()) {
        None => (lhs, rhs),
        Some(dtype) => (cast::<B>(lhs, dtype), cast::<B>(rhs, dtype)),
    }
}

/// `values` in `target`'s dtype, for ops that write values into `target`.
pub(super) fn like<B: Backend>(target: &FloatTensor<B>, values: FloatTensor<B>) -> FloatTensor<B> {
    cast::<B>(values, target.dtype())
}

/// `x`, `weight` and `bias` in the widest dtype among them (linear and convolutions).
pub(super) fn with_bias<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let has_bias = bias.is_some();
    let mut all = all::<B>([x, weight].into_iter().chain(bias).collect()).into_iter();
    let (x, weight) = (all.next().unwrap(), all.next().unwrap());
    (x, weight, if has_bias { all.next() } else { None })
}

/// Three operands in the widest dtype among them (the backward ops of linear and
/// convolutions).
pub(super) fn three<B: Backend>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    c: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (a, b, c) = with_bias::<B>(a, b, Some(c));
    (a, b, c.expect("three tensors in, three out"))
}

/// The widest dtype among `tensors` (the one they all meet at); `None` for no tensors.
pub(super) fn widest<B: Backend>(tensors: &[FloatTensor<B>]) -> Option<DType> {
    let first = tensors.first().map(TensorMetadata::dtype)?;
    Some(
        tensors
            .iter()
            .map(TensorMetadata::dtype)
            .fold(first, |acc, d| common(acc, d).unwrap_or(acc)),
    )
}

/// Every tensor in the widest dtype among them.
pub(super) fn all<B: Backend>(tensors: Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>> {
    let Some(widest) = widest::<B>(&tensors) else {
        return tensors;
    };
    tensors.into_iter().map(|t| cast::<B>(t, widest)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wider_float_wins_and_halves_meet_at_f32() {
        assert_eq!(common(DType::F32, DType::BF16), Some(DType::F32));
        assert_eq!(common(DType::F16, DType::F64), Some(DType::F64));
        assert_eq!(common(DType::F16, DType::BF16), Some(DType::F32));
        assert_eq!(common(DType::BF16, DType::BF16), None);
        assert_eq!(common(DType::F32, DType::I64), None);
    }
}
