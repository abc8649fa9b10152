//! Shared pieces of the checkpoint tests: a small residual MLP stack on `Autodiff<Flex>`.

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use afterburner_checkpoint::Checkpointed;
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Dropout, DropoutConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::gelu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};

pub type B = Autodiff<Flex>;

/// Flex has one process-wide RNG: tests that seed it or draw from it take this lock.
pub fn rng_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pre-norm residual MLP block, with an optional parameter it never uses.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub norm: LayerNorm<B>,
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    pub dropout: Dropout,
    pub unused: Option<Linear<B>>,
}

impl<B: Backend> Mlp<B> {
    pub fn new(dim: usize, dropout: f64, with_unused: bool, device: &B::Device) -> Self {
        Self {
            norm: LayerNormConfig::new(dim).init(device),
            fc1: LinearConfig::new(dim, 2 * dim).init(device),
            fc2: LinearConfig::new(2 * dim, dim).init(device),
            dropout: DropoutConfig::new(dropout).init(),
            unused: with_unused.then(|| LinearConfig::new(dim, dim).init(device)),
        }
    }

    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = gelu(self.fc1.forward(self.norm.forward(x.clone())));
        x + self.fc2.forward(self.dropout.forward(h))
    }
}

/// A stack of wrapped blocks and a head.
#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    pub blocks: Vec<Checkpointed<B, Mlp<B>>>,
    pub head: Linear<B>,
}

impl<B: Backend> Net<B> {
    /// Parameters are initialised here (not lazily), so clones share their values.
    pub fn new(blocks: usize, dim: usize, dropout: f64, device: &B::Device) -> Self {
        initialised(Self {
            blocks: (0..blocks)
                .map(|i| Checkpointed::new(Mlp::new(dim, dropout, i == 0, device)))
                .collect(),
            head: LinearConfig::new(dim, 3).init(device),
        })
    }

    /// Through the wrappers (checkpointed or not, as the policy says).
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self
            .blocks
            .iter()
            .fold(x, |x, block| block.forward(x, |m: &Mlp<B>, x| m.forward(x)));
        self.head.forward(x)
    }

    /// Around the wrappers: the plain model.
    pub fn forward_unwrapped(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self
            .blocks
            .iter()
            .fold(x, |x, block| block.block.forward(x));
        self.head.forward(x)
    }
}

/// Reads every parameter so lazy ones are initialised (a clone of a lazy parameter would
/// initialise again, with other values).
pub fn initialised<BB: Backend, M: Module<BB>>(module: M) -> M {
    struct Touch;
    impl<BB: Backend> ModuleVisitor<BB> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<BB, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
    module
}

pub fn input(device: &burn::tensor::Device<B>) -> Tensor<B, 3> {
    Tensor::random([2, 5, 8], Distribution::Normal(0.0, 1.0), device)
}

/// A loss that weighs every output differently (so every gradient entry matters).
pub fn loss(y: Tensor<B, 3>) -> Tensor<B, 1> {
    let weights = Tensor::<B, 1, burn::tensor::Int>::arange(
        0..y.dims().iter().product::<usize>() as i64,
        &y.device(),
    )
    .float()
    .reshape(y.dims())
    .div_scalar(7.0)
    .sin();
    (y * weights).sum()
}

/// Every float parameter's gradient in visit order (`None` where it has none), flattened.
pub fn param_grads<M: Module<B>>(
    model: &M,
    grads: &<B as AutodiffBackend>::Gradients,
) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a> {
        grads: &'a <B as AutodiffBackend>::Gradients,
        out: Vec<Option<Vec<f32>>>,
    }
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.grads);
            self.out
                .push(grad.map(|g| g.into_data().convert::<f32>().to_vec().unwrap()));
        }
    }
    let mut collect = Collect { grads, out: vec![] };
    model.visit(&mut collect);
    collect.out
}

pub fn flat<const D: usize>(t: Tensor<<B as AutodiffBackend>::InnerBackend, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Largest |a - b| over the largest |b|.
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Asserts two gradient lists agree entry by entry (same presence, max relative error).
pub fn assert_grads_close(a: &[Option<Vec<f32>>], b: &[Option<Vec<f32>>], tol: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        match (x, y) {
            (Some(x), Some(y)) => worst = worst.max(max_rel(x, y)),
            (None, None) => {}
            _ => panic!("parameter {i}: gradient present in one run only"),
        }
    }
    assert!(worst <= tol, "max relative error {worst} > {tol}");
    worst
}
