//! The backend suite (xtask/src/suite) as tests: on flex, `Autocast<Flex>` and
//! `Autocast<Autodiff<Flex>>` always, on wgpu and its two `Autocast` stacks when built with
//! `--features wgpu` (Mesa's software Vulkan driver,
//! lavapipe, in CI: see docs/gpu.md), and on LibTorch with `--features tch`.
//!
//! Each backend's checks run one at a time (flex keeps one process-wide RNG that the
//! Accelerator seeds; the GPU backends share one device).

use std::sync::{Mutex, MutexGuard};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

macro_rules! backend_tests {
    ($module:ident, $autodiff:ty, [$($check:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            type B = $autodiff;
            $(
                #[test]
                fn $check() {
                    let _serial = super::serial();
                    xtask::suite::assert_check::<B>(stringify!($check), &Default::default());
                }
            )*
        }
    };
}

macro_rules! suite {
    ($module:ident, $autodiff:ty) => {
        backend_tests!(
            $module,
            $autodiff,
            [
                bf16_mixed_gradients_match_f32,
                f16_mixed_gradients_match_f32,
                accumulation_equals_big_batch,
                resume_is_bitwise,
                checkpointed_gradients_equal_plain,
                ddp_two_workers_equal_one_device,
                fsdp_equals_ddp,
                tensor_parallel_equals_one_device,
            ]
        );
    };
}

use afterburner::Autocast;
use burn::backend::Autodiff;

#[cfg(feature = "flex")]
suite!(flex, Autodiff<burn::backend::Flex>);
#[cfg(feature = "wgpu")]
suite!(wgpu, Autodiff<burn::backend::Wgpu>);
// Every capability through the decorator the examples use (`Autodiff<Autocast<Flex>>`).
#[cfg(feature = "flex")]
suite!(autocast_flex, Autodiff<Autocast<burn::backend::Flex>>);
// Op-level autocast (the default there) on a GPU backend.
#[cfg(feature = "wgpu")]
suite!(autocast_wgpu, Autodiff<Autocast<burn::backend::Wgpu>>);
// Op-level autocast above Autodiff (the casts recorded, LayerNorm as one autodiff node).
#[cfg(feature = "flex")]
suite!(recorded_flex, Autocast<Autodiff<burn::backend::Flex>>);
#[cfg(feature = "wgpu")]
suite!(recorded_wgpu, Autocast<Autodiff<burn::backend::Wgpu>>);
// LibTorch: `--features tch` with libtorch 2.9.0 installed (docs/performance.md).
#[cfg(feature = "tch")]
suite!(tch, Autodiff<burn::backend::LibTorch>);
#[cfg(feature = "tch")]
suite!(autocast_tch, Autodiff<Autocast<burn::backend::LibTorch>>);

/// Every check of the suite has a test here, in the suite's order.
#[test]
fn every_check_has_a_test() {
    let source = include_str!("backend_suite.rs");
    let list = source
        .split("backend_tests!(")
        .nth(1)
        .and_then(|rest| rest.split('[').nth(1))
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("");
    let listed: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(listed, xtask::suite::CHECK_NAMES);
    #[cfg(feature = "flex")]
    {
        let checks = xtask::suite::checks::<burn::backend::Autodiff<burn::backend::Flex>>();
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        assert_eq!(names, xtask::suite::CHECK_NAMES);
    }
}

/// Device memory comes from the CubeCL backends' pools (the bench's device memory column); a
/// CPU backend has none.
#[test]
fn device_memory_is_read_from_wgpu_pools() {
    #[cfg(feature = "flex")]
    assert!(xtask::memory::device_memory::<burn::backend::Flex>(&Default::default()).is_none());
    #[cfg(feature = "wgpu")]
    {
        let _serial = serial();
        type W = burn::backend::Wgpu;
        let device = Default::default();
        let before = xtask::memory::device_memory::<W>(&device).expect("wgpu memory");
        let held = burn::tensor::Tensor::<W, 1>::ones([1 << 20], &device);
        let after = xtask::memory::device_memory::<W>(&device).expect("wgpu memory");
        println!(
            "wgpu memory: {} then {}",
            before.describe(),
            after.describe()
        );
        assert!(
            after.in_use_bytes >= before.in_use_bytes + (4 << 20),
            "{after:?}"
        );
        assert!(after.reserved_bytes >= after.in_use_bytes, "{after:?}");
        drop(held);
    }
}
