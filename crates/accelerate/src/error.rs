use std::path::PathBuf;

use afterburner_checkpoint::CheckpointError;
use afterburner_parallel::ParallelError;
use afterburner_precision::PrecisionError;
use thiserror::Error;

/// Everything the facade can report; every message names what is wrong.
#[derive(Debug, Error)]
pub enum AccelerateError {
    /// A precision problem (bad string, unsupported dtype, bad scaler setting).
    #[error(transparent)]
    Precision(#[from] PrecisionError),
    /// An activation-checkpointing problem (bad policy, policy and backend disagree).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A multi-device problem (a peer failed or hung, ranks disagree).
    #[error(transparent)]
    Parallel(#[from] ParallelError),
    /// A config field out of range.
    #[error("invalid {field} = {value}: expected {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value, as written.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
    /// A call made in the wrong order (e.g. `step` before any `backward`).
    #[error("{0}")]
    Usage(String),
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A saved state or data file is damaged, truncated or of another format.
    #[error("corrupt {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl AccelerateError {
    pub(crate) fn invalid(
        field: &'static str,
        value: impl ToString,
        expected: &'static str,
    ) -> Self {
        Self::InvalidConfig {
            field,
            value: value.to_string(),
            expected,
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        Self::Corrupt {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}
