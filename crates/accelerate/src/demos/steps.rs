//! The demo ViT on the [`Trainer`](crate::trainer::Trainer): its training loss and its
//! evaluation output (burn-train's `ClassificationOutput`, which every classification metric
//! reads).

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::{ClassificationOutput, InferenceStep};

use super::ImageBatch;
use super::models::Vit;
use crate::trainer::TrainLoss;
use crate::{AccelerateError, Accelerator};

impl<B: AutodiffBackend> TrainLoss<B, ImageBatch<B>> for Vit<B> {
    fn train_loss(
        &self,
        acc: &Accelerator<B>,
        batch: ImageBatch<B>,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        let logits = acc.forward(self, batch.images, |model, images| model.forward(images))?;
        let loss = CrossEntropyLossConfig::new().init(&logits.device());
        Ok(loss.forward(logits, batch.labels))
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
