//! Counted FLOPs: every matmul, Linear, convolution and fused attention that runs through
//! [`Autocast`](crate::Autocast) adds its floating-point operations (a multiply-add counts 2)
//! to a counter of the calling thread, forward and backward alike: under
//! `Autodiff<Autocast<B>>` the gradients' matmuls and convolutions run through `Autocast`
//! too. Elementwise ops, norms, softmax and reductions are not counted (they are a few percent
//! of a transformer's FLOPs, and MFU conventionally leaves them out).
//!
//! What is counted is what ran: an input gradient Autodiff does not need (the first layer's
//! input) is not computed and not counted, and activation checkpointing's recomputed forward
//! is (hardware FLOPs).
//!
//! ```
//! use afterburner_precision::{Autocast, count_flops};
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//!
//! let device = Default::default();
//! let a = Tensor::<Autocast<Flex>, 2>::ones([4, 8], &device);
//! let b = Tensor::<Autocast<Flex>, 2>::ones([8, 3], &device);
//! let (_, flops) = count_flops(|| a.matmul(b));
//! assert_eq!(flops, 2 * 4 * 8 * 3);
//! ```

use std::cell::Cell;

use burn::tensor::Shape;

thread_local! {
    /// FLOPs this thread's counted ops have run.
    static COUNTED: Cell<u64> = const { Cell::new(0) };
    /// Whether this thread counts (on unless [`set_flop_counting`] turned it off).
    static COUNTING: Cell<bool> = const { Cell::new(true) };
}

/// Turns this thread's counting on or off (it is on by default: the cost is an addition per
/// matmul or convolution); returns the previous setting.
pub fn set_flop_counting(on: bool) -> bool {
    COUNTING.with(|counting| counting.replace(on))
}

/// FLOPs the counted ops (matmul, Linear, convolutions, attention) of this thread have run
/// since it started; the difference of two readings is what ran between them.
pub fn flops_counted() -> u64 {
    COUNTED.with(Cell::get)
}

/// Runs `f` and returns its result with the FLOPs its counted ops ran on this thread.
pub fn count_flops<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = flops_counted();
    let result = f();
    (result, flops_counted().wrapping_sub(before))
}

/// Adds `flops` to this thread's counter.
pub(crate) fn add(flops: u64) {
    if COUNTING.with(Cell::get) {
        COUNTED.with(|counted| counted.set(counted.get().wrapping_add(flops)));
    }
}

/// A (batched, broadcast) matmul `[..., m, k] x [..., k, n]`: `2 * batch * m * k * n`.
pub(crate) fn matmul(lhs: &Shape, rhs: &Shape) -> u64 {
    let (l, r) = (lhs.as_slice(), rhs.as_slice());
    if l.len() < 2 || r.len() < 2 {
        return 0;
    }
    let (m, k, n) = (l[l.len() - 2], l[l.len() - 1], r[r.len() - 1]);
    let (lb, rb) = (&l[..l.len() - 2], &r[..r.len() - 2]);
    let batch: usize = (0..lb.len().max(rb.len()))
        .map(|i| {
            let dim = |b: &[usize]| b.len().checked_sub(i + 1).map_or(1, |j| b[j]);
            dim(lb).max(dim(rb))
        })
        .product();
    2 * (batch * m * k * n) as u64
}

/// A Linear's forward or one of its gradients, from the `[..., d]` tensor that meets the
/// `[d_in, d_out]` weight and the size of the weight's other side: `2 * numel * other`.
pub(crate) fn linear(operand: &Shape, other_side: usize) -> u64 {
    2 * (operand.num_elements() * other_side) as u64
}

/// A convolution's forward or one of its gradients: `2 * positions * numel(weight)`, where
/// the positions are the batch times the spatial size of the side whose channels are the
/// weight's first dim (the output of a convolution, the input of a transposed one).
pub(crate) fn conv(x: &Shape, output: &Shape, weight: &Shape, transposed: bool) -> u64 {
    let side = if transposed { x } else { output };
    let channels = side.as_slice().get(1).copied().unwrap_or(1).max(1);
    let positions = side.num_elements() / channels;
    2 * (positions * weight.num_elements()) as u64
}

/// Fused attention `[b, h, sq, d] x [b, h, sk, d]`, then `x [b, h, sk, dv]`:
/// `2 * b * h * sq * sk * (d + dv)`.
pub(crate) fn attention(query: &Shape, key: &Shape, value: &Shape) -> u64 {
    let sk = key.as_slice().get(2).copied().unwrap_or(0);
    let d = query.as_slice().last().copied().unwrap_or(0);
    let dv = value.as_slice().last().copied().unwrap_or(0);
    let rows = query.num_elements() / d.max(1);
    2 * (rows * sk * (d + dv)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formulas_are_the_closed_forms() {
        let s = |dims: &[usize]| Shape::from(dims.to_vec());
        assert_eq!(matmul(&s(&[4, 8]), &s(&[8, 3])), 2 * 4 * 8 * 3);
        // Broadcast batch dims: [2, 1, m, k] x [5, k, n] runs 2 * 5 matmuls.
        assert_eq!(
            matmul(&s(&[2, 1, 4, 8]), &s(&[5, 8, 3])),
            2 * 10 * 4 * 8 * 3
        );
        assert_eq!(linear(&s(&[2, 3, 16]), 32), 2 * 6 * 16 * 32);
        // Conv2d 3 -> 8 channels, 3x3 kernel, output 2 x 8 x 5 x 5.
        let w = s(&[8, 3, 3, 3]);
        let flops = 2 * (2 * 25) * 8 * 27;
        assert_eq!(conv(&s(&[2, 3, 7, 7]), &s(&[2, 8, 5, 5]), &w, false), flops);
        // Transposed: the weight [c_in, c_out, k, k] meets every input position.
        let wt = s(&[3, 8, 3, 3]);
        let flops = 2 * (2 * 25) * 3 * 72;
        assert_eq!(conv(&s(&[2, 3, 5, 5]), &s(&[2, 8, 7, 7]), &wt, true), flops);
        let q = s(&[2, 4, 6, 8]);
        let kv = s(&[2, 4, 10, 8]);
        assert_eq!(attention(&q, &kv, &kv), 2 * 2 * 4 * 6 * 10 * 16);
    }

    #[test]
    fn counting_can_be_turned_off_on_this_thread() {
        let before = flops_counted();
        assert!(set_flop_counting(false));
        add(100);
        assert_eq!(flops_counted(), before);
        assert!(!set_flop_counting(true));
        add(100);
        assert_eq!(flops_counted(), before + 100);
    }
}
