//! Built-in text for the character-level language model: chapters I-IV of Jules Verne's
//! "Around the World in 80 Days" (Project Gutenberg eBook #103, public domain; see
//! `crates/demos/data/README.md`), cut into windows as a Burn dataset, and sampling
//! from a trained model.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::models::Transformer;
use afterburner::AccelerateError;

const TEXT: &str = include_str!("../data/eighty-days.txt");

/// The built-in text (ASCII, about 33 KB).
pub fn load() -> &'static str {
    TEXT
}

/// `seq_len + 1` bytes of text: the model reads the first `seq_len` and predicts the last
/// `seq_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextItem {
    /// The bytes.
    pub tokens: Vec<u8>,
}

/// Windows of `seq_len + 1` bytes of a text, one every `stride` bytes (Burn's `Dataset`).
#[derive(Debug, Clone)]
pub struct TextDataset {
    text: Vec<u8>,
    seq_len: usize,
    stride: usize,
}

impl TextDataset {
    /// The windows of `text`; errors unless `seq_len` and `stride` are at least 1 and the
    /// text holds at least one window.
    pub fn new(text: &str, seq_len: usize, stride: usize) -> Result<Self, AccelerateError> {
        if seq_len == 0 || stride == 0 {
            return Err(AccelerateError::invalid(
                "seq_len / stride",
                format!("{seq_len} / {stride}"),
                "at least 1",
            ));
        }
        if text.len() <= seq_len {
            return Err(AccelerateError::invalid(
                "text",
                format!("{} bytes", text.len()),
                "more bytes than seq_len",
            ));
        }
        Ok(Self {
            text: text.as_bytes().to_vec(),
            seq_len,
            stride,
        })
    }

    /// Splits the text itself (not its windows, which overlap) into a training part and the
    /// last `test_fraction` of it, so no test byte is seen in training.
    pub fn split(self, test_fraction: f64) -> Result<(Self, Self), AccelerateError> {
        let cut = ((1.0 - test_fraction.clamp(0.0, 1.0)) * self.text.len() as f64) as usize;
        let text = String::from_utf8_lossy(&self.text).into_owned();
        let (train, test) = text.split_at(cut.min(text.len()));
        Ok((
            Self::new(train, self.seq_len, self.stride)?,
            Self::new(test, self.seq_len, self.stride)?,
        ))
    }
}

impl Dataset<TextItem> for TextDataset {
    fn get(&self, index: usize) -> Option<TextItem> {
        let start = index.checked_mul(self.stride)?;
        let tokens = self.text.get(start..start + self.seq_len + 1)?.to_vec();
        Some(TextItem { tokens })
    }

    fn len(&self) -> usize {
        (self.text.len() - self.seq_len - 1) / self.stride + 1
    }
}

/// Inputs and next-byte targets, `[batch, seq_len]` each.
#[derive(Debug, Clone)]
pub struct TokenBatch<B: Backend> {
    /// Bytes read.
    pub inputs: Tensor<B, 2, Int>,
    /// The byte after each one.
    pub targets: Tensor<B, 2, Int>,
    /// The largest byte in `targets`, taken on the host while batching (`None` for an empty
    /// batch), so a loss checks it against the model's vocabulary without reading the device.
    pub max_target: Option<usize>,
}

/// Stacks [`TextItem`]s into a [`TokenBatch`] (Burn's `Batcher`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenBatcher;

impl<B: Backend> Batcher<B, TextItem, TokenBatch<B>> for TokenBatcher {
    fn batch(&self, items: Vec<TextItem>, device: &B::Device) -> TokenBatch<B> {
        let n = items.len();
        let len = items
            .first()
            .map_or(0, |i| i.tokens.len().saturating_sub(1));
        let column = |skip: usize| -> Tensor<B, 2, Int> {
            let values: Vec<i64> = items
                .iter()
                .flat_map(|i| i.tokens[skip..skip + len].iter().map(|b| *b as i64))
                .collect();
            Tensor::from_data(TensorData::new(values, [n, len]), device)
        };
        let max_target = items
            .iter()
            .filter_map(|item| item.tokens.iter().skip(1).take(len).max())
            .max()
            .map(|byte| *byte as usize);
        TokenBatch {
            inputs: column(0),
            targets: column(1),
            max_target,
        }
    }
}

/// `n` bytes sampled from `model` after `prompt`, at `temperature`, from a seeded generator
/// (the same seed, the same text).
pub fn sample<B: Backend>(
    model: &Transformer<B>,
    prompt: &str,
    n: usize,
    temperature: f64,
    max_seq_len: usize,
    seed: u64,
) -> String {
    let device = model.devices().into_iter().next().unwrap_or_default();
    let mut bytes = prompt.as_bytes().to_vec();
    let mut state = seed | 1;
    for _ in 0..n {
        let context = &bytes[bytes.len().saturating_sub(max_seq_len)..];
        let values: Vec<i64> = context.iter().map(|b| *b as i64).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(values, [1, context.len()]), &device);
        let output = model.forward(tokens);
        let [_, t, vocab] = output.dims();
        let logits = output.narrow(1, t - 1, 1).reshape([vocab]);
        let probs = softmax(logits.div_scalar(temperature.max(1e-6)), 0)
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .unwrap_or_default();
        // xorshift64*: a uniform draw in [0, 1).
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let draw = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        let mut total = 0.0;
        let next = probs
            .iter()
            .position(|p| {
                total += p;
                total > draw
            })
            .unwrap_or(b' ' as usize);
        bytes.push(next as u8);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn windows_targets_and_split() {
        let data = TextDataset::new("abcdefghij", 4, 2).unwrap();
        // Starts 0, 2, 4 (a window needs 5 bytes).
        assert_eq!(data.len(), 3);
        assert_eq!(data.get(2).unwrap().tokens, b"efghi".to_vec());
        assert!(data.get(3).is_none());
        let batch: TokenBatch<Flex> =
            TokenBatcher.batch(vec![data.get(0).unwrap()], &Default::default());
        let inputs = batch
            .inputs
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .unwrap();
        let targets = batch
            .targets
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .unwrap();
        assert_eq!(inputs, vec![97, 98, 99, 100]);
        assert_eq!(targets, vec![98, 99, 100, 101]);
        let (train, test) = TextDataset::new(load(), 64, 16)
            .unwrap()
            .split(0.1)
            .unwrap();
        assert!(train.len() > 8 * test.len() && !test.is_empty());
        assert!(TextDataset::new("short", 8, 1).is_err());
        assert!(TextDataset::new("long enough text", 4, 0).is_err());
    }
}
