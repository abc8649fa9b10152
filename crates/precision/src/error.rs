use thiserror::Error;

/// Errors of the precision crate: each names the bad value and what is allowed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PrecisionError {
    /// A precision string that is not one of the known spellings.
    #[error("unknown precision '{given}'; valid values: {valid}")]
    UnknownPrecision {
        /// What the user wrote.
        given: String,
        /// The accepted spellings, comma separated.
        valid: String,
    },
    /// Both HF flags `bf16` and `fp16` were set.
    #[error("bf16 and fp16 cannot both be true; pick one")]
    ConflictingFlags,
    /// The backend cannot compute in the dtype the policy needs.
    #[error(
        "precision '{precision}' needs {dtype:?} support, which backend '{backend}' lacks on this \
         device; use \"32-true\" or a backend with {dtype:?} (flex, cuda)"
    )]
    UnsupportedDtype {
        /// The requested policy.
        precision: String,
        /// The dtype that is missing.
        dtype: burn::tensor::DType,
        /// The backend's name.
        backend: String,
    },
    /// A loss-scaler setting out of range.
    #[error("invalid GradScaler setting {field} = {value}: {expected}")]
    InvalidScalerConfig {
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// What is allowed.
        expected: &'static str,
    },
    /// A setting of the precision plugin out of range (the autocast mode, or a mode the
    /// backend cannot run).
    #[error("invalid {field} = {value}: expected {expected}")]
    InvalidSetting {
        /// The setting, as the Accelerator's config names it.
        field: &'static str,
        /// Its value, as written.
        value: String,
        /// What is allowed.
        expected: String,
    },
}
