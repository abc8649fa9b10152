//! `autocast = "op" | "view" | "auto"` through the Accelerator on `Autodiff<Autocast<Flex>>`:
//! op-level autocast is closer to f32 than the half view on Burn's `TransformerEncoder`, "auto"
//! picks it on this backend, and "op" on a backend without `Autocast` is a named error.

mod common;

use afterburner::{Accelerator, AcceleratorConfig, Autocast, AutocastMode};
use burn::backend::{Autodiff, Flex};
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use common::rel_l2;

type B = Autodiff<Autocast<Flex>>;

fn accelerator<Bk: burn::tensor::backend::AutodiffBackend>(
    precision: &str,
    autocast: &str,
) -> Result<Accelerator<Bk>, afterburner::AccelerateError> {
    let config = AcceleratorConfig {
        precision: precision.parse().unwrap(),
        autocast: autocast.parse()?,
        ..Default::default()
    };
    Accelerator::new(config, Default::default())
}

#[test]
fn op_level_is_closer_to_f32_than_the_view_and_auto_picks_it() {
    let _rng = common::rng_lock();
    let device = Default::default();
    B::seed(&device, 5);
    let encoder = TransformerEncoderConfig::new(64, 128, 4, 2)
        .with_dropout(0.0)
        .init::<B>(&device);
    let x = Tensor::<B, 3>::random([8, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let reference: Vec<f32> = encoder
        .forward(TransformerEncoderInput::new(x.clone()))
        .into_data()
        .to_vec()
        .unwrap();
    for precision in ["bf16-mixed", "16-mixed"] {
        let mut errors = Vec::new();
        for mode in ["view", "op", "auto"] {
            let acc = accelerator::<B>(precision, mode).unwrap();
            let out = acc
                .forward(&encoder, x.clone(), |m, x| {
                    m.forward(TransformerEncoderInput::new(x))
                })
                .unwrap();
            errors.push(rel_l2(
                &out.into_data().to_vec::<f32>().unwrap(),
                &reference,
            ));
        }
        println!(
            "{precision}: output error vs f32, view {:.2e}, op {:.2e}",
            errors[0], errors[1]
        );
        assert!(
            errors[1] > 0.0 && errors[1] * 2.0 < errors[0],
            "{precision}: {errors:?}"
        );
        assert_eq!(
            errors[2], errors[1],
            "{precision}: auto is op on Autocast<Flex>"
        );
    }
}

#[test]
fn op_needs_the_autocast_backend_and_bad_modes_are_named() {
    let _rng = common::rng_lock();
    let err = accelerator::<Autodiff<Flex>>("bf16-mixed", "op")
        .err()
        .expect("op on plain flex is refused")
        .to_string();
    assert!(
        err.contains("autocast") && err.contains("Autocast<B>"),
        "{err}"
    );
    assert!(accelerator::<Autodiff<Flex>>("bf16-mixed", "auto").is_ok());
    let err = "per-op".parse::<AutocastMode>().unwrap_err().to_string();
    assert!(
        err.contains("per-op") && err.contains("auto, op, view"),
        "{err}"
    );
}
