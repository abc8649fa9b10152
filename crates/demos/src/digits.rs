//! The built-in default data: UCI's 8x8 handwritten digits (1,797 images, 10 classes), as a
//! Burn dataset ([`ImageDataset`]).
//!
//! Shipped inside the crate (57 KB, gzip CSV as scikit-learn ships it; CC BY 4.0, see
//! `data/README.md`), so examples and tests need no download.

use std::io::Read;

use flate2::read::GzDecoder;

use super::{ImageDataset, ImageItem};
use afterburner::AccelerateError;

const DIGITS_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// Image side length.
pub const SIDE: usize = 8;
/// Number of classes.
pub const CLASSES: usize = 10;

/// All 1,797 digits as 1x8x8 images with pixels scaled to 0..=1, in the file's order.
pub fn load() -> Result<ImageDataset, AccelerateError> {
    let mut csv = String::new();
    GzDecoder::new(DIGITS_GZ)
        .read_to_string(&mut csv)
        .map_err(|e| AccelerateError::corrupt("digits.csv.gz", e))?;
    ImageDataset::new(parse(&csv)?, [1, SIDE, SIDE])
}

/// Parses rows of 64 pixel values (0..16) followed by a label (0..9).
fn parse(csv: &str) -> Result<Vec<ImageItem>, AccelerateError> {
    csv.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(row, line)| {
            let bad = |why: String| {
                AccelerateError::corrupt("digits.csv.gz", format!("row {row}: {why}"))
            };
            let values: Vec<f32> = line
                .split(',')
                .map(|v| {
                    v.trim()
                        .parse::<f32>()
                        .map_err(|e| bad(format!("'{v}': {e}")))
                })
                .collect::<Result<_, _>>()?;
            if values.len() != SIDE * SIDE + 1 {
                return Err(bad(format!("{} values, expected 65", values.len())));
            }
            let label = values[SIDE * SIDE];
            if !(0.0..CLASSES as f32).contains(&label) {
                return Err(bad(format!("label {label}")));
            }
            Ok(ImageItem {
                pixels: values[..SIDE * SIDE].iter().map(|p| p / 16.0).collect(),
                label: label as usize,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::data::dataset::Dataset;

    #[test]
    fn loads_all_digits() {
        let data = load().unwrap();
        assert_eq!(data.len(), 1797);
        assert_eq!(data.batcher().channels, 1);
        let items = data.items();
        assert!(items.iter().all(|i| i.pixels.len() == 64 && i.label < 10));
        assert!(
            items
                .iter()
                .flat_map(|i| &i.pixels)
                .all(|p| (0.0..=1.0).contains(p))
        );
        let mut per_class = [0usize; 10];
        items.iter().for_each(|i| per_class[i.label] += 1);
        assert!(per_class.iter().all(|&n| n > 170), "{per_class:?}");
    }

    #[test]
    fn bad_rows_are_errors() {
        assert!(parse("1,2,3").is_err());
        let row = format!("{}11", "0,".repeat(64));
        assert!(parse(&row).unwrap_err().to_string().contains("label"));
    }
}
