//! Burn's own BalancedCheckpointing backend, alone and with wrapped blocks, gives the plain
//! gradients.

mod common;

use afterburner_checkpoint::{Balanced, CheckpointPolicy, enable, with_policy};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use common::*;

#[test]
fn balanced_backend_with_and_without_wrappers_matches_the_plain_model() {
    let _lock = rng_lock();
    type Bal = Balanced<Flex>;
    enable::<Bal>();
    let device = Default::default();
    // Same weights on both backends: both draw from Flex's RNG after the same seed.
    B::seed(&device, 11);
    let net_b = Net::<B>::new(3, 8, 0.0, &device);
    Bal::seed(&device, 11);
    let net = Net::<Bal>::new(3, 8, 0.0, &device);
    let x = input(&device);
    let plain = {
        let x = x.clone().require_grad();
        let grads = loss(net_b.forward_unwrapped(x.clone())).backward();
        flat(x.grad(&grads).unwrap())
    };
    for policy in [CheckpointPolicy::None, CheckpointPolicy::All] {
        let x = Tensor::<Bal, 3>::from_data(x.to_data(), &device).require_grad();
        let y = with_policy(policy, || net.forward(x.clone()));
        let w = Tensor::<Bal, 3>::from_data(weights_like(&y), &device);
        let grads = (y * w).sum().backward();
        let got = x
            .grad(&grads)
            .unwrap()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        assert!(max_rel(&got, &plain) <= 1e-6, "{policy}");
    }
}

/// The weights `common::loss` uses, as data.
fn weights_like(y: &Tensor<Balanced<Flex>, 3>) -> burn::tensor::TensorData {
    let n: usize = y.dims().iter().product();
    let values: Vec<f32> = (0..n).map(|i| (i as f32 / 7.0).sin()).collect();
    burn::tensor::TensorData::new(values, y.dims())
}
