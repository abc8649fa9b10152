// afterburner-checkpoint alone, in a plain Burn loop (no facade): each block of a small
// residual MLP is wrapped in `Checkpointed`, so under a recomputing policy its inner
// activations are dropped after the forward pass and recomputed in the backward pass; the
// gradients are the plain model's, bit for bit.
// `cargo run -p afterburner-checkpoint --example checkpointed_loop`.
use afterburner_checkpoint::{CheckpointPolicy, Checkpointed, enable, with_policy};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Gelu, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Tensor};

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Block<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
    act: Gelu,
}

impl<B: Backend> Block<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.clone() + self.down.forward(self.act.forward(self.up.forward(x)))
    }
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    blocks: Vec<Checkpointed<B, Block<B>>>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let block = || Block {
            up: LinearConfig::new(16, 64).init(device),
            down: LinearConfig::new(64, 16).init(device),
            act: Gelu::new(),
        };
        Self {
            // (1) Wrap each block; the policy in force decides whether it recomputes.
            blocks: (0..4).map(|_| Checkpointed::new(block())).collect(),
            head: LinearConfig::new(16, 1).init(device),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for block in &self.blocks {
            x = block.forward(x, |block: &Block<B>, x| block.forward(x));
        }
        self.head.forward(x)
    }
}

/// Every gradient of `net`, flattened in visit order.
fn flat_grads(net: &Net<B>, grads: &GradientsParams) -> Vec<f32> {
    struct Collect<'a>(&'a GradientsParams, Vec<f32>);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.0.get::<Flex, D>(param.id) {
                self.1
                    .extend(g.into_data().to_vec::<f32>().unwrap_or_default());
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    net.visit(&mut collect);
    collect.1
}

fn loss(
    net: &Net<B>,
    x: &Tensor<B, 2>,
    y: &Tensor<B, 2>,
    policy: CheckpointPolicy,
) -> Tensor<B, 1> {
    // (2) Run the forward pass inside the policy.
    let out = with_policy(policy, || net.forward(x.clone()));
    (out - y.clone()).powi_scalar(2).mean()
}

fn main() {
    let device = Default::default();
    // (3) Let wrappers checkpoint on this autodiff backend (once).
    enable::<B>();
    B::seed(&device, 0);
    let mut net = Net::<B>::new(&device);
    let x = Tensor::<B, 2>::random([32, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1);

    let plain = loss(&net, &x, &y, CheckpointPolicy::None).backward();
    let recomputed = loss(&net, &x, &y, CheckpointPolicy::All).backward();
    let (plain, recomputed) = (
        flat_grads(&net, &GradientsParams::from_grads(plain, &net)),
        flat_grads(&net, &GradientsParams::from_grads(recomputed, &net)),
    );
    assert!(!plain.is_empty());
    assert!(
        plain
            .iter()
            .zip(&recomputed)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "checkpointed gradients equal the plain ones"
    );
    println!(
        "{} gradient values, equal with and without checkpointing",
        plain.len()
    );

    let mut optim = AdamConfig::new().init();
    let mut first = f32::NAN;
    for step in 0..40 {
        let l = loss(&net, &x, &y, CheckpointPolicy::All);
        let value: f32 = l.clone().into_scalar().elem();
        if step == 0 {
            first = value;
        }
        let grads = GradientsParams::from_grads(l.backward(), &net);
        net = optim.step(3e-3, net, grads);
        if step == 39 {
            println!("loss {first:.4} -> {value:.4}");
            assert!(value < first / 2.0, "training under checkpointing learns");
        }
    }
}
