//! Derived parameters: a recomputed block builds a parameter from its sources, in the forward
//! pass and again in the recompute, and the gradient reaches the sources.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use afterburner_checkpoint::{
    CheckpointPolicy, Checkpointed, DerivedParams, with_derived_params, with_policy,
};
use burn::backend::{Autodiff, Flex};
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Distribution, Tensor, TensorPrimitive};

type B = Autodiff<Flex>;

fn values<Bk: burn::tensor::backend::Backend>(t: Tensor<Bk, 2>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

#[test]
fn a_derived_weight_is_built_twice_and_its_source_gets_the_gradient() {
    afterburner_checkpoint::enable::<B>();
    let device = Default::default();
    let linear: Linear<B> = LinearConfig::new(3, 2).with_bias(false).init(&device);
    let _ = linear.weight.val(); // initialise now: clones of a lazy parameter would differ
    let source = Tensor::<B, 2>::random([3, 2], Distribution::Default, &device).require_grad();
    let x = Tensor::<B, 2>::random([4, 3], Distribution::Default, &device);

    // Reference: the weight is 2 * source, an ordinary tracked expression.
    let mut plain = linear.clone();
    plain.weight = Param::initialized(plain.weight.id, source.clone().mul_scalar(2.0));
    let grads = plain.forward(x.clone()).sum().backward();
    let want = values(source.grad(&grads).unwrap());

    // Checkpointed: the block's own weight is garbage; the derived group builds it.
    let mut garbage = linear.clone();
    let id = garbage.weight.id;
    garbage.weight = Param::initialized(id, Tensor::full([3, 2], f32::NAN, &device));
    let block = Checkpointed::new(garbage);
    let builds = Arc::new(AtomicUsize::new(0));
    let counter = builds.clone();
    let group = DerivedParams::<B> {
        ids: vec![id],
        sources: vec![source.clone().into_primitive().tensor()],
        build: Arc::new(move |sources| {
            counter.fetch_add(1, Ordering::Relaxed);
            sources
                .into_iter()
                .map(|s| {
                    let s = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(s));
                    s.mul_scalar(2.0).into_primitive().tensor()
                })
                .collect()
        }),
    };
    let y = with_derived_params(vec![group], || {
        with_policy(CheckpointPolicy::All, || {
            block.forward(x.clone(), |l: &Linear<B>, x| l.forward(x))
        })
    });
    let grads = y.sum().backward();
    let got = values(source.grad(&grads).unwrap());
    assert_eq!(got, want, "the source's gradient, bitwise");
    assert_eq!(
        builds.load(Ordering::Relaxed),
        2,
        "built for the forward and the recompute"
    );
    assert!(
        got.iter().all(|v| v.is_finite()),
        "the garbage weight was never used"
    );

    // Outside a recomputed block the group is not used: the block's own weight is.
    let builds_before = builds.load(Ordering::Relaxed);
    let block = Checkpointed::new(linear.clone());
    let group = DerivedParams::<B> {
        ids: vec![linear.weight.id],
        sources: vec![source.into_primitive().tensor()],
        build: Arc::new(|_| unreachable!("not recomputed: not built")),
    };
    let y = with_derived_params(vec![group], || {
        with_policy(CheckpointPolicy::None, || {
            block.forward(x.clone(), |l: &Linear<B>, x| l.forward(x))
        })
    });
    assert_eq!(values(y), values(linear.forward(x)));
    assert_eq!(builds.load(Ordering::Relaxed), builds_before);
}

#[test]
fn a_group_reaching_outside_the_block_is_not_derived() {
    afterburner_checkpoint::enable::<B>();
    let device = Default::default();
    let linear: Linear<B> = LinearConfig::new(3, 2).with_bias(false).init(&device);
    let _ = linear.weight.val();
    let x = Tensor::<B, 2>::random([4, 3], Distribution::Default, &device);
    let block = Checkpointed::new(linear.clone());
    // The group also holds a parameter of another block: building it for this block alone
    // would gather more than the block needs, so the block uses its own weight.
    let other = burn::module::ParamId::new();
    let group = DerivedParams::<B> {
        ids: vec![linear.weight.id, other],
        sources: vec![],
        build: Arc::new(|_| unreachable!("not built for a block holding part of the group")),
    };
    let y = with_derived_params(vec![group], || {
        with_policy(CheckpointPolicy::All, || {
            block.forward(x.clone(), |l: &Linear<B>, x| l.forward(x))
        })
    });
    assert_eq!(values(y), values(linear.forward(x)));
}
