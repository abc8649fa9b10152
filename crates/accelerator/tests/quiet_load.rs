//! Loading a model of another architecture is a named error and prints nothing of Burn's
//! panic on stderr (a process of its own: it counts what reaches the panic hook).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use afterburner_accelerator::{Accelerator, AcceleratorConfig};
use burn::optim::SgdConfig;
use common::{B, tiny_vit};

static PRINTED: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_model_of_another_architecture_is_a_quiet_named_error() {
    // The hook a user (or the test harness) had: it must still see every other panic.
    std::panic::set_hook(Box::new(|_| {
        PRINTED.fetch_add(1, Ordering::SeqCst);
    }));
    let dir = common::scratch_dir("quiet-load");
    let mut acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let two_blocks = tiny_vit().with_n_layers(2).init::<B>(&Default::default());
    acc.save_state(&dir, &two_blocks, &SgdConfig::new().init::<B, _>(), &0.1)
        .unwrap();
    let three_blocks = tiny_vit().with_n_layers(3).init::<B>(&Default::default());
    let err = acc
        .load_state(&dir, three_blocks, SgdConfig::new().init(), 0.1)
        .err()
        .expect("another architecture");
    assert!(err.to_string().contains("another structure"), "{err}");
    assert_eq!(
        PRINTED.load(Ordering::SeqCst),
        0,
        "Burn's panic text was printed"
    );
    // A panic anywhere else still reaches the hook.
    let _ = std::panic::catch_unwind(|| panic!("elsewhere"));
    assert_eq!(PRINTED.load(Ordering::SeqCst), 1);
    std::fs::remove_dir_all(dir).ok();
}
