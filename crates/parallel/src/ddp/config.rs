//! [`DdpConfig`]: how DDP (and ZeRO-1, which is DDP beneath) reduces its gradients, as a
//! `[strategy.ddp]` table.

use serde::{Deserialize, Serialize};

use super::buckets::DEFAULT_BUCKET_CAP_MB;
use crate::ParallelError;

/// DDP settings: PyTorch DDP's `bucket_cap_mb` and whether the buckets go during backward, as
/// a `[strategy.ddp]` (or `[strategy.zero-1]`) table (unknown keys are errors; missing ones
/// take the defaults). Each field's doc comment is the description `--help` shows for the
/// option (`--ddp.bucket-cap-mb 50`, `--ddp.overlap false`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, documented::DocumentedFields)]
#[serde(default, deny_unknown_fields)]
pub struct DdpConfig {
    /// The most MiB of gradients one all-reduce carries (PyTorch DDP's and HF's
    /// `ddp_bucket_cap_mb`); default 25. Smaller buckets start sending earlier in backward,
    /// larger ones make fewer collectives.
    pub bucket_cap_mb: f64,
    /// Whether the buckets are all-reduced on a communication thread while backward runs
    /// (default true), in optimizer steps of one micro-batch (with accumulation, the steps'
    /// gradients are reduced after the last micro-batch's backward). The result is bitwise the
    /// reduction after backward; false reduces after backward always.
    pub overlap: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        Self {
            bucket_cap_mb: DEFAULT_BUCKET_CAP_MB,
            overlap: true,
        }
    }
}

impl DdpConfig {
    /// Errors naming `bucket_cap_mb` when it is not a positive, finite number of MiB.
    pub fn validate(&self) -> Result<(), ParallelError> {
        if self.bucket_cap_mb.is_finite() && self.bucket_cap_mb > 0.0 {
            return Ok(());
        }
        Err(ParallelError::InvalidConfig {
            field: "bucket_cap_mb",
            value: self.bucket_cap_mb.to_string(),
            expected: format!(
                "a positive number of MiB (default {DEFAULT_BUCKET_CAP_MB}, as PyTorch's)"
            ),
        })
    }
}
