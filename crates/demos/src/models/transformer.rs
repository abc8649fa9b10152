//! A GPT-style stack of pre-norm transformer blocks, marked for every checkpointing policy:
//! each block is a [`Checkpointed`] block, and inside it the parts that are cheap to recompute
//! (the layer norms, the softmax, the GELU) are [`BlockKind::Cheap`] parts, which the
//! `selective` policy recomputes while the matmul outputs stay saved.

mod tp;

use afterburner::checkpoint::{BlockKind, Checkpointed, checkpoint};
use afterburner::parallel::tp::TpLinear;
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// Settings of the [`Transformer`]; the defaults are the 12-block model of the
/// checkpointing benchmark.
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Token vocabulary.
    #[config(default = 256)]
    pub vocab_size: usize,
    /// Token width.
    #[config(default = 256)]
    pub d_model: usize,
    /// Attention heads (`d_model` must be a multiple).
    #[config(default = 4)]
    pub n_heads: usize,
    /// Blocks.
    #[config(default = 12)]
    pub n_layers: usize,
    /// Longest sequence (learned positions).
    #[config(default = 64)]
    pub max_seq_len: usize,
}

/// One pre-norm block: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`, with causal
/// self-attention and a 4x GELU MLP. Its four Linears are [`TpLinear`]s: whole until the
/// tensor-parallel plan (tp.rs) splits them.
#[derive(Module, Debug)]
pub struct TransformerBlock<B: Backend> {
    norm1: Checkpointed<B, LayerNorm<B>>,
    /// The fused query, key and value projection `[d, 3 d]`.
    pub qkv: TpLinear<B>,
    /// The attention's output projection `[d, d]`.
    pub proj: TpLinear<B>,
    norm2: Checkpointed<B, LayerNorm<B>>,
    /// The MLP's first Linear `[d, 4 d]`.
    pub fc1: TpLinear<B>,
    /// The MLP's second Linear `[4 d, d]`.
    pub fc2: TpLinear<B>,
    /// Heads (of the whole layer: a split one runs its share).
    n_heads: usize,
}

/// The model built by [`TransformerConfig::init`]: token and position embeddings,
/// [`TransformerBlock`]s, a final norm and a language-model head.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    /// The blocks, each a [`Checkpointed`] block.
    pub blocks: Vec<Checkpointed<B, TransformerBlock<B>>>,
    norm: LayerNorm<B>,
    /// The language-model head `[d, vocab]`.
    pub head: Linear<B>,
}

impl TransformerConfig {
    /// GPT-2 small's shape: 12 blocks of width 768 with 12 heads, 1,024 positions and GPT-2's
    /// 50,257 tokens (163,087,441 parameters: the head is not tied to the embedding as in
    /// GPT-2, whose count is 124M). The same pre-norm blocks and tensor-parallel plan as every
    /// demo transformer: `tp_size` 2, 3, 4, 6 or 12 splits its heads evenly.
    pub fn gpt2() -> Self {
        Self::new()
            .with_vocab_size(50_257)
            .with_d_model(768)
            .with_n_heads(12)
            .with_n_layers(12)
            .with_max_seq_len(1_024)
    }

    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Transformer<B> {
        let d = self.d_model;
        let block = || TransformerBlock {
            norm1: Checkpointed::cheap(LayerNormConfig::new(d).init(device)),
            qkv: LinearConfig::new(d, 3 * d).init(device).into(),
            proj: LinearConfig::new(d, d).init(device).into(),
            norm2: Checkpointed::cheap(LayerNormConfig::new(d).init(device)),
            fc1: LinearConfig::new(d, 4 * d).init(device).into(),
            fc2: LinearConfig::new(4 * d, d).init(device).into(),
            n_heads: self.n_heads,
        };
        Transformer {
            tokens: EmbeddingConfig::new(self.vocab_size, d).init(device),
            positions: EmbeddingConfig::new(self.max_seq_len, d).init(device),
            blocks: (0..self.n_layers)
                .map(|_| Checkpointed::new(block()))
                .collect(),
            norm: LayerNormConfig::new(d).init(device),
            head: LinearConfig::new(d, self.vocab_size).init(device),
        }
    }
}

impl<B: Backend> TransformerBlock<B> {
    /// `[batch, seq, d_model]` to the same shape.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = self
            .norm1
            .forward(x.clone(), |n: &LayerNorm<B>, x| n.forward(x));
        let x = x + self.attention(h);
        let h = self
            .norm2
            .forward(x.clone(), |n: &LayerNorm<B>, x| n.forward(x));
        let h = checkpoint(BlockKind::Cheap, on_2d(h, |h| self.fc1.forward(h)), gelu);
        x + on_2d(h, |h| self.fc2.forward(h))
    }

    fn attention(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let d = x.dims()[2];
        let qkv = on_2d(x, |x| self.qkv.forward(x));
        // This rank's heads: all of them, or its share when the plan split the projection.
        let heads = self.n_heads * qkv.dims()[2] / (3 * d);
        let context = causal_attention(qkv, heads);
        on_2d(context, |c| self.proj.forward(c))
    }
}

/// Causal self-attention of `heads` heads from a fused projection `qkv` (`[batch, seq, 3 w]`:
/// queries, keys and values side by side) to the context `[batch, seq, w]`, the softmax a
/// [`BlockKind::Cheap`] part.
fn causal_attention<B: Backend>(qkv: Tensor<B, 3>, heads: usize) -> Tensor<B, 3> {
    let [b, s, three_w] = qkv.dims();
    let w = three_w / 3;
    let hd = w / heads;
    let split = |t: Tensor<B, 3>| t.reshape([b, s, heads, hd]).swap_dims(1, 2);
    let qkv = qkv.chunk(3, 2);
    let [q, k, v] = [0, 1, 2].map(|i| split(qkv[i].clone()));
    let scores = q.matmul(k.swap_dims(2, 3));
    let mask = Tensor::<B, 2, burn::tensor::Bool>::tril_mask([s, s], 0, &scores.device());
    let scale = (hd as f64).sqrt().recip();
    let probs = checkpoint(BlockKind::Cheap, scores, move |scores: Tensor<B, 4>| {
        let masked = scores
            .mul_scalar(scale)
            .mask_fill(mask.clone().unsqueeze::<4>(), f32::NEG_INFINITY);
        softmax(masked, 3)
    });
    probs.matmul(v).swap_dims(1, 2).reshape([b, s, w])
}

/// `linear` applied to the `[batch * seq, d]` view of `x`: the same values as
/// `linear.forward(x)`, but Burn 0.21 computes the weight gradient of a 3-D input as `batch`
/// small matmuls and a sum (and a `[batch, d_in, d_out]` temporary), where the 2-D view makes
/// it one large matmul (docs/performance.md, "The Linear weight gradient").
fn linear_2d<B: Backend>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    on_2d(x, |x| linear.forward(x))
}

/// `layer` applied to the `[batch * seq, d]` view of `x`, back to `[batch, seq, d_out]`.
fn on_2d<B: Backend>(
    x: Tensor<B, 3>,
    layer: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Tensor<B, 3> {
    let [b, s, d] = x.dims();
    let y = layer(x.reshape([b * s, d]));
    let out = y.dims()[1];
    y.reshape([b, s, out])
}

impl<B: Backend> Transformer<B> {
    /// `[batch, seq]` token ids to `[batch, seq, vocab]` logits.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, s] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..s as i64, &tokens.device())
            .reshape([1, s])
            .repeat_dim(0, b);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let x = self.blocks.iter().fold(x, |x, block| {
            block.forward(x, |block: &TransformerBlock<B>, x| block.forward(x))
        });
        linear_2d(&self.head, self.norm.forward(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn maps_tokens_to_logits() {
        let device = Default::default();
        let model = TransformerConfig::new()
            .with_d_model(16)
            .with_n_layers(2)
            .with_vocab_size(11)
            .init::<Flex>(&device);
        let logits = model.forward(Tensor::zeros([2, 5], &device));
        assert_eq!(logits.dims(), [2, 5, 11]);
    }
}
