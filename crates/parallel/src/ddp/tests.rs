//! DDP's overlap: gradients reach the thread block by block during backward, and the step's
//! result is bitwise the reduction after backward's.

use std::sync::{Arc, Mutex};

use afterburner_checkpoint::{CheckpointPolicy, Checkpointed, with_policy};
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use crate::{Ddp, LaunchConfig, ProcessGroup, launch};

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    blocks: Vec<Checkpointed<B, Linear<B>>>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let blocks = (0..3)
            .map(|_| Checkpointed::new(LinearConfig::new(8, 8).init(device)))
            .collect();
        Self { blocks }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for block in &self.blocks {
            x = block.forward(x, |linear: &Linear<B>, x| linear.forward(x).tanh());
        }
        x
    }
}

fn values(model: &Net<B>) -> Vec<u32> {
    struct Bits(Vec<u32>);
    impl ModuleVisitor<Flex> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.iter::<f32>().map(f32::to_bits));
        }
    }
    let mut bits = Bits(Vec::new());
    model.valid().visit(&mut bits);
    bits.0
}

#[test]
fn gradients_reach_the_thread_block_by_block_during_backward() {
    let orders =
        launch::<Flex, _, String, _>(vec![Default::default()], LaunchConfig::default(), |group| {
            let device = Default::default();
            let ddp = Ddp::<B, _>::new(crate::SharedGroup::new(group));
            let ddp = ddp.with_overlap().map_err(|e| e.to_string())?;
            let model = Net::<B>::new(&device);
            let view = ddp.view(&model, None).ok_or("no view")?;
            let x = Tensor::<B, 2>::random([4, 8], Distribution::Default, &device);
            view.forward(x).sum().backward();
            let arrived = ddp.reducer.as_ref().unwrap().arrived();
            ddp.finish_backward().map_err(|e| e.to_string())?;
            Ok(arrived)
        })
        .unwrap();
    // Visit order: block 0's weight and bias are 0 and 1, block 2's are 4 and 5.
    let block = |index: usize| index / 2;
    let arrived: Vec<usize> = orders[0].iter().map(|&i| block(i)).collect();
    assert_eq!(arrived.len(), 6, "{:?}", orders[0]);
    assert!(
        arrived.windows(2).all(|w| w[0] >= w[1]),
        "the last block's gradients first, the first block's last: {:?}",
        orders[0]
    );
}

/// Burn's own layers after a parameter-free checkpointed probe, which backward recomputes
/// once it reaches the start of the model.
#[derive(Module, Debug)]
struct ProbeThenLayers<B: Backend> {
    probe: Checkpointed<B, Relu>,
    layers: Vec<Linear<B>>,
}

#[test]
fn a_model_of_burns_own_layers_hands_its_gradients_over_during_backward() {
    let seen =
        launch::<Flex, _, String, _>(vec![Default::default()], LaunchConfig::default(), |group| {
            let device = Default::default();
            afterburner_checkpoint::enable::<B>();
            let ddp = Ddp::<B, _>::new(crate::SharedGroup::new(group));
            let ddp = ddp.with_overlap().map_err(|e| e.to_string())?;
            let model = ProbeThenLayers {
                probe: Checkpointed::new(Relu::new()),
                layers: (0..3)
                    .map(|_| LinearConfig::new(8, 8).init(&device))
                    .collect(),
            };
            let view = ddp.view(&model, None).ok_or("no view")?;
            let reducer = ddp.reducer.clone().ok_or("no reducer")?;
            // Gradients at the thread when the probe runs: in the forward pass, and when
            // backward recomputes it (after every layer's backward).
            let seen = Arc::new(Mutex::new(Vec::new()));
            let x = Tensor::<B, 2>::random([4, 8], Distribution::Default, &device)
                .require_grad()
                .mul_scalar(2.0)
                .add_scalar(1.0);
            let out = with_policy(CheckpointPolicy::All, || {
                let seen = seen.clone();
                let mut x = view.probe.forward(x, move |relu: &Relu, x: Tensor<B, 2>| {
                    seen.lock().unwrap().push(reducer.arrived().len());
                    relu.forward(x)
                });
                for layer in &view.layers {
                    x = layer.forward(x).tanh();
                }
                x
            });
            out.sum().backward();
            ddp.finish_backward().map_err(|e| e.to_string())?;
            let seen = seen.lock().unwrap().clone();
            Ok(seen)
        })
        .unwrap();
    // The 3 layers' weights and biases, all handed over before backward reached the probe
    // (hooks at the end of backward would give [0, 0]).
    assert_eq!(seen[0], vec![0, 6]);
}

#[test]
fn overlapped_steps_equal_the_reduction_after_backward_bitwise() {
    let initial = Net::<B>::new(&Default::default());
    values(&initial); // Burn initialises parameters at their first read: now, once for both runs
    let data: Vec<Tensor<B, 2>> = (0..3)
        .map(|_| Tensor::random([8, 8], Distribution::Default, &Default::default()))
        .collect();
    let run = |overlap: bool| {
        let (initial, data) = (initial.clone(), data.clone());
        launch::<Flex, _, String, _>(
            vec![Default::default(); 2],
            LaunchConfig::default(),
            move |group| {
                let rank = group.rank();
                let mut ddp = Ddp::<B, _>::new(crate::SharedGroup::new(group))
                    .with_bucket_cap_mb(1e-4)
                    .map_err(|e| e.to_string())?;
                if overlap {
                    ddp = ddp.with_overlap().map_err(|e| e.to_string())?;
                }
                let mut model = ddp.setup(initial.clone()).map_err(|e| e.to_string())?;
                let mut optim = SgdConfig::new().init();
                for batch in &data {
                    let x = batch.clone().narrow(0, rank * 4, 4);
                    let loss = match ddp.view(&model, None) {
                        Some(view) => view.forward(x).powi_scalar(2).mean(),
                        None => model.forward(x).powi_scalar(2).mean(),
                    };
                    let mut grads = GradientsParams::from_grads(loss.backward(), &model);
                    ddp.sync_gradients(&model, &mut grads)
                        .map_err(|e| e.to_string())?;
                    model = optim.step(0.1, model, grads);
                }
                let overlapped = ddp.overlapped_syncs();
                Ok((values(&model), ddp.all_reduce_count(), overlapped))
            },
        )
        .unwrap()
    };
    let after = run(false);
    let during = run(true);
    assert_eq!(during[0].0, during[1].0, "replicas identical");
    assert_eq!(during[0].0, after[0].0, "overlap changes no bit");
    assert_eq!(during[0].1, after[0].1, "the same buckets");
    assert_eq!(during[0].1, 3 * 6, "one bucket per parameter here, 3 steps");
    assert_eq!(
        (during[0].2, after[0].2),
        (3, 0),
        "reduced by the thread, or after backward"
    );
}

/// [`Net`] with a layer the forward pass never uses, visited first: its buckets go last.
#[derive(Module, Debug)]
struct WithUnused<B: Backend> {
    unused: Linear<B>,
    net: Net<B>,
}

#[test]
fn buckets_of_parameters_without_gradients_go_out_after_the_others() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = launch::<Flex, _, String, _>(
            vec![Default::default()],
            LaunchConfig::default(),
            |group| {
                let device = Default::default();
                let mut ddp = Ddp::<B, _>::new(crate::SharedGroup::new(group))
                    .with_bucket_cap_mb(1e-6)
                    .map_err(|e| e.to_string())?
                    .with_overlap()
                    .map_err(|e| e.to_string())?;
                let model = WithUnused {
                    unused: LinearConfig::new(8, 8).init(&device),
                    net: Net::<B>::new(&device),
                };
                let view = ddp.view(&model, None).ok_or("no view")?;
                let x = Tensor::<B, 2>::random([4, 8], Distribution::Default, &device);
                let loss = view.net.forward(x).sum();
                let mut grads = GradientsParams::from_grads(loss.backward(), &model);
                ddp.sync_gradients(&model, &mut grads)
                    .map_err(|e| e.to_string())?;
                Ok((grads.len(), ddp.overlapped_syncs()))
            },
        );
        let _ = done.send(result);
    });
    let result = finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the sync finishes (the unused layer's buckets go out with zeros)");
    // The unused layer's weight and bias get no gradient; the 3 blocks' 6 parameters do.
    assert_eq!(result.unwrap()[0], (6, 1));
}
