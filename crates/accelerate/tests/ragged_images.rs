//! Images of another size in a plain Burn dataset reach the Trainer's batcher: a named error,
//! not a panic, and nothing of the panic on stderr (a process of its own: it counts what
//! reaches the panic hook).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use afterburner::AccelerateError;
use afterburner::trainer::{IntervalStrategy, Trainer, TrainingArguments};
use afterburner_demos::{ImageItem, digits};
use burn::data::dataset::InMemDataset;
use common::{BATCHER, vit};

static PRINTED: AtomicUsize = AtomicUsize::new(0);

fn ragged() -> InMemDataset<ImageItem> {
    let mut items = digits::load().unwrap().items()[..24].to_vec();
    items[5].pixels.truncate(60); // 60 values, not 1x8x8
    InMemDataset::new(items)
}

#[test]
fn a_ragged_image_is_a_named_error_on_either_loader_thread() {
    std::panic::set_hook(Box::new(|_| {
        PRINTED.fetch_add(1, Ordering::SeqCst);
    }));
    // 0: batches made on the training thread; 2: on the background thread.
    for workers in [0, 2] {
        let args = TrainingArguments {
            output_dir: common::scratch_dir(&format!("ragged-{workers}")),
            per_device_train_batch_size: 8,
            max_steps: 3,
            eval_strategy: IntervalStrategy::No,
            save_strategy: IntervalStrategy::No,
            dataloader_num_workers: workers,
            disable_tqdm: true,
            ..Default::default()
        };
        let out = args.output_dir.clone();
        let mut trainer = Trainer::new(
            vit(3),
            args,
            ragged(),
            InMemDataset::new(Vec::new()),
            BATCHER,
        )
        .unwrap();
        let err = trainer.train().expect_err("a ragged image");
        assert!(matches!(err, AccelerateError::BadData(_)), "{err:?}");
        assert!(err.to_string().contains("60 values, not 1x8x8"), "{err}");
        std::fs::remove_dir_all(out).ok();
    }
    assert_eq!(PRINTED.load(Ordering::SeqCst), 0, "a panic was printed");
}
