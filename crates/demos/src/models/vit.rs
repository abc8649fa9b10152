//! A small Vision Transformer from Burn's own layers.

use afterburner::checkpoint::Checkpointed;
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderLayer};
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A small Vision Transformer: patch embedding (a strided Conv2d), learned position
/// embeddings, pre-norm transformer encoder layers (each a [`Checkpointed`] block, recomputed
/// when the Accelerator's `gradient_checkpointing` says so), mean pooling and a linear head.
#[derive(Config, Debug)]
pub struct VitConfig {
    /// Input channels.
    #[config(default = 1)]
    pub channels: usize,
    /// Input height and width (square images).
    #[config(default = 8)]
    pub image_size: usize,
    /// Patch side; `image_size` must be a multiple of it.
    #[config(default = 2)]
    pub patch_size: usize,
    /// Token width.
    #[config(default = 64)]
    pub d_model: usize,
    /// Attention heads.
    #[config(default = 4)]
    pub n_heads: usize,
    /// Transformer blocks.
    #[config(default = 2)]
    pub n_layers: usize,
    /// Hidden width of each block's MLP.
    #[config(default = 128)]
    pub d_ff: usize,
    /// Classes.
    #[config(default = 10)]
    pub num_classes: usize,
    /// Dropout inside the encoder.
    #[config(default = 0.0)]
    pub dropout: f64,
}

/// The model built by [`VitConfig::init`].
#[derive(Module, Debug)]
pub struct Vit<B: Backend> {
    patch_embed: Conv2d<B>,
    pos_embed: Param<Tensor<B, 3>>,
    blocks: Vec<Checkpointed<B, TransformerEncoderLayer<B>>>,
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl VitConfig {
    /// Number of patches (tokens) per image.
    pub fn num_patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }

    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Vit<B> {
        let p = self.patch_size;
        Vit {
            patch_embed: Conv2dConfig::new([self.channels, self.d_model], [p, p])
                .with_stride([p, p])
                .init(device),
            pos_embed: Initializer::Normal {
                mean: 0.0,
                std: 0.02,
            }
            .init([1, self.num_patches(), self.d_model], device),
            blocks: TransformerEncoderConfig::new(
                self.d_model,
                self.d_ff,
                self.n_heads,
                self.n_layers,
            )
            .with_dropout(self.dropout)
            .with_norm_first(true)
            .init(device)
            .layers
            .into_iter()
            .map(Checkpointed::new)
            .collect(),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.num_classes).init(device),
        }
    }
}

impl<B: Backend> Vit<B> {
    /// `[batch, channels, height, width]` images to `[batch, classes]` logits.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let patches = self.patch_embed.forward(images); // [b, d, h/p, w/p]
        let [b, d, h, w] = patches.dims();
        let tokens = patches.reshape([b, d, h * w]).swap_dims(1, 2) + self.pos_embed.val();
        let encoded = self.blocks.iter().fold(tokens, |x, block| {
            block.forward(x, |layer: &TransformerEncoderLayer<B>, x| {
                layer.forward(x, None, None)
            })
        });
        let pooled = self.norm.forward(encoded).mean_dim(1).reshape([b, d]);
        self.head.forward(pooled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn vit_maps_images_to_logits() {
        let device = Default::default();
        let model = VitConfig::new().init::<Flex>(&device);
        let logits = model.forward(Tensor::zeros([3, 1, 8, 8], &device));
        assert_eq!(logits.dims(), [3, 10]);
    }
}
