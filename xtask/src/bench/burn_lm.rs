//! A language model built only from Burn's own layers: token and position `Embedding`s, Burn's
//! `TransformerEncoder` (pre-norm, causal mask) and a `Linear` head. The same shapes as the
//! demo transformer (12 blocks, d_model 256, 4 heads, MLP 1024, vocab 256), so the Linear suite
//! shows what Burn's 3-D Linears cost a user's model and what `Autocast` gives back.

use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

const VOCAB: usize = 256;
const D_MODEL: usize = 256;
const MAX_SEQ: usize = 128;

/// Embeddings, Burn's `TransformerEncoder` and a head.
#[derive(Module, Debug)]
pub(super) struct BurnLm<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    encoder: TransformerEncoder<B>,
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> BurnLm<B> {
    /// The 12-block model, dropout off.
    pub(super) fn new(device: &B::Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
            positions: EmbeddingConfig::new(MAX_SEQ, D_MODEL).init(device),
            encoder: TransformerEncoderConfig::new(D_MODEL, 4 * D_MODEL, 4, 12)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            norm: LayerNormConfig::new(D_MODEL).init(device),
            head: LinearConfig::new(D_MODEL, VOCAB).init(device),
        }
    }

    /// Logits `[batch, seq, vocab]` for tokens `[batch, seq]` (seq at most 128).
    pub(super) fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(self.norm.forward(x))
    }
}
