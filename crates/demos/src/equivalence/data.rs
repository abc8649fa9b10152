//! The matrix's data and loss: byte windows of the built-in text, whole (for the mean
//! normalisation) or cut short and padded (for the per-item one: every item counts as many
//! targets as it has bytes), and the next-byte cross-entropy summed over the targets that
//! count, with an optional auxiliary term that reads the model outside `acc.forward`.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::case::LossShape;
use crate::models::Transformer;
use crate::text::{self, TokenBatch};

/// Bytes a window predicts.
pub const SEQ_LEN: usize = 8;
/// Weight of the auxiliary terms (a penalty on the head's weights, a second forward's mean
/// square).
pub const AUX: f64 = 0.05;

/// One window: `SEQ_LEN + 1` bytes, of which the first `len + 1` are real (`len` targets).
#[derive(Debug, Clone)]
pub struct EqItem {
    /// The window's bytes; the ones past `len + 1` are padding.
    pub tokens: Vec<u8>,
    /// How many targets count.
    pub len: usize,
}

/// `n` windows of the built-in text; `padded`: item `i` keeps `3 + (5 i mod 6)` of its 8
/// targets (3 to 8), so the ranks' and micro-batches' item counts differ.
pub fn dataset(n: usize, padded: bool) -> InMemDataset<EqItem> {
    let bytes = text::load().as_bytes();
    let items = (0..n)
        .map(|i| {
            let start = i * 7;
            let mut tokens = bytes[start..start + SEQ_LEN + 1].to_vec();
            let len = match padded {
                true => 3 + (5 * i) % 6,
                false => SEQ_LEN,
            };
            tokens[len + 1..].iter_mut().for_each(|t| *t = 0);
            EqItem { tokens, len }
        })
        .collect();
    InMemDataset::new(items)
}

/// A batch of windows: inputs, targets and the mask of the targets that count.
#[derive(Debug, Clone)]
pub struct EqBatch<B: Backend> {
    /// `[batch, SEQ_LEN]` bytes read.
    pub inputs: Tensor<B, 2, Int>,
    /// `[batch, SEQ_LEN]` the byte after each (0 where padding).
    pub targets: Tensor<B, 2, Int>,
    /// `[batch, SEQ_LEN]` 1 where the target counts, 0 where it is padding.
    pub mask: Tensor<B, 2>,
    /// Targets that count (known on the host, from the items).
    pub count: usize,
    /// What the loss reads besides `acc.forward`'s output ([`aux_term`]).
    pub loss: LossShape,
}

/// Stacks [`EqItem`]s for training ([`EqBatch`]) and for evaluation (the demo's
/// [`TokenBatch`], which the Trainer's evaluation bound asks for; the matrix never evaluates).
#[derive(Debug, Clone, Copy)]
pub struct EqBatcher {
    /// What the batches' loss reads besides `acc.forward`'s output.
    pub loss: LossShape,
}

fn column<B: Backend>(items: &[EqItem], skip: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    let values: Vec<i64> = items
        .iter()
        .flat_map(|i| i.tokens[skip..skip + SEQ_LEN].iter().map(|b| i64::from(*b)))
        .collect();
    Tensor::from_data(TensorData::new(values, [items.len(), SEQ_LEN]), device)
}

impl<B: Backend> Batcher<B, EqItem, EqBatch<B>> for EqBatcher {
    fn batch(&self, items: Vec<EqItem>, device: &B::Device) -> EqBatch<B> {
        let mask: Vec<f32> = items
            .iter()
            .flat_map(|i| (0..SEQ_LEN).map(move |t| if t < i.len { 1.0 } else { 0.0 }))
            .collect();
        EqBatch {
            inputs: column(&items, 0, device),
            targets: column(&items, 1, device),
            mask: Tensor::from_data(TensorData::new(mask, [items.len(), SEQ_LEN]), device),
            count: items.iter().map(|i| i.len).sum(),
            loss: self.loss,
        }
    }
}

impl<B: Backend> Batcher<B, EqItem, TokenBatch<B>> for EqBatcher {
    fn batch(&self, items: Vec<EqItem>, device: &B::Device) -> TokenBatch<B> {
        TokenBatch {
            inputs: column(&items, 0, device),
            targets: column(&items, 1, device),
            max_target: items
                .iter()
                .flat_map(|i| i.tokens.iter())
                .max()
                .map(|b| *b as usize),
        }
    }
}

/// The cross-entropy of `logits` (`[batch, SEQ_LEN, vocab]`) summed over the targets that
/// count.
pub fn loss_sum<B: Backend>(logits: Tensor<B, 3>, batch: &EqBatch<B>) -> Tensor<B, 1> {
    let picked = log_softmax(logits, 2)
        .gather(2, batch.targets.clone().unsqueeze_dim(2))
        .squeeze_dim::<2>(2);
    (picked * batch.mask.clone()).sum().neg()
}

/// The auxiliary term of `batch`'s loss shape, read from the model as it is outside
/// `acc.forward`: none, `AUX * sum(head.weight^2)` (a weight penalty), or
/// `AUX * mean(logits^2)` of a second, plain forward of the model on the batch.
pub fn aux_term<B: Backend>(model: &Transformer<B>, batch: &EqBatch<B>) -> Option<Tensor<B, 1>> {
    match batch.loss {
        LossShape::Plain => None,
        LossShape::Aux => Some(model.head.weight.val().powi_scalar(2).sum().mul_scalar(AUX)),
        LossShape::SecondForward => {
            let logits = model.forward(batch.inputs.clone());
            Some(logits.powi_scalar(2).mean().mul_scalar(AUX))
        }
    }
}
