//! The data loader over Burn's own traits: a burn-train style dataset and batcher used
//! unchanged, prefetching that changes no batch, resume at a batch, sharding across ranks,
//! and an early drop that stops the background thread.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use afterburner_accelerator::data::DataLoaderShard;
use afterburner_accelerator::parallel::DistributedSampler;
use afterburner_accelerator::{Accelerator, AcceleratorConfig, StrategyConfig};
use afterburner_demos::{ImageBatch, digits};
use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, InMemDataset};
use burn::optim::AdamConfig;
use burn::prelude::*;
use common::*;

// ---- A dataset item, batch and batcher exactly as burn-train's MNIST example writes them ----

#[derive(Debug, Clone)]
pub struct DigitItem {
    pub image: [[f32; 8]; 8],
    pub label: u8,
}

#[derive(Clone, Default)]
pub struct DigitBatcher {}

#[derive(Clone, Debug)]
pub struct DigitBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub targets: Tensor<B, 1, Int>,
}

impl<B: Backend> Batcher<B, DigitItem, DigitBatch<B>> for DigitBatcher {
    fn batch(&self, items: Vec<DigitItem>, device: &B::Device) -> DigitBatch<B> {
        let images = items
            .iter()
            .map(|item| TensorData::from(item.image).convert::<B::FloatElem>())
            .map(|data| Tensor::<B, 2>::from_data(data, device))
            .map(|tensor| tensor.reshape([1, 1, 8, 8]))
            .map(|tensor| (tensor - 0.5) / 0.5)
            .collect();
        let targets = items
            .iter()
            .map(|item| Tensor::<B, 1, Int>::from_data([item.label as i64], device))
            .collect();
        DigitBatch {
            images: Tensor::cat(images, 0),
            targets: Tensor::cat(targets, 0),
        }
    }
}

/// The first `n` digits as `DigitItem`s.
fn digit_items(n: usize) -> Vec<DigitItem> {
    let data = digits::load().unwrap();
    data.items()[..n]
        .iter()
        .map(|item| {
            let mut image = [[0.0; 8]; 8];
            for (i, p) in item.pixels.iter().enumerate() {
                image[i / 8][i % 8] = *p;
            }
            DigitItem {
                image,
                label: item.label as u8,
            }
        })
        .collect()
}

#[test]
fn a_burn_dataset_and_batcher_plug_into_the_accelerator_unchanged() {
    let _rng = rng_lock();
    let config = AcceleratorConfig {
        seed: 7,
        ..Default::default()
    };
    let mut acc = Accelerator::<B>::new(config, Default::default()).unwrap();
    let (mut model, mut optim) = acc.setup(vit(3), AdamConfig::new().init()).unwrap();
    let items = digit_items(40);
    let dataset = InMemDataset::new(items.clone());
    let loader = acc.dataloader(dataset, DigitBatcher::default(), 8).unwrap();
    assert_eq!((loader.len(), loader.num_batches()), (40, 5));

    // The batches hold the dataset's items in the sampler's order for the config's seed.
    let order = DistributedSampler::new(40, 1, 0)
        .unwrap()
        .shuffle(7)
        .batch_size(8)
        .unwrap()
        .batches(1);
    let mut labels = Vec::new();
    for (batch, indices) in loader.epoch(1).zip(&order) {
        let got: Vec<i64> = batch
            .targets
            .clone()
            .into_data()
            .convert::<i64>()
            .to_vec()
            .unwrap();
        let want: Vec<i64> = indices.iter().map(|&i| items[i].label as i64).collect();
        assert_eq!(got, want);
        let first = &items[indices[0]].image;
        let pixel = batch.images.clone().slice([0..1, 0..1, 2..3, 5..6]);
        let pixel = pixel.into_data().to_vec::<f32>().unwrap()[0];
        assert!((pixel - (first[2][5] - 0.5) / 0.5).abs() < 1e-6);
        labels.extend(got);

        let logits = acc
            .forward(&model, batch.images, |m, x| m.forward(x))
            .unwrap();
        let loss = burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&Default::default())
            .forward(logits, batch.targets);
        acc.backward(loss, &model).unwrap();
        model = acc.step(model, &mut optim, &mut 1e-3).unwrap();
    }
    labels.sort_unstable();
    let mut all: Vec<i64> = items.iter().map(|i| i.label as i64).collect();
    all.sort_unstable();
    assert_eq!(labels, all, "every item once per epoch");
    assert_eq!(acc.counters().optimizer_steps, 5);
    assert_eq!(acc.data_position(), (2, 0));
}

/// Every batch of `epochs` epochs, as (images, labels) values.
fn contents(
    loader: &DataLoaderShard<Flex, afterburner_demos::ImageItem, ImageBatch<Flex>>,
    epochs: usize,
) -> Vec<(Vec<f32>, Vec<i64>)> {
    (0..epochs)
        .flat_map(|e| loader.epoch(e))
        .map(|b| {
            (
                b.images.into_data().to_vec().unwrap(),
                b.labels.into_data().convert::<i64>().to_vec().unwrap(),
            )
        })
        .collect()
}

#[test]
fn prefetched_and_inline_loaders_give_identical_batches() {
    let data = digits::load().unwrap().take(100);
    for (rank, world, drop_last) in [(0, 1, false), (0, 1, true), (2, 3, false), (1, 3, true)] {
        let loader = |prefetch: usize| {
            DataLoaderShard::<Flex, _, _>::new(data.clone(), data.batcher(), 16, Default::default())
                .unwrap()
                .shuffle(11)
                .shard(rank, world)
                .unwrap()
                .drop_last(drop_last)
                .prefetch(prefetch)
        };
        let inline = contents(&loader(0), 3);
        assert!(!inline.is_empty());
        for depth in [1, 2, 5] {
            assert_eq!(
                contents(&loader(depth), 3),
                inline,
                "rank {rank}/{world}, drop_last {drop_last}, prefetch {depth}"
            );
        }
    }
}

#[test]
fn resume_at_a_batch_with_prefetch() {
    let _rng = rng_lock();
    let acc = Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
    let data = digits::load().unwrap().take(160);
    let loader = acc.dataloader(data.clone(), data.batcher(), 16).unwrap();
    let labels = |b: ImageBatch<B>| {
        b.labels
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .unwrap()
    };
    let full: Vec<Vec<i64>> = loader.epoch(2).map(labels).collect();

    // Prefetch far ahead, take 3 batches and stop: the position is the 4th batch, not the
    // ones the thread had made ahead.
    let loader = loader.prefetch(8);
    let mut it = loader.epoch(2);
    let first: Vec<Vec<i64>> = it.by_ref().take(3).map(labels).collect();
    std::thread::sleep(std::time::Duration::from_millis(50)); // let the thread run ahead
    assert_eq!(acc.data_position(), (2, 3));
    drop(it);
    assert_eq!(acc.data_position(), (2, 3));

    let (epoch, start) = acc.data_position();
    let rest: Vec<Vec<i64>> = loader.epoch_from(epoch, start).map(labels).collect();
    assert_eq!([first, rest].concat(), full);
    assert_eq!(acc.data_position(), (3, 0), "the epoch's end is seen");
}

#[test]
fn sharding_covers_every_item_once_plus_padding_across_ranks() {
    let _rng = rng_lock();
    let config = AcceleratorConfig {
        seed: 5,
        parallelism: afterburner_accelerator::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            ..Default::default()
        },
        ..Default::default()
    };
    // 10 items over 3 ranks in batches of 2: 4 per rank, the 2 padding items repeat the
    // start of the epoch's shuffled order.
    let shards = Accelerator::<B>::launch(config, vec![Default::default(); 3], |acc| {
        let ids = InMemDataset::new((0..10).collect::<Vec<usize>>());
        let loader = acc.dataloader(ids, Ids, 2)?;
        Ok(loader.epoch(4).collect::<Vec<_>>().concat())
    })
    .unwrap();
    assert!(shards.iter().all(|s| s.len() == 4), "{shards:?}");
    let order = DistributedSampler::new(10, 1, 0)
        .unwrap()
        .shuffle(5)
        .indices(4);
    let mut round_robin: Vec<usize> = (0..4)
        .flat_map(|k| shards.iter().map(move |s| s[k]))
        .collect();
    assert_eq!(
        round_robin[10..],
        order[..2],
        "padding repeats the first items"
    );
    round_robin.truncate(10);
    assert_eq!(round_robin, order, "rank r holds items r, r + 3, ...");
    round_robin.sort_unstable();
    assert_eq!(round_robin, (0..10).collect::<Vec<_>>());
}

/// Batches item ids as they are.
struct Ids;

impl<B: Backend> Batcher<B, usize, Vec<usize>> for Ids {
    fn batch(&self, items: Vec<usize>, _device: &B::Device) -> Vec<usize> {
        items
    }
}

/// A batcher that counts the batches it makes, and takes a moment for each.
struct Counting(Arc<AtomicUsize>);

impl<B: Backend> Batcher<B, usize, usize> for Counting {
    fn batch(&self, items: Vec<usize>, _device: &B::Device) -> usize {
        std::thread::sleep(std::time::Duration::from_millis(2));
        self.0.fetch_add(1, Ordering::SeqCst);
        items[0]
    }
}

#[test]
fn dropping_an_iterator_mid_epoch_stops_its_thread() {
    let made = Arc::new(AtomicUsize::new(0));
    let ids = InMemDataset::new((0..100_000).collect::<Vec<usize>>());
    assert_eq!(ids.len(), 100_000);
    let loader =
        DataLoaderShard::<Flex, _, _>::new(ids, Counting(made.clone()), 1, Default::default())
            .unwrap()
            .prefetch(4);
    let (done, finished) = mpsc::channel();
    let watched = std::thread::spawn(move || {
        let mut it = loader.epoch(0);
        let got: Vec<usize> = it.by_ref().take(2).collect();
        drop(it);
        drop(loader);
        let _ = done.send(got);
    });
    // Not a speed limit: a generous bound that turns a hang into a failure.
    let got = finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("dropping the iterator hung");
    watched.join().unwrap();
    assert_eq!(got, [0, 1]);
    // 2 received + 4 waiting + 1 in progress at most, of 100,000; and every clone of the
    // batcher (the thread's too) is gone, so the thread has ended.
    let n = made.load(Ordering::SeqCst);
    assert!((2..=7).contains(&n), "{n} batches made");
    assert_eq!(Arc::strong_count(&made), 1, "the prefetch thread let go");
}

/// Issue 41: a ragged item reaching the batcher in a user's own loop ends the epoch there and
/// the Accelerator's next call returns a named error (on either loader thread); `try_next`
/// gives the error directly. No panic reaches the user.
#[test]
fn a_ragged_item_in_a_users_loop_is_a_named_error() {
    let _rng = rng_lock();
    let mut items = digits::load().unwrap().items()[..24].to_vec();
    items[5].pixels.truncate(60); // 60 values, not 1x8x8
    for depth in [0, 2] {
        let mut acc =
            Accelerator::<B>::new(AcceleratorConfig::default(), Default::default()).unwrap();
        let (mut model, mut optim) = acc.setup(vit(1), AdamConfig::new().init()).unwrap();
        let loader = acc
            .dataloader(InMemDataset::new(items.clone()), BATCHER, 8)
            .unwrap()
            .prefetch(depth);
        let mut trained = 0;
        for batch in loader.epoch(0) {
            let logits = acc
                .forward(&model, batch.images.clone(), |m, x| m.forward(x))
                .unwrap();
            acc.backward(cross_entropy(logits, &batch), &model).unwrap();
            model = acc.step(model, &mut optim, &mut 1e-3).unwrap();
            trained += 1;
        }
        assert!(trained < 3, "the epoch stopped at the ragged batch");
        let err = acc.finish(model.clone()).unwrap_err();
        assert!(
            matches!(err, afterburner_accelerator::AccelerateError::BadData(_)),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("60 values, not 1x8x8"), "{message}");
        assert!(message.contains("epoch 0, batch"), "{message}");
        assert_eq!(message.matches("bad data").count(), 1, "{message}");
        // Reported once: the Accelerator goes on (a save, another epoch) after it.
        acc.finish(model.clone()).unwrap();

        let mut batches = loader.epoch(0);
        let err = loop {
            match batches.try_next() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("depth {depth}: the ragged batch was not reported"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("60 values"), "{err}");
        assert!(
            matches!(batches.try_next(), Ok(None)),
            "the epoch ends there"
        );
    }
}
