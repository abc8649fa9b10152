//! The Trainer's evaluation: the loss and every metric over the evaluation dataset, combined
//! across ranks, and the best-metric and early-stopping bookkeeping after each evaluation.

use crate::precision::cast_module;
use burn::module::AutodiffModule;
use burn::tensor::DType;
use burn::train::InferenceStep;
use burn::train::metric::{Adaptor, LossMetric, Metric};

use super::EvalMetric;
use super::TrainerTypes;
use super::metrics::metadata;
use super::{Inner, Metrics, Trainer, lost_model};
use crate::AccelerateError;
use crate::data::next_batch;

impl<T: TrainerTypes> Trainer<T> {
    /// Evaluates, records the metrics, and tracks the best metric and early stopping.
    pub(super) fn evaluate_and_track(&mut self) -> Result<Metrics, AccelerateError> {
        let metrics = self.evaluate()?;
        let Some(name) = self.args.best_metric_name() else {
            return Ok(metrics);
        };
        let Some(value) = metrics.get(&name) else {
            let known: Vec<&str> = metrics.0.keys().map(String::as_str).collect();
            return Err(AccelerateError::argument(
                "metric_for_best_model",
                &name,
                format!("one of the evaluation metrics: {}", known.join(", ")),
            ));
        };
        let greater = self.args.greater_is_better();
        let better = |a: f64, b: f64| if greater { a > b } else { a < b };
        let state = &mut self.state;
        let improved = match state.best_metric {
            None => true,
            Some(best) => {
                better(value, best) && (value - best).abs() > self.args.early_stopping_threshold
            }
        };
        state.evals_without_improvement = match improved {
            true => 0,
            false => state.evals_without_improvement + 1,
        };
        if state.best_metric.is_none_or(|best| better(value, best)) {
            state.best_metric = Some(value);
            state.last_eval_was_best = true;
        }
        Ok(metrics)
    }

    /// Evaluates the model on the evaluation dataset: `eval_loss` and every metric, batch by
    /// batch on this rank's share, combined across ranks by item count. The model runs
    /// without autodiff (no dropout), in f32 for the `*-true` modes. Every rank calls it.
    pub fn evaluate(&mut self) -> Result<Metrics, AccelerateError> {
        let model = self
            .acc
            .full_model(self.model.as_ref().ok_or_else(lost_model)?)?;
        let model = match self.acc.precision().param_dtype() {
            DType::F32 => model,
            _ => cast_module(model, DType::F32),
        };
        let model = model.valid();
        for metric in &mut self.metrics {
            metric.clear();
        }
        let total = self.eval.as_ref().map_or(0, |eval| eval.len());
        let per_batch = self.args.per_device_eval_batch_size;
        // The loss per item (HF's eval_loss), not per batch: the last batch may be short.
        let (mut loss_sum, mut items) = (0.0, 0usize);
        let batches = self
            .eval
            .as_ref()
            .map(|eval| eval.epoch(0))
            .into_iter()
            .flatten();
        let mut batches = batches.enumerate();
        while let Some((i, batch)) = next_batch(&mut batches)? {
            let output = model.step(batch);
            let in_batch = per_batch.min(total - i * per_batch);
            items += in_batch;
            let meta = metadata(items, total, self.state.global_step);
            let mut loss = LossMetric::<Inner<T::Backend>>::new();
            Metric::update(&mut loss, &output.adapt(), &meta);
            loss_sum += EvalMetric::<T::EvalOutput>::value(&loss).0 * in_batch as f64;
            for metric in &mut self.metrics {
                metric.update(&output, &meta);
            }
        }
        let mut sums = vec![loss_sum, items as f64];
        for metric in &self.metrics {
            let (value, count) = metric.value();
            sums.push(if count == 0 {
                0.0
            } else {
                value * count as f64
            });
            sums.push(count as f64);
        }
        let sums = self.sum_across_ranks(sums)?;
        if sums[1] == 0.0 {
            return Err(AccelerateError::argument(
                "eval_dataset",
                "empty",
                "at least one item to evaluate on",
            ));
        }
        let mut metrics = Metrics::default();
        metrics.insert("eval_loss", sums[0] / sums[1]);
        for (metric, pair) in self.metrics.iter().zip(sums[2..].chunks(2)) {
            metrics.insert(metric.key(), pair[0] / pair[1]);
        }
        self.record(metrics.clone())?;
        Ok(metrics)
    }
}
