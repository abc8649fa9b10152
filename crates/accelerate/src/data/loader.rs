//! A small data loader that builds each batch directly on the training device.

use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::AccelerateError;
use crate::rng::{derive_seed, permutation};

/// Turns a list of items into a batch on a device.
pub trait Batcher<B: Backend, I>: Send + Sync {
    /// The batch type.
    type Output;
    /// Builds one batch from `items` on `device`.
    fn batch(&self, items: Vec<I>, device: &B::Device) -> Self::Output;
}

/// Where a loader stands in its data: the epoch and the next batch to yield.
///
/// The Accelerator reads it to flush accumulation at the end of an epoch and saves it with the
/// training state, so a resumed run continues at the same batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataProgress {
    /// The epoch being read.
    pub epoch: usize,
    /// Index of the next batch in that epoch.
    pub next_batch: usize,
    /// Batches per epoch.
    pub num_batches: usize,
}

impl DataProgress {
    /// True when the last batch of the epoch has been handed out.
    pub fn end_of_epoch(&self) -> bool {
        self.num_batches > 0 && self.next_batch >= self.num_batches
    }

    /// `(epoch, batch)` where reading should continue.
    pub fn resume_position(&self) -> (usize, usize) {
        if self.end_of_epoch() {
            (self.epoch + 1, 0)
        } else {
            (self.epoch, self.next_batch)
        }
    }
}

/// Batches of an in-memory dataset on one device, shuffled per epoch from a seed.
///
/// Epoch `e` always yields the same order for the same seed, so a run can resume at
/// `(epoch, batch)` with [`epoch_from`](Self::epoch_from).
pub struct DataLoader<B: Backend, I, Bt> {
    items: Arc<Vec<I>>,
    batcher: Bt,
    batch_size: usize,
    shuffle_seed: Option<u64>,
    drop_last: bool,
    /// `(rank, world_size)`: this loader yields only the rank's share of each epoch.
    shard: Option<(usize, usize)>,
    device: B::Device,
    progress: Arc<Mutex<DataProgress>>,
}

impl<B: Backend, I: Clone, Bt> DataLoader<B, I, Bt> {
    /// A loader over `items` making batches of `batch_size` on `device`, in order, keeping
    /// the last smaller batch. Errors on a zero batch size or an empty dataset.
    pub fn new(
        items: Vec<I>,
        batcher: Bt,
        batch_size: usize,
        device: B::Device,
    ) -> Result<Self, AccelerateError> {
        Self::with_progress(items, batcher, batch_size, device, Arc::default())
    }

    pub(crate) fn with_progress(
        items: Vec<I>,
        batcher: Bt,
        batch_size: usize,
        device: B::Device,
        progress: Arc<Mutex<DataProgress>>,
    ) -> Result<Self, AccelerateError> {
        if batch_size == 0 {
            return Err(AccelerateError::invalid("batch_size", "0", "at least 1"));
        }
        if items.is_empty() {
            return Err(AccelerateError::invalid(
                "dataset",
                "empty",
                "at least one item",
            ));
        }
        Ok(Self {
            items: Arc::new(items),
            batcher,
            batch_size,
            shuffle_seed: None,
            drop_last: false,
            shard: None,
            device,
            progress,
        })
    }

    /// Shuffles every epoch, with an order fixed by `(seed, epoch)`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self
    }

    /// Yields only `rank`'s share of each epoch's (shuffled) order, like PyTorch's
    /// `DistributedSampler`: every `world_size`-th item, the order padded by repeating its
    /// start so every rank gets as many items. The Accelerator sets this under DDP.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.shard = (world_size > 1).then_some((rank, world_size));
        self
    }

    /// Items this loader yields per epoch (its share under [`shard`](Self::shard)).
    fn items_per_epoch(&self) -> usize {
        match self.shard {
            Some((_, world)) => self.items.len().div_ceil(world),
            None => self.items.len(),
        }
    }

    /// Drops the last batch when it is smaller than `batch_size`.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Always false: an empty loader cannot be built.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        if self.drop_last {
            self.items_per_epoch() / self.batch_size
        } else {
            self.items_per_epoch().div_ceil(self.batch_size)
        }
    }

    /// The batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: usize) -> EpochIter<'_, B, I, Bt> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch`, starting at batch `start` (to resume mid-epoch).
    pub fn epoch_from(&self, epoch: usize, start: usize) -> EpochIter<'_, B, I, Bt> {
        let order = match self.shuffle_seed {
            Some(seed) => permutation(self.items.len(), derive_seed(seed, 0xDA7A, epoch as u64)),
            None => (0..self.items.len()).collect(),
        };
        let order = match self.shard {
            Some((rank, world)) => afterburner_parallel::shard(order, rank, world, false),
            None => order,
        };
        EpochIter {
            loader: self,
            order,
            epoch,
            next: start,
        }
    }
}

/// The batches of one epoch; see [`DataLoader::epoch`].
pub struct EpochIter<'a, B: Backend, I, Bt> {
    loader: &'a DataLoader<B, I, Bt>,
    order: Vec<usize>,
    epoch: usize,
    next: usize,
}

impl<B, I, Bt> Iterator for EpochIter<'_, B, I, Bt>
where
    B: Backend,
    I: Clone,
    Bt: Batcher<B, I>,
{
    type Item = Bt::Output;

    fn next(&mut self) -> Option<Bt::Output> {
        let loader = self.loader;
        let num_batches = loader.num_batches();
        if self.next >= num_batches {
            return None;
        }
        let start = self.next * loader.batch_size;
        let end = (start + loader.batch_size).min(self.order.len());
        let items = self.order[start..end]
            .iter()
            .map(|&i| loader.items[i].clone())
            .collect();
        self.next += 1;
        *loader
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = DataProgress {
            epoch: self.epoch,
            next_batch: self.next,
            num_batches,
        };
        Some(loader.batcher.batch(items, &loader.device))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.loader.num_batches().saturating_sub(self.next);
        (left, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    struct Ids;
    impl<B: Backend> Batcher<B, usize> for Ids {
        type Output = Vec<usize>;
        fn batch(&self, items: Vec<usize>, _device: &B::Device) -> Vec<usize> {
            items
        }
    }

    fn loader(n: usize, bs: usize) -> DataLoader<Flex, usize, Ids> {
        DataLoader::new((0..n).collect(), Ids, bs, Default::default()).unwrap()
    }

    #[test]
    fn covers_every_item_once_per_epoch() {
        let l = loader(10, 3).shuffle(5);
        let batches: Vec<_> = l.epoch(0).collect();
        assert_eq!(batches.len(), 4);
        let mut all: Vec<usize> = batches.concat();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_ne!(l.epoch(0).next(), l.epoch(1).next(), "epochs reshuffle");
    }

    #[test]
    fn drop_last_and_resume() {
        let l = loader(10, 3).shuffle(1).drop_last(true);
        assert_eq!(l.epoch(2).count(), 3);
        let full: Vec<_> = l.epoch(2).collect();
        let resumed: Vec<_> = l.epoch_from(2, 1).collect();
        assert_eq!(&full[1..], &resumed[..]);
    }

    #[test]
    fn progress_marks_the_end_of_epoch() {
        let l = loader(4, 2);
        let mut it = l.epoch(3);
        it.next();
        let p = *l.progress.lock().unwrap();
        assert!(!p.end_of_epoch());
        assert_eq!(p.resume_position(), (3, 1));
        it.next();
        let p = *l.progress.lock().unwrap();
        assert!(p.end_of_epoch());
        assert_eq!(p.resume_position(), (4, 0));
    }

    #[test]
    fn zero_batch_size_is_an_error() {
        let err = DataLoader::<Flex, usize, Ids>::new(vec![1], Ids, 0, Default::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("batch_size"));
    }
}
