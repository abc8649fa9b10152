//! Evaluation metrics: burn-train's metrics, updated batch by batch (memory constant in the
//! number of batches) and combined across ranks by item count, so no item counts twice.

use std::marker::PhantomData;
use std::sync::Arc;

use burn::data::dataloader::Progress;
use burn::data::dataset::Dataset;
use burn::train::metric::{Adaptor, Metric, MetricMetadata, Numeric, NumericEntry};

/// One evaluation metric the Trainer reports as `eval_<name>`. Every burn-train metric that is
/// [`Numeric`] (accuracy, top-k accuracy, precision, recall, F-beta, AUROC, perplexity, loss,
/// ...) is one, for any output that adapts to its input; implement burn-train's `Metric` and
/// `Numeric` for a metric of your own.
pub trait EvalMetric<O>: Send {
    /// The name in the logs, `eval_` and the metric's name in snake case.
    fn key(&self) -> String;
    /// Adds one batch's output.
    fn update(&mut self, output: &O, metadata: &MetricMetadata);
    /// The value over every batch since [`clear`](Self::clear), and the items it covers.
    fn value(&self) -> (f64, usize);
    /// Forgets every batch.
    fn clear(&mut self);
}

impl<Me, O> EvalMetric<O> for Me
where
    Me: Metric + Numeric + 'static,
    O: Adaptor<Me::Input>,
{
    fn key(&self) -> String {
        format!("eval_{}", snake_case(&self.name()))
    }

    fn update(&mut self, output: &O, metadata: &MetricMetadata) {
        Metric::update(self, &output.adapt(), metadata);
    }

    fn value(&self) -> (f64, usize) {
        match self.running_value() {
            NumericEntry::Value(value) => (value, 1),
            NumericEntry::Aggregated {
                aggregated_value,
                count,
            } => (aggregated_value, count),
        }
    }

    fn clear(&mut self) {
        Metric::clear(self);
    }
}

/// One metric or a tuple of them, for [`Trainer::with_metrics`](super::Trainer::with_metrics).
pub trait MetricSet<O> {
    /// The metrics, boxed.
    fn into_boxed(self) -> Vec<Box<dyn EvalMetric<O>>>;
}

macro_rules! metric_tuple {
    ($($name:ident),+) => {
        impl<O, $($name: EvalMetric<O> + 'static),+> MetricSet<O> for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_boxed(self) -> Vec<Box<dyn EvalMetric<O>>> {
                let ($($name,)+) = self;
                vec![$(Box::new($name)),+]
            }
        }
    };
}
metric_tuple!(A);
metric_tuple!(A, C);
metric_tuple!(A, C, D);
metric_tuple!(A, C, D, E);
metric_tuple!(A, C, D, E, F);
metric_tuple!(A, C, D, E, F, G);

/// `Top-K Accuracy @ 5` as `top_k_accuracy_5`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        match c.is_ascii_alphanumeric() {
            true => out.push(c.to_ascii_lowercase()),
            false if !out.ends_with('_') && !out.is_empty() => out.push('_'),
            false => {}
        }
    }
    out.trim_end_matches('_').to_string()
}

/// What a metric is told about the batch it sees.
pub(crate) fn metadata(done: usize, total: usize, step: u64) -> MetricMetadata {
    let progress = Progress {
        items_processed: done,
        items_total: total,
    };
    MetricMetadata {
        progress: progress.clone(),
        global_progress: progress,
        iteration: Some(step as usize),
        lr: None,
    }
}

/// Items `rank`, `rank + world`, `rank + 2 world`, ... of a dataset, without padding: every
/// item is on exactly one rank, so metrics combined by item count are exact.
pub(crate) struct ShardOf<I, D> {
    dataset: Arc<D>,
    rank: usize,
    world: usize,
    _item: PhantomData<fn() -> I>,
}

impl<I, D: Dataset<I>> ShardOf<I, D> {
    pub(crate) fn new(dataset: Arc<D>, rank: usize, world: usize) -> Self {
        Self {
            dataset,
            rank,
            world: world.max(1),
            _item: PhantomData,
        }
    }
}

impl<I: Send + Sync, D: Dataset<I>> Dataset<I> for ShardOf<I, D> {
    fn get(&self, index: usize) -> Option<I> {
        self.dataset.get(self.rank + index * self.world)
    }

    fn len(&self) -> usize {
        self.dataset
            .len()
            .saturating_sub(self.rank)
            .div_ceil(self.world)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataset::InMemDataset;

    #[test]
    fn shards_cover_every_item_once() {
        let data = Arc::new(InMemDataset::new((0..7).collect::<Vec<i32>>()));
        let mut seen: Vec<i32> = (0..3)
            .flat_map(|rank| {
                let shard = ShardOf::new(data.clone(), rank, 3);
                (0..shard.len()).filter_map(move |i| shard.get(i))
            })
            .collect();
        seen.sort();
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn metric_names_become_snake_case_keys() {
        assert_eq!(snake_case("Top-K Accuracy @ 5"), "top_k_accuracy_5");
        assert_eq!(snake_case("Accuracy"), "accuracy");
    }
}
