//! [`DataLoaderShard`]: a Burn dataset and batcher, read by one sampler, batched on the device.

use std::sync::{Arc, Mutex};

use afterburner_parallel::DistributedSampler;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;

use super::DataProgress;
use super::epoch::{BatchMaker, EpochIter, FaultSlot};
use crate::AccelerateError;

/// Batches prepared ahead by default (see [`DataLoaderShard::prefetch`]).
pub const DEFAULT_PREFETCH: usize = 2;

/// Batches of any Burn [`Dataset`] made by any Burn [`Batcher`] on one device, the order
/// (shuffle, shard, padding, `drop_last`) decided by a [`DistributedSampler`].
///
/// Epoch `e` always yields the same batches for the same seed, so a run can resume at
/// `(epoch, batch)` with [`epoch_from`](Self::epoch_from). By default the next
/// [`DEFAULT_PREFETCH`] batches are made on a background thread while the caller trains on
/// the current one; the batches are the same as without it.
///
/// ```
/// use afterburner_accelerator::data::DataLoaderShard;
/// use burn::backend::Flex;
/// use burn::data::dataloader::batcher::Batcher;
/// use burn::data::dataset::InMemDataset;
///
/// #[derive(Clone)]
/// struct Sum;
/// impl<B: burn::tensor::backend::Backend> Batcher<B, u32, u32> for Sum {
///     fn batch(&self, items: Vec<u32>, _device: &B::Device) -> u32 {
///         items.iter().sum()
///     }
/// }
///
/// let dataset = InMemDataset::new(vec![1, 2, 3, 4, 5]);
/// let loader = DataLoaderShard::<Flex, _, _>::new(dataset, Sum, 2, Default::default())?;
/// assert_eq!(loader.epoch(0).collect::<Vec<_>>(), [3, 7, 5]);
/// # Ok::<(), afterburner_accelerator::AccelerateError>(())
/// ```
pub struct DataLoaderShard<B: Backend, I, O> {
    maker: BatchMaker<B, I, O>,
    sampler: DistributedSampler,
    prefetch: usize,
    progress: Arc<Mutex<DataProgress>>,
    fault: Option<FaultSlot>,
}

impl<B: Backend, I: 'static, O: Send + 'static> DataLoaderShard<B, I, O> {
    /// A loader over `dataset` making batches of `batch_size` with `batcher` on `device`, in
    /// order, keeping the last smaller batch. Errors on a zero batch size or an empty dataset.
    pub fn new<D, Bt>(
        dataset: D,
        batcher: Bt,
        batch_size: usize,
        device: B::Device,
    ) -> Result<Self, AccelerateError>
    where
        D: Dataset<I> + 'static,
        Bt: Batcher<B, I, O> + 'static,
    {
        Self::with_progress(dataset, batcher, batch_size, device, Arc::default(), None)
    }

    /// [`new`](Self::new), reporting into `progress` and `fault` (the Accelerator's).
    pub(crate) fn with_progress<D, Bt>(
        dataset: D,
        batcher: Bt,
        batch_size: usize,
        device: B::Device,
        progress: Arc<Mutex<DataProgress>>,
        fault: Option<FaultSlot>,
    ) -> Result<Self, AccelerateError>
    where
        D: Dataset<I> + 'static,
        Bt: Batcher<B, I, O> + 'static,
    {
        if dataset.is_empty() {
            return Err(AccelerateError::invalid(
                "dataset",
                "empty",
                "at least one item",
            ));
        }
        let sampler = DistributedSampler::new(dataset.len(), 1, 0)?.batch_size(batch_size)?;
        Ok(Self {
            maker: BatchMaker {
                dataset: Arc::new(dataset),
                batcher: Arc::new(batcher),
                device,
            },
            sampler,
            prefetch: DEFAULT_PREFETCH,
            progress,
            fault,
        })
    }

    /// Shuffles every epoch, with an order fixed by `(seed, epoch)`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.sampler = self.sampler.shuffle(seed);
        self
    }

    /// Yields only `rank`'s share of each epoch's (shuffled) order, like PyTorch's
    /// `DistributedSampler`: every `world_size`-th item, the order padded by repeating its
    /// start so every rank gets as many items. The Accelerator sets this under DDP. Errors
    /// unless `rank < world_size`.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Result<Self, AccelerateError> {
        self.sampler = self.sampler.shard(rank, world_size)?;
        Ok(self)
    }

    /// Drops the last batch when it is smaller than the batch size (under [`shard`]: the
    /// items that do not fill a batch on every rank, with no padding).
    ///
    /// [`shard`]: Self::shard
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.sampler = self.sampler.drop_last(drop_last);
        self
    }

    /// Makes up to `depth` batches ahead on a background thread (like Burn's `num_workers`,
    /// with one thread, in order), so batching overlaps the training step; 0 makes each batch
    /// on the calling thread when asked. Default [`DEFAULT_PREFETCH`]. A batcher or dataset
    /// that draws from the backend's RNG (`Tensor::random`) races the training step for it on
    /// a background thread; use 0 for bitwise-repeatable runs with such a batcher.
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.prefetch = depth;
        self
    }

    /// Number of items in the dataset.
    pub fn len(&self) -> usize {
        self.maker.dataset.len()
    }

    /// Always false: an empty loader cannot be built.
    pub fn is_empty(&self) -> bool {
        self.maker.dataset.is_empty()
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        self.sampler.num_batches()
    }

    /// The batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: usize) -> EpochIter<B, I, O> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch`, starting at batch `start` (to resume mid-epoch).
    pub fn epoch_from(&self, epoch: usize, start: usize) -> EpochIter<B, I, O> {
        EpochIter::new(
            self.maker.clone(),
            self.sampler.batches(epoch as u64),
            (epoch, start),
            self.prefetch,
            self.progress.clone(),
            self.fault.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::data::dataset::InMemDataset;

    struct Ids;
    impl<B: Backend> Batcher<B, usize, Vec<usize>> for Ids {
        fn batch(&self, items: Vec<usize>, _device: &B::Device) -> Vec<usize> {
            items
        }
    }

    fn loader(n: usize, bs: usize) -> DataLoaderShard<Flex, usize, Vec<usize>> {
        let items = InMemDataset::new((0..n).collect());
        DataLoaderShard::new(items, Ids, bs, Default::default()).unwrap()
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
        assert_eq!(l.epoch_from(2, 7).count(), 0);
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
    fn progress_counts_received_batches_not_prefetched_ones() {
        let l = loader(100, 2).prefetch(8);
        let mut it = l.epoch(1);
        it.next();
        it.next();
        // Give the thread time to run ahead: the progress must not follow it.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(l.progress.lock().unwrap().resume_position(), (1, 2));
        assert_eq!(it.size_hint(), (48, Some(48)));
    }

    #[test]
    fn bad_settings_are_errors() {
        let err = DataLoaderShard::<Flex, usize, Vec<usize>>::new(
            InMemDataset::new(vec![1]),
            Ids,
            0,
            Default::default(),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("batch_size"), "{err}");
        let empty = InMemDataset::new(Vec::<usize>::new());
        let err = DataLoaderShard::<Flex, _, _>::new(empty, Ids, 1, Default::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("dataset"), "{err}");
        let err = loader(4, 2).shard(2, 2).err().unwrap();
        assert!(err.to_string().contains("rank"), "{err}");
    }
}
