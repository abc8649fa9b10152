// afterburner-parallel alone, in a plain Burn loop (no facade): DDP on 2 worker threads of one
// process (`launch`), each training on its shard of the data (`DistributedSampler`); `Ddp`
// gives every rank rank 0's parameters and averages the gradients once per step, so the
// replicas stay identical. `cargo run -p afterburner-parallel --example ddp_loop`.
use afterburner_parallel::{
    Ddp, DistributedSampler, LaunchConfig, ParallelError, ProcessGroup, launch,
};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.out.forward(self.act.forward(self.hidden.forward(x)))
    }
}

/// Every parameter value, flattened in visit order.
fn flat_params(model: &Mlp<B>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0
                .extend(param.val().into_data().to_vec::<f32>().unwrap_or_default());
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

fn main() -> Result<(), ParallelError> {
    let device = Default::default();
    B::seed(&device, 0);
    // Built before the workers start (Flex has one RNG per process); `setup` broadcasts
    // rank 0's parameters anyway.
    let model = Mlp::<B> {
        hidden: LinearConfig::new(8, 32).init(&device),
        out: LinearConfig::new(32, 1).init(&device),
        act: Relu::new(),
    };
    let x = Tensor::<B, 2>::random([64, 8], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1);

    let results = launch::<Flex, _, ParallelError, _>(
        vec![Default::default(); 2],
        LaunchConfig::default(),
        move |group| {
            let device = *group.device();
            let sampler = DistributedSampler::new(64, 2, group.rank())?.shuffle(7);
            // (1) DDP over this worker's group; (2) rank 0's parameters on every rank.
            let mut ddp = Ddp::<B, _>::new(group);
            let mut model = ddp.setup(model.clone().fork(&device))?;
            let mut optim = SgdConfig::new().init();
            let mut last = f32::NAN;
            for epoch in 0..30 {
                // (3) This rank's shard of the data, reshuffled every epoch.
                let indices = sampler.indices(epoch).into_iter().map(|i| i as i64);
                let indices =
                    Tensor::<B, 1, Int>::from_data(indices.collect::<Vec<_>>().as_slice(), &device);
                let (xb, yb) = (
                    x.clone().select(0, indices.clone()),
                    y.clone().select(0, indices),
                );
                let loss = (model.forward(xb) - yb).powi_scalar(2).mean();
                last = loss.clone().into_scalar().elem();
                let mut grads = GradientsParams::from_grads(loss.backward(), &model);
                // (4) One all-reduce: every rank steps with the mean gradient.
                ddp.sync_gradients(&model, &mut grads)?;
                model = optim.step(0.05, model, grads);
            }
            Ok((flat_params(&model), last))
        },
    )?;
    let (rank0, rank1) = (&results[0], &results[1]);
    println!(
        "final losses on each rank's shard: {:.4}, {:.4}",
        rank0.1, rank1.1
    );
    assert_eq!(rank0.0, rank1.0, "the replicas stay identical");
    Ok(())
}
