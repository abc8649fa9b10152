//! [`EpochIter`]: the batches of one epoch, made on the calling thread or prefetched.

use std::sync::{Arc, Mutex, PoisonError};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;

use super::DataProgress;
use super::prefetch::Prefetcher;
use crate::AccelerateError;
use crate::quiet::{panic_message, quietly};

/// Where a loader the Accelerator made leaves the error of a batch that could not be made,
/// for the Accelerator's next call to return ([`EpochIter`]'s `next` cannot).
pub(crate) type FaultSlot = Arc<Mutex<Option<String>>>;

/// Turns a batch of item indices into a batch: the dataset's items, batched on the device.
pub(crate) struct BatchMaker<B: Backend, I, O> {
    pub(crate) dataset: Arc<dyn Dataset<I>>,
    pub(crate) batcher: Arc<dyn Batcher<B, I, O>>,
    pub(crate) device: B::Device,
}

impl<B: Backend, I, O> Clone for BatchMaker<B, I, O> {
    fn clone(&self) -> Self {
        Self {
            dataset: self.dataset.clone(),
            batcher: self.batcher.clone(),
            device: self.device.clone(),
        }
    }
}

impl<B: Backend, I, O> BatchMaker<B, I, O> {
    fn make(&self, indices: &[usize]) -> O {
        let items: Vec<I> = indices
            .iter()
            .filter_map(|&i| self.dataset.get(i))
            .collect();
        if items.len() < indices.len() {
            // Burn's own loader skips such items too; a dataset should not shrink.
            tracing::warn!(
                missing = indices.len() - items.len(),
                dataset_len = self.dataset.len(),
                "the dataset returned no item for some indices below its length; skipped"
            );
        }
        self.batcher.batch(items, &self.device)
    }
}

/// Where the batches come from.
enum Source<B: Backend, I, O> {
    /// Made on the calling thread when asked.
    Inline {
        maker: BatchMaker<B, I, O>,
        batches: std::vec::IntoIter<Vec<usize>>,
    },
    /// Made ahead, in the same order, on a background thread.
    Prefetched(Prefetcher<O>),
}

impl<B: Backend, I: 'static, O: Send + 'static> Source<B, I, O> {
    fn inline(maker: BatchMaker<B, I, O>, batches: Vec<Vec<usize>>) -> Self {
        Self::Inline {
            maker,
            batches: batches.into_iter(),
        }
    }

    /// A background thread making `batches` up to `depth` ahead; inline if none can start.
    fn prefetched(maker: BatchMaker<B, I, O>, batches: Vec<Vec<usize>>, depth: usize) -> Self {
        let thread_maker = maker.clone();
        let jobs = batches.clone().into_iter();
        match Prefetcher::start(jobs, depth, move |b: Vec<usize>| thread_maker.make(&b)) {
            Ok(prefetcher) => Self::Prefetched(prefetcher),
            Err(e) => {
                tracing::warn!("no prefetch thread ({e}); batching on the calling thread");
                Self::inline(maker, batches)
            }
        }
    }

    fn next(&mut self) -> Option<O> {
        match self {
            Self::Inline { maker, batches } => batches.next().map(|b| maker.make(&b)),
            Self::Prefetched(prefetcher) => prefetcher.next(),
        }
    }
}

/// The batches of one epoch; see [`DataLoaderShard::epoch`](super::DataLoaderShard::epoch).
///
/// Each batch handed out moves the loader's [`DataProgress`], so a batch prepared ahead but
/// never received does not count. Dropping the iterator early stops its background thread.
///
/// A batch that cannot be made (the batcher panics on items it cannot stack, like images of
/// another size) is an [`AccelerateError::BadData`] from [`try_next`](Self::try_next). As an
/// iterator (`for batch in loader.epoch(e)`), a loader made by
/// [`Accelerator::dataloader`](crate::Accelerator::dataloader) ends the epoch there and the
/// Accelerator's next call (`forward`, `backward`, `step`, a save, `finish`) returns that
/// error; a loader built alone with `DataLoaderShard::new` has no one to report to and panics
/// with the message.
pub struct EpochIter<B: Backend, I, O> {
    source: Source<B, I, O>,
    epoch: usize,
    next: usize,
    num_batches: usize,
    progress: Arc<Mutex<DataProgress>>,
    fault: Option<FaultSlot>,
}

impl<B: Backend, I: 'static, O: Send + 'static> EpochIter<B, I, O> {
    /// Epoch `epoch`'s `batches` (item indices) from batch `start`, prefetched `depth` ahead
    /// on a background thread unless `depth` is 0.
    pub(crate) fn new(
        maker: BatchMaker<B, I, O>,
        mut batches: Vec<Vec<usize>>,
        (epoch, start): (usize, usize),
        depth: usize,
        progress: Arc<Mutex<DataProgress>>,
        fault: Option<FaultSlot>,
    ) -> Self {
        let num_batches = batches.len();
        batches.drain(..start.min(num_batches));
        let source = if depth == 0 || batches.is_empty() {
            Source::inline(maker, batches)
        } else {
            Source::prefetched(maker, batches, depth)
        };
        Self {
            source,
            epoch,
            next: start,
            num_batches,
            progress,
            fault,
        }
    }

    /// The next batch, `Ok(None)` after the last; a batch that cannot be made is
    /// [`AccelerateError::BadData`] naming its epoch and index, and ends the epoch.
    pub fn try_next(&mut self) -> Result<Option<O>, AccelerateError> {
        if self.next >= self.num_batches {
            return Ok(None);
        }
        let batch = match quietly(|| self.source.next()) {
            Ok(Some(batch)) => batch,
            Ok(None) => return Ok(None),
            Err(panic) => {
                let at = self.next;
                self.next = self.num_batches;
                return Err(AccelerateError::BadData(format!(
                    "epoch {}, batch {at}: {} (the epoch stopped there: that batch and the \
                     ones after it were not trained on)",
                    self.epoch,
                    panic_message(&*panic)
                )));
            }
        };
        self.next += 1;
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = DataProgress {
            epoch: self.epoch,
            next_batch: self.next,
            num_batches: self.num_batches,
        };
        Ok(Some(batch))
    }
}

impl<B: Backend, I: 'static, O: Send + 'static> Iterator for EpochIter<B, I, O> {
    type Item = O;

    fn next(&mut self) -> Option<O> {
        let error = match self.try_next() {
            Ok(batch) => return batch,
            Err(error) => error,
        };
        // The message alone: whoever reports it again (the Accelerator, `next_batch`) wraps
        // it in its own `BadData`.
        let message = match error {
            AccelerateError::BadData(message) => message,
            other => other.to_string(),
        };
        match &self.fault {
            Some(fault) => {
                tracing::error!(
                    "bad data: {message}; the Accelerator's next call returns this error"
                );
                *fault.lock().unwrap_or_else(PoisonError::into_inner) = Some(message);
                None
            }
            None => std::panic::panic_any(message),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.num_batches.saturating_sub(self.next);
        (left, Some(left))
    }
}
