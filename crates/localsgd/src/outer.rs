//! [`OuterSgd`]: DiLoCo's outer optimizer, SGD with (Nesterov) momentum over one flat tensor,
//! with PyTorch's formula (dampening 0): `buf = g` at the first step, then
//! `buf = momentum * buf + g`; the update is `g + momentum * buf` with Nesterov, `buf`
//! without, `g` when momentum is 0; `param -= lr * update`.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// SGD with momentum on a flat parameter tensor (Burn's own `Momentum` uses dampening 0.1 by
/// default; this follows PyTorch's `SGD(momentum=m, nesterov=True)`).
#[derive(Debug, Clone)]
pub struct OuterSgd<B: Backend> {
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0 for plain SGD).
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// The momentum buffer (after the first step with momentum).
    pub buffer: Option<Tensor<B, 1>>,
}

impl<B: Backend> OuterSgd<B> {
    /// An outer optimizer with no momentum buffer yet.
    pub fn new(lr: f64, momentum: f64, nesterov: bool) -> Self {
        Self {
            lr,
            momentum,
            nesterov,
            buffer: None,
        }
    }

    /// `params` after one step along `grad`.
    pub fn step(&mut self, params: Tensor<B, 1>, grad: Tensor<B, 1>) -> Tensor<B, 1> {
        let update = if self.momentum == 0.0 {
            grad
        } else {
            let buffer = match self.buffer.take() {
                Some(buffer) => buffer.mul_scalar(self.momentum) + grad.clone(),
                None => grad.clone(),
            };
            self.buffer = Some(buffer.clone());
            match self.nesterov {
                true => grad + buffer.mul_scalar(self.momentum),
                false => buffer,
            }
        };
        params - update.mul_scalar(self.lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn value(t: &Tensor<Flex, 1>) -> f32 {
        t.clone().into_data().to_vec::<f32>().unwrap()[0]
    }

    #[test]
    fn nesterov_matches_pytorch_sgd_by_hand() {
        // PyTorch SGD(lr=0.7, momentum=0.9, nesterov=True) on p = 0 with gradients 1, 1, -2:
        // buf 1 -> update 1.9 -> p -1.33; buf 1.9 -> update 2.71 -> p -3.227;
        // buf -0.29 -> update -2.261 -> p -1.6443.
        let device = Default::default();
        let mut sgd = OuterSgd::<Flex>::new(0.7, 0.9, true);
        let mut p = Tensor::<Flex, 1>::from_floats([0.0], &device);
        let mut seen = Vec::new();
        for g in [1.0, 1.0, -2.0] {
            p = sgd.step(p, Tensor::from_floats([g], &device));
            seen.push(value(&p));
        }
        for (got, want) in seen.iter().zip([-1.33, -3.227, -1.6443]) {
            assert!((got - want).abs() < 1e-5, "{seen:?}");
        }
    }

    #[test]
    fn plain_momentum_and_no_momentum() {
        let device = Default::default();
        let mut heavy = OuterSgd::<Flex>::new(1.0, 0.5, false);
        let mut p = Tensor::<Flex, 1>::from_floats([0.0], &device);
        p = heavy.step(p, Tensor::from_floats([1.0], &device)); // buf 1 -> p -1
        p = heavy.step(p, Tensor::from_floats([1.0], &device)); // buf 1.5 -> p -2.5
        assert!((value(&p) + 2.5).abs() < 1e-6);
        let mut plain = OuterSgd::<Flex>::new(0.5, 0.0, false);
        let p = plain.step(
            Tensor::from_floats([1.0], &device),
            Tensor::from_floats([2.0], &device),
        );
        assert!(value(&p).abs() < 1e-6 && plain.buffer.is_none());
    }
}
