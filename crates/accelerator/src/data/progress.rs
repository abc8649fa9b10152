//! [`DataProgress`]: where the training loader stands, as the user has received its batches.

use serde::{Deserialize, Serialize};

/// Where a loader stands in its data: the epoch and the next batch to yield.
///
/// The Accelerator reads it to flush accumulation at the end of an epoch and saves it with the
/// training state, so a resumed run continues at the same batch. It counts the batches handed
/// to the caller, never the ones a background thread has prepared ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataProgress {
    /// The epoch being read.
    pub epoch: usize,
    /// Index of the next batch in that epoch.
    pub next_batch: usize,
    /// Batches per epoch.
    pub num_batches: usize,
}

impl DataProgress {
    /// True when the last batch of the epoch has been handed out.
    pub fn end_of_epoch(&self) -> bool {
        self.num_batches > 0 && self.next_batch >= self.num_batches
    }

    /// `(epoch, batch)` where reading should continue.
    pub fn resume_position(&self) -> (usize, usize) {
        if self.end_of_epoch() {
            (self.epoch + 1, 0)
        } else {
            (self.epoch, self.next_batch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serialized_form_is_the_saved_one() {
        let p = DataProgress {
            epoch: 3,
            next_batch: 1,
            num_batches: 2,
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"epoch":3,"next_batch":1,"num_batches":2}"#);
        assert_eq!(serde_json::from_str::<DataProgress>(&json).unwrap(), p);
    }
}
