//! Labelled images and their batcher.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::Batcher;
use crate::rng::permutation;

/// One labelled image, pixels in `[channels, height, width]` order, scaled to `0..=1`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageItem {
    /// `channels * height * width` values in 0..=1.
    pub pixels: Vec<f32>,
    /// The class index.
    pub label: usize,
}

/// A batch of images and labels on a device.
#[derive(Debug, Clone)]
pub struct ImageBatch<B: Backend> {
    /// `[batch, channels, height, width]`, f32.
    pub images: Tensor<B, 4>,
    /// `[batch]` class indices.
    pub labels: Tensor<B, 1, Int>,
}

/// Stacks [`ImageItem`]s of one shape into an [`ImageBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageBatcher {
    /// Channels per image.
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
}

impl<B: Backend> Batcher<B, ImageItem> for ImageBatcher {
    type Output = ImageBatch<B>;

    fn batch(&self, items: Vec<ImageItem>, device: &B::Device) -> ImageBatch<B> {
        let n = items.len();
        let mut pixels = Vec::with_capacity(n * self.channels * self.height * self.width);
        let mut labels = Vec::with_capacity(n);
        for item in items {
            pixels.extend_from_slice(&item.pixels);
            labels.push(item.label as i64);
        }
        let shape = [n, self.channels, self.height, self.width];
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, shape), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

/// Splits items into (train, test) with a seeded shuffle; `test_fraction` of them go to test.
pub fn train_test_split<T>(items: Vec<T>, test_fraction: f64, seed: u64) -> (Vec<T>, Vec<T>) {
    let n_test = ((items.len() as f64) * test_fraction.clamp(0.0, 1.0)).round() as usize;
    let order = permutation(items.len(), seed);
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    let mut shuffled: Vec<T> = order.iter().filter_map(|&i| slots[i].take()).collect();
    let test = shuffled.split_off(shuffled.len() - n_test);
    (shuffled, test)
}
