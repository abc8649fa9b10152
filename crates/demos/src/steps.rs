//! The demo models on the [`Trainer`](afterburner::trainer::Trainer): their training loss and
//! their evaluation output (burn-train's `ClassificationOutput`, which every classification
//! metric reads; the language model's is one classification per byte).

use afterburner::ParallelStrategy;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn::train::{ClassificationOutput, InferenceStep};

use super::ImageBatch;
use super::models::{Transformer, Vit};
use super::text::TokenBatch;
use afterburner::trainer::TrainLoss;
use afterburner::{AccelerateError, Accelerator};

impl<B: AutodiffBackend, S: ParallelStrategy<B>> TrainLoss<B, ImageBatch<B>, S> for Vit<B> {
    fn train_loss(
        &self,
        acc: &Accelerator<B, S>,
        batch: ImageBatch<B>,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        let logits = acc.forward(self, batch.images, |model, images| model.forward(images))?;
        check_classes(batch.max_label, logits.dims()[1], "label")?;
        let loss = CrossEntropyLossConfig::new().init(&logits.device());
        Ok(loss.forward(logits, batch.labels))
    }
}

/// Errors unless the largest class index of a batch (taken on the host by its batcher) is
/// below `classes` (Burn's cross-entropy panics on one that is not); reads nothing from the
/// device.
fn check_classes(
    largest: Option<usize>,
    classes: usize,
    what: &str,
) -> Result<(), AccelerateError> {
    match largest {
        Some(largest) if largest >= classes => Err(AccelerateError::invalid(
            "labels",
            format!("a {what} of {largest} in a batch (the model has {classes} classes)"),
            "class indices from 0 to the model's number of classes - 1",
        )),
        _ => Ok(()),
    }
}

impl<B: Backend> InferenceStep for Vit<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let logits = self.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> TrainLoss<B, TokenBatch<B>, S> for Transformer<B> {
    fn train_loss(
        &self,
        acc: &Accelerator<B, S>,
        batch: TokenBatch<B>,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        let logits = acc.forward(self, batch.inputs, |model, tokens| model.forward(tokens))?;
        let vocab = logits.dims()[2];
        check_classes(batch.max_target, vocab, "target token")?;
        Ok(next_token_loss(logits, batch.targets))
    }

    /// Every predicted byte is an item: the mean loss times their number.
    fn train_loss_sum(
        &self,
        acc: &Accelerator<B, S>,
        batch: TokenBatch<B>,
    ) -> Result<(Tensor<B, 1>, usize), AccelerateError> {
        let [b, t] = batch.targets.dims();
        let mean = self.train_loss(acc, batch)?;
        Ok((mean.mul_scalar((b * t) as f64), b * t))
    }

    /// Its plan (models/transformer/tp.rs).
    fn parallelize(self, acc: &Accelerator<B, S>) -> Result<Self, AccelerateError> {
        acc.parallelize(self)
    }

    /// Every input byte is a token.
    fn batch_tokens(&self, batch: &TokenBatch<B>) -> Option<usize> {
        let [b, t] = batch.inputs.dims();
        Some(b * t)
    }
}

impl<B: Backend> InferenceStep for Transformer<B> {
    type Input = TokenBatch<B>;
    type Output = ClassificationOutput<B>;

    /// One prediction per byte: `[batch * seq_len, vocab]` logits, so accuracy and
    /// perplexity read it as a classification.
    fn step(&self, batch: TokenBatch<B>) -> ClassificationOutput<B> {
        let logits = self.forward(batch.inputs);
        let [b, t, vocab] = logits.dims();
        let logits = logits.reshape([b * t, vocab]);
        let targets = batch.targets.reshape([b * t]);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), targets.clone());
        ClassificationOutput::new(loss, logits, targets)
    }
}

/// Cross-entropy of `[batch, seq_len, vocab]` logits against `[batch, seq_len]` next bytes.
fn next_token_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [b, t, vocab] = logits.dims();
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits.reshape([b * t, vocab]), targets.reshape([b * t]))
}
