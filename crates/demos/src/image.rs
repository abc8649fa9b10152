//! Labelled images: a Burn dataset of them and their batcher.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use afterburner::AccelerateError;
use afterburner::rng::permutation;

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
    /// The largest class index in `labels`, taken on the host while batching (`None` for an
    /// empty batch), so a loss checks it against the model's classes without reading the
    /// device.
    pub max_label: Option<usize>,
}

/// Stacks [`ImageItem`]s of one shape into an [`ImageBatch`] (Burn's [`Batcher`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageBatcher {
    /// Channels per image.
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
}

impl<B: Backend> Batcher<B, ImageItem, ImageBatch<B>> for ImageBatcher {
    fn batch(&self, items: Vec<ImageItem>, device: &B::Device) -> ImageBatch<B> {
        let n = items.len();
        let size = self.channels * self.height * self.width;
        if let Some((i, item)) = items
            .iter()
            .enumerate()
            .find(|(_, it)| it.pixels.len() != size)
        {
            // Burn's Batcher returns no Result: a named panic, which the Trainer turns into
            // AccelerateError::BadData (ImageDataset::new checks every image up front).
            panic!(
                "ImageBatcher: image {i} of this batch holds {} values, not {}x{}x{} = {size}",
                item.pixels.len(),
                self.channels,
                self.height,
                self.width
            );
        }
        let mut pixels = Vec::with_capacity(n * size);
        let mut labels = Vec::with_capacity(n);
        let max_label = items.iter().map(|item| item.label).max();
        for item in items {
            pixels.extend_from_slice(&item.pixels);
            labels.push(item.label as i64);
        }
        let shape = [n, self.channels, self.height, self.width];
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, shape), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
            max_label,
        }
    }
}

/// Labelled images of one shape held in memory: a Burn [`Dataset<ImageItem>`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDataset {
    items: Vec<ImageItem>,
    batcher: ImageBatcher,
}

impl ImageDataset {
    /// The images `items`, each `[channels, height, width]`; errors on an item of another size.
    pub fn new(
        items: Vec<ImageItem>,
        [channels, height, width]: [usize; 3],
    ) -> Result<Self, AccelerateError> {
        let size = channels * height * width;
        if let Some((i, item)) = items
            .iter()
            .enumerate()
            .find(|(_, it)| it.pixels.len() != size)
        {
            return Err(AccelerateError::invalid(
                "pixels",
                format!(
                    "{} values in image {i}, not {channels}x{height}x{width} = {size}",
                    item.pixels.len()
                ),
                "channels x height x width values in every image",
            ));
        }
        Ok(Self {
            items,
            batcher: ImageBatcher {
                channels,
                height,
                width,
            },
        })
    }

    /// The batcher for these images.
    pub fn batcher(&self) -> ImageBatcher {
        self.batcher
    }

    /// The images.
    pub fn items(&self) -> &[ImageItem] {
        &self.items
    }

    /// The first `n` images (all of them if there are fewer).
    pub fn take(mut self, n: usize) -> Self {
        self.items.truncate(n);
        self
    }

    /// Splits into (train, test) with a seeded shuffle; `test_fraction` of them go to test.
    pub fn split(self, test_fraction: f64, seed: u64) -> (Self, Self) {
        let batcher = self.batcher;
        let (train, test) = train_test_split(self.items, test_fraction, seed);
        (
            Self {
                items: train,
                batcher,
            },
            Self {
                items: test,
                batcher,
            },
        )
    }
}

impl Dataset<ImageItem> for ImageDataset {
    fn get(&self, index: usize) -> Option<ImageItem> {
        self.items.get(index).cloned()
    }

    fn len(&self) -> usize {
        self.items.len()
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn item(label: usize) -> ImageItem {
        ImageItem {
            pixels: vec![label as f32 / 10.0; 4],
            label,
        }
    }

    #[test]
    fn a_dataset_of_images_batches_as_burn_does() {
        let data = ImageDataset::new((0..5).map(item).collect(), [1, 2, 2]).unwrap();
        assert_eq!(
            (data.len(), data.get(3), data.get(5)),
            (5, Some(item(3)), None)
        );
        let batch: ImageBatch<Flex> = data
            .batcher()
            .batch(vec![item(1), item(4)], &Default::default());
        assert_eq!(batch.images.dims(), [2, 1, 2, 2]);
        assert_eq!(
            batch
                .labels
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .unwrap(),
            [1, 4]
        );
        let (train, test) = data.clone().split(0.4, 0);
        assert_eq!((train.len(), test.len()), (3, 2));
        assert_eq!(data.take(2).items(), [item(0), item(1)]);
    }

    #[test]
    fn an_image_of_another_size_is_an_error() {
        let err = ImageDataset::new(vec![item(0)], [3, 2, 2])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("4 values in image 0") && err.contains("3x2x2"),
            "{err}"
        );
    }
}
