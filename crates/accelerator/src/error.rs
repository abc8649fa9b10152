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
    Precision(PrecisionError),
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
        expected: String,
    },
    /// A training argument (Trainer setting, file or command-line value) out of range or
    /// unknown.
    #[error("invalid training argument '{key}': {reason}")]
    InvalidArgument {
        /// The key, as written in a file or on the command line.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Gradients or parameters hold inf/NaN where the `nonfinite_gradients` policy refuses
    /// them (a step under "error", a save of a poisoned model).
    #[error("{0}")]
    NonFinite(String),
    /// A call made in the wrong order (e.g. `step` before any `backward`, `save_state` in the
    /// middle of an accumulation cycle).
    #[error("{0}")]
    CallOrder(String),
    /// `backward` found no gradient for the model's parameters (the loss was not computed
    /// through `forward` on the model `setup` returned).
    #[error("{0}")]
    NoGradients(String),
    /// A batch could not be made from the dataset's items (the batcher refused them: images
    /// of another size, say).
    #[error("bad data: {0}")]
    BadData(String),
    /// The ranks disagree: one failed where the others succeeded, or they hold different
    /// data (parts of different saves, different values for one collective).
    #[error("{0}")]
    RanksDisagree(String),
    /// A sharded state was saved at another world size.
    #[error("{0}")]
    WrongWorldSize(String),
    /// `save_state` refuses to replace a directory that is not an afterburner state (no
    /// manifest of ours, or files the manifest does not list).
    #[error(
        "refusing to replace {dir}: it exists and is not an afterburner state directory, or \
         holds files afterburner did not write (nothing was written or deleted)"
    )]
    NotAStateDir {
        /// The directory.
        dir: PathBuf,
    },
    /// `save_state` refuses to replace a symbolic link (it would replace the link, not the
    /// state it points to).
    #[error(
        "refusing to replace {dir}: it is a symbolic link (to {}); save to the directory it \
         points to (nothing was written)",
        target.display()
    )]
    StateDirIsLink {
        /// The link.
        dir: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// The state lacks a part that was asked for.
    #[error("the state at {dir} has no part '{part}' (it holds: {})", saved.join(", "))]
    MissingPart {
        /// The state directory.
        dir: PathBuf,
        /// The part asked for.
        part: String,
        /// The parts the state holds.
        saved: Vec<String>,
    },
    /// The state holds a part that was not asked for (it would be silently dropped).
    #[error(
        "the state at {dir} holds a part '{part}' that was not given to load (given: {})",
        expected.join(", ")
    )]
    UnknownPart {
        /// The state directory.
        dir: PathBuf,
        /// The unexpected part.
        part: String,
        /// The parts given to load.
        expected: Vec<String>,
    },
    /// A part cannot be saved or loaded as given (a bad or repeated name, an encoding
    /// failure, an optimizer without its model under a gathered state).
    #[error("state part '{part}': {reason}")]
    InvalidPart {
        /// The part (its name, or its type).
        part: String,
        /// What is wrong.
        reason: String,
    },
    /// A weights file does not match the model: its keys, listed (after renames).
    #[error(
        "weights {path} do not match the model: missing from the file [{}], unexpected in the \
         file [{}]{}",
        missing.join(", "),
        unexpected.join(", "),
        errors.iter().map(|e| format!("; {e}")).collect::<String>()
    )]
    Weights {
        /// The file.
        path: PathBuf,
        /// Model parameters the file lacks.
        missing: Vec<String>,
        /// Tensors of the file that no model parameter takes.
        unexpected: Vec<String>,
        /// Tensors that could not be applied (a shape or dtype mismatch).
        errors: Vec<String>,
    },
    /// `--help` was given on a command line: the text lists every option; a program prints
    /// it on standard output and exits 0 (it is not a failure).
    #[error("{0}")]
    Help(String),
    /// Any other error, e.g. one a worker closure returns for its own reasons (a worker that
    /// returns an error stops every rank).
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
    /// Training stopped early because a stop was requested (`stop_on_signal` and a SIGTERM
    /// or SIGINT); the Trainer saved a checkpoint first.
    #[error("training stopped by a signal at step {step}{}", saved_to(.saved))]
    Stopped {
        /// The last optimizer step taken.
        step: u64,
        /// The checkpoint saved before stopping, if any.
        saved: Option<PathBuf>,
    },
    /// A saved state lists more bytes than the memory available to load them (memory
    /// pressure, or a sparse or foreign file listed at its size); nothing was read.
    #[error(
        "{path} lists {bytes} bytes of files, more than the {available} bytes of memory \
         available to load them; nothing was read"
    )]
    TooLarge {
        /// The manifest.
        path: PathBuf,
        /// The bytes it lists.
        bytes: u64,
        /// The memory available.
        available: u64,
    },
    /// A saved state or data file is damaged, truncated or of another format.
    #[error("corrupt {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A state file is intact (it passed its length and checksum checks) but holds a record
    /// of another type than the one given to load: another model, or the same model after a
    /// field was renamed. Not damage: a checkpoint that says so is never skipped or set aside.
    #[error(
        "{path} holds a different {what} than the one given to load (the file is intact: \
         it passed its checksum; nothing was loaded): {reason}"
    )]
    Mismatched {
        /// The file.
        path: PathBuf,
        /// What it should hold ("model", "optimizer state", ...).
        what: &'static str,
        /// What did not fit (the decoder's words, e.g. a missing field).
        reason: String,
    },
}

/// ", state saved to <dir>" for [`AccelerateError::Stopped`].
fn saved_to(saved: &Option<PathBuf>) -> String {
    saved
        .as_ref()
        .map(|dir| format!(", state saved to {} (resume from it)", dir.display()))
        .unwrap_or_default()
}

impl From<PrecisionError> for AccelerateError {
    /// A precision setting out of range is a config field out of range, as the facade reports
    /// every other one.
    fn from(error: PrecisionError) -> Self {
        match error {
            PrecisionError::InvalidSetting {
                field,
                value,
                expected,
            } => Self::InvalidConfig {
                field,
                value,
                expected,
            },
            other => Self::Precision(other),
        }
    }
}

impl AccelerateError {
    /// A config `field` whose `value` is not what is `expected`.
    pub fn invalid(field: &'static str, value: impl ToString, expected: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field,
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// A training argument `key` whose `value` is not what is `expected`.
    pub fn argument(key: impl ToString, value: impl ToString, expected: impl ToString) -> Self {
        Self::InvalidArgument {
            key: key.to_string(),
            reason: format!(
                "{} given, expected {}",
                value.to_string(),
                expected.to_string()
            ),
        }
    }

    /// An I/O error of `action` on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// An intact state file at `path` that holds another `what` than the one given, and why.
    pub fn mismatched(path: impl Into<PathBuf>, what: &'static str, reason: impl ToString) -> Self {
        Self::Mismatched {
            path: path.into(),
            what,
            reason: reason.to_string(),
        }
    }

    /// A file at `path` that does not hold what it should, and why.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        Self::Corrupt {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}
