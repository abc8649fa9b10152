//! How the mixed precisions run the forward pass: per op, through a half view, or whichever
//! the backend allows.

use core::fmt;
use core::str::FromStr;

use serde_with::{DeserializeFromStr, SerializeDisplay};

use crate::PrecisionError;

/// How the mixed precisions run the forward (the `autocast` setting of the Accelerator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum AutocastMode {
    /// "op" where the backend has `Autocast`, "view" otherwise.
    #[default]
    Auto,
    /// Per op, inside an `autocast_ops` scope (needs `Autodiff<Autocast<B>>`).
    Op,
    /// A half view of the model: every op of the forward in half.
    View,
}

impl fmt::Display for AutocastMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Op => "op",
            Self::View => "view",
        })
    }
}

impl FromStr for AutocastMode {
    type Err = PrecisionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "op" => Ok(Self::Op),
            "view" => Ok(Self::View),
            _ => Err(PrecisionError::InvalidSetting {
                field: "autocast",
                value: s.to_string(),
                expected: "one of: auto, op, view".into(),
            }),
        }
    }
}
