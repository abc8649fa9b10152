//! A reader of CIFAR-10's binary format, for users who have the files: a Burn dataset
//! ([`ImageDataset`]).
//!
//! Each record is 3,073 bytes: the label (0..9), then 1,024 red, 1,024 green and 1,024 blue
//! pixel bytes of a 32x32 image, row by row. The train set is `data_batch_1.bin` ..
//! `data_batch_5.bin`, the test set `test_batch.bin` (from `cifar-10-binary.tar.gz`).

use std::path::Path;

use super::{ImageDataset, ImageItem};
use afterburner::AccelerateError;

/// Image side length.
pub const SIDE: usize = 32;
/// Colour channels.
pub const CHANNELS: usize = 3;
/// Number of classes.
pub const CLASSES: usize = 10;
const RECORD: usize = 1 + CHANNELS * SIDE * SIDE;
/// Records in each of CIFAR-10's batch files.
pub const RECORDS_PER_FILE: usize = 10_000;

/// Which files to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `data_batch_1.bin` .. `data_batch_5.bin` (50,000 images).
    Train,
    /// `test_batch.bin` (10,000 images).
    Test,
}

/// Reads a split from the `cifar-10-batches-bin` directory.
pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<ImageDataset, AccelerateError> {
    let names: Vec<String> = match split {
        Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
        Split::Test => vec!["test_batch.bin".to_string()],
    };
    let mut items = Vec::new();
    for name in names {
        items.extend(read_items(&dir.as_ref().join(name))?);
    }
    ImageDataset::new(items, [CHANNELS, SIDE, SIDE])
}

/// Reads one binary batch file.
pub fn read_file(path: impl AsRef<Path>) -> Result<ImageDataset, AccelerateError> {
    ImageDataset::new(read_items(path.as_ref())?, [CHANNELS, SIDE, SIDE])
}

/// One batch file: exactly [`RECORDS_PER_FILE`] records (a file cut between two records
/// would otherwise load as a smaller data set).
fn read_items(path: &Path) -> Result<Vec<ImageItem>, AccelerateError> {
    let bytes = std::fs::read(path).map_err(|e| AccelerateError::io("reading", path, e))?;
    if bytes.len() != RECORDS_PER_FILE * RECORD {
        return Err(AccelerateError::corrupt(
            path,
            format!(
                "{} bytes ({:.2} records); a CIFAR-10 batch file holds {RECORDS_PER_FILE} \
                 records of {RECORD} bytes (cut short or another file?)",
                bytes.len(),
                bytes.len() as f64 / RECORD as f64
            ),
        ));
    }
    parse(&bytes).map_err(|reason| AccelerateError::corrupt(path, reason))
}

/// Parses records; errors on a length that is not a whole number of records or a bad label.
pub fn parse(bytes: &[u8]) -> Result<Vec<ImageItem>, String> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(RECORD) {
        return Err(format!(
            "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(RECORD)
        .enumerate()
        .map(|(i, record)| {
            let label = record[0] as usize;
            if label >= CLASSES {
                return Err(format!("record {i}: label {label} is not in 0..10"));
            }
            Ok(ImageItem {
                pixels: record[1..].iter().map(|&b| f32::from(b) / 255.0).collect(),
                label,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record with label `label` whose channel c pixel p is (c * 7 + p) % 256.
    fn record(label: u8) -> Vec<u8> {
        let mut r = vec![label];
        r.extend((0..CHANNELS * SIDE * SIDE).map(|i| ((i / 1024) * 7 + i % 1024) as u8));
        r
    }

    #[test]
    fn reads_records_written_in_the_format() {
        let mut bytes = record(3);
        bytes.extend(record(9));
        let items = parse(&bytes).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!((items[0].label, items[1].label), (3, 9));
        assert_eq!(items[0].pixels.len(), 3072);
        // channel 1 (green), pixel 5: (7 + 5) / 255
        assert!((items[0].pixels[1024 + 5] - 12.0 / 255.0).abs() < 1e-7);
    }

    #[test]
    fn truncated_or_bad_label_is_an_error() {
        let mut bytes = record(1);
        bytes.pop();
        assert!(parse(&bytes).unwrap_err().contains("whole number"));
        assert!(parse(&record(10)).unwrap_err().contains("label 10"));
        assert!(load("/nonexistent-dir", Split::Train).is_err());
    }

    /// Issue 11, finding 9: a batch file cut exactly between two records is not a data set.
    #[test]
    fn a_file_cut_between_records_is_an_error() {
        let dir = std::env::temp_dir().join(format!("ab-cifar-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("test_batch.bin"), record(3)).unwrap();
        let err = load(&dir, Split::Test).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains("10000 records") && err.contains("test_batch.bin"),
            "{err}"
        );
    }
}
