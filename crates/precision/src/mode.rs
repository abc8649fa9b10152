//! How the mixed precisions run the forward pass: per op, through a half view, or whichever
//! the backend allows.

use serde_with::{DeserializeFromStr, SerializeDisplay};

use crate::PrecisionError;

/// How the mixed precisions run the forward (the `autocast` setting of the Accelerator).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    SerializeDisplay,
    DeserializeFromStr,
    strum::Display,
    strum::EnumString,
    strum::VariantNames,
)]
#[strum(
    serialize_all = "lowercase",
    ascii_case_insensitive,
    parse_err_ty = PrecisionError,
    parse_err_fn = AutocastMode::unknown
)]
pub enum AutocastMode {
    /// "op" where the backend has `Autocast`, "view" otherwise.
    #[default]
    Auto,
    /// Per op, inside an `autocast_ops` scope (needs `Autodiff<Autocast<B>>`).
    Op,
    /// A half view of the model: every op of the forward in half.
    View,
}

impl AutocastMode {
    fn unknown(given: &str) -> PrecisionError {
        use strum::VariantNames;
        PrecisionError::InvalidSetting {
            field: "autocast",
            value: given.into(),
            expected: format!("one of: {}", Self::VARIANTS.join(", ")),
        }
    }
}
