//! Per-item loss normalisation: a batch with padding items, split into micro-batches with
//! different numbers of real items, trains exactly like the whole batch, on 1 and 2 ranks.

mod common;

use afterburner::trainer::{
    IntervalStrategy, LossNormalization, TrainLoss, Trainer, TrainingArguments,
};
use afterburner::{AccelerateError, Accelerator, StrategyConfig};
use afterburner_demos::models::Vit;
use afterburner_demos::{ImageBatch, ImageItem, digits};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};
use burn::train::{ClassificationOutput, InferenceStep};
use common::{B, BATCHER, flatten, params, rng_lock, vit};

/// Labels of this value are padding: they do not count in the loss.
const PAD: usize = 10;

/// The demo ViT with a loss that skips padding items.
#[derive(Module, Debug)]
struct MaskedVit<B: Backend> {
    vit: Vit<B>,
}

/// Images, labels (padding replaced by class 0) and a 1/0 mask of the real items.
#[derive(Clone, Debug)]
struct MaskedBatch<B: Backend> {
    images: ImageBatch<B>,
    mask: Tensor<B, 1>,
}

#[derive(Clone, Copy)]
struct MaskedBatcher;

impl<B: Backend> Batcher<B, ImageItem, MaskedBatch<B>> for MaskedBatcher {
    fn batch(&self, items: Vec<ImageItem>, device: &B::Device) -> MaskedBatch<B> {
        let mask: Vec<f32> = items
            .iter()
            .map(|i| (i.label != PAD) as u8 as f32)
            .collect();
        let items = items
            .into_iter()
            .map(|mut i| {
                i.label = if i.label == PAD { 0 } else { i.label };
                i
            })
            .collect();
        let n = mask.len();
        MaskedBatch {
            images: BATCHER.batch(items, device),
            mask: Tensor::from_data(burn::tensor::TensorData::new(mask, [n]), device),
        }
    }
}

/// Per-item cross-entropy, `[batch]`.
fn per_item_loss<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let [n, classes] = logits.dims();
    let picked = log_softmax(logits, 1).gather(1, labels.reshape([n, 1]));
    let _ = classes;
    picked.reshape([n]).neg()
}

impl<B: AutodiffBackend> TrainLoss<B, MaskedBatch<B>> for MaskedVit<B> {
    fn train_loss(
        &self,
        acc: &Accelerator<B>,
        batch: MaskedBatch<B>,
    ) -> Result<Tensor<B, 1>, AccelerateError> {
        let (sum, items) = self.train_loss_sum(acc, batch)?;
        Ok(sum.div_scalar(items.max(1) as f64))
    }

    fn train_loss_sum(
        &self,
        acc: &Accelerator<B>,
        batch: MaskedBatch<B>,
    ) -> Result<(Tensor<B, 1>, usize), AccelerateError> {
        let logits = acc.forward(self, batch.images.images, |m, x| m.vit.forward(x))?;
        let items = batch.mask.clone().sum().into_scalar().elem::<f64>() as usize;
        let losses = per_item_loss(logits, batch.images.labels) * batch.mask;
        Ok((losses.sum(), items))
    }
}

impl<B: Backend> InferenceStep for MaskedVit<B> {
    type Input = MaskedBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: MaskedBatch<B>) -> ClassificationOutput<B> {
        let logits = self.vit.forward(batch.images.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.images.labels.clone());
        ClassificationOutput::new(loss, logits, batch.images.labels)
    }
}

/// 16 digits, 6 of them padding, bunched so micro-batches of 4 hold 4, 1, 2 and 3 real
/// items (before shuffling; shuffled, they differ again).
fn items() -> Vec<ImageItem> {
    let mut items = digits::load().unwrap().items()[..16].to_vec();
    for i in [5, 6, 7, 10, 11, 15] {
        items[i].label = PAD;
    }
    items
}

/// The runs' output directory (one per test process, as before: the runs only log there).
static OUTPUT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// AdamW with a huge epsilon is plain SGD (`update = lr * g / eps`), so the parameters after
/// one step show the gradient itself, not just its sign.
fn args(batch: usize, accumulation: usize, normalization: LossNormalization) -> TrainingArguments {
    TrainingArguments {
        output_dir: OUTPUT
            .get_or_init(|| common::scratch_dir("per-item"))
            .clone(),
        max_steps: 1,
        per_device_train_batch_size: batch,
        gradient_accumulation_steps: accumulation,
        loss_normalization: normalization,
        learning_rate: 1e4,
        adam_epsilon: 1e4,
        max_grad_norm: 0.0,
        lr_scheduler_type: afterburner::trainer::SchedulerType::Constant,
        save_strategy: IntervalStrategy::No,
        logging_strategy: IntervalStrategy::No,
        ..Default::default()
    }
}

fn one_step(args: TrainingArguments) -> Vec<f32> {
    let model = MaskedVit { vit: vit(21) };
    let data = InMemDataset::new(items());
    let mut t = Trainer::new(model, args, data, InMemDataset::new(vec![]), MaskedBatcher).unwrap();
    t.train().unwrap();
    flatten(&params(t.model().unwrap()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn micro_batches_with_different_item_counts_equal_the_full_batch() {
    let _rng = rng_lock();
    let before = flatten(&params(&MaskedVit { vit: vit(21) }));
    let full = one_step(args(16, 1, LossNormalization::PerItem));
    assert!(
        max_diff(&full, &before) > 1e-3,
        "the step moved the parameters"
    );
    let split = one_step(args(4, 4, LossNormalization::PerItem));
    assert!(
        max_diff(&split, &full) < 1e-6,
        "{}",
        max_diff(&split, &full)
    );
    // The mean of micro-batch means weighs the items differently: not the full batch.
    let means = one_step(args(4, 4, LossNormalization::BatchMean));
    assert!(
        max_diff(&means, &full) > 1e-4,
        "{}",
        max_diff(&means, &full)
    );
}

#[test]
fn two_ranks_with_different_item_counts_equal_the_full_batch() {
    // 2 micro-batches of 4 per rank (reduced after backward), and 1 of 8 (DDP reduces during
    // backward; the per-item factor then applies to the averaged gradients).
    for (batch, micro_batches) in [(4, 2), (8, 1)] {
        two_ranks_equal_the_full_batch(batch, micro_batches);
    }
}

fn two_ranks_equal_the_full_batch(batch: usize, micro_batches: usize) {
    let _rng = rng_lock();
    let full = one_step(args(16, 1, LossNormalization::PerItem));
    let ddp = TrainingArguments {
        parallelism: afterburner::ParallelismConfig {
            strategy: StrategyConfig::Ddp(Default::default()),
            devices: 2,
            ..args(batch, micro_batches, LossNormalization::PerItem).parallelism
        },
        ..args(batch, micro_batches, LossNormalization::PerItem)
    };
    let model = MaskedVit { vit: vit(21) };
    let results = Accelerator::<B>::run(ddp.accelerator_config(), move |acc| {
        let data = InMemDataset::new(items());
        let empty = InMemDataset::new(vec![]);
        let mut t = Trainer::on(acc, model.clone(), ddp.clone(), data, empty, MaskedBatcher)?;
        t.train()?;
        Ok(flatten(&params(t.model()?)))
    })
    .unwrap();
    for rank in &results {
        assert!(
            max_diff(rank, &full) < 1e-6,
            "{batch} x {micro_batches} per rank: {}",
            max_diff(rank, &full)
        );
    }
}

/// Under fp16 the summed losses go back divided by about one micro-batch's items, so their
/// gradients fit the loss scale as a mean's do: the step is applied (a summed loss's
/// gradients, `items` times larger, overflowed at the initial scale and the step was skipped),
/// and the micro-batches still equal the whole batch.
#[test]
fn per_item_under_fp16_fits_the_loss_scale() {
    let _rng = rng_lock();
    let fp16 = |batch, accumulation| TrainingArguments {
        precision: "16-mixed".parse().unwrap(),
        ..args(batch, accumulation, LossNormalization::PerItem)
    };
    let before = flatten(&params(&MaskedVit { vit: vit(21) }));
    let full = one_step(fp16(16, 1));
    assert!(
        max_diff(&full, &before) > 1e-3,
        "the fp16 step was skipped (overflow)"
    );
    let split = one_step(fp16(4, 4));
    let exact = one_step(args(16, 1, LossNormalization::PerItem));
    let scale = max_diff(&exact, &before);
    // Within fp16's own error of the 32-bit step.
    for (name, run) in [("whole batch", &full), ("4 micro-batches", &split)] {
        let error = max_diff(run, &exact) / scale;
        assert!(error < 2e-2, "{name} at 16-mixed: {error:e} of the step");
    }
}
