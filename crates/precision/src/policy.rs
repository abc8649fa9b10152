//! The precision policy and the one place where user spellings become a policy.

use core::fmt;
use core::str::FromStr;

use burn::tensor::DType;
use burn::tensor::backend::Backend;
use serde_with::{DeserializeFromStr, SerializeDisplay};

use crate::PrecisionError;

/// How a model trains: which dtype holds the parameters and which runs the heavy math.
///
/// | policy        | parameters + optimizer state | matmul / conv / attention | loss scaling |
/// |---------------|------------------------------|---------------------------|--------------|
/// | `32-true`     | f32                          | f32                       | no           |
/// | `bf16-mixed`  | f32 (master weights)         | bf16                      | no           |
/// | `16-mixed`    | f32 (master weights)         | f16                       | [`GradScaler`](crate::GradScaler) |
/// | `bf16-true`   | bf16                         | bf16                      | no           |
/// | `16-true`     | f16                          | f16                       | no           |
///
/// Parsed from Lightning's strings (`"32"`, `"bf16"`, `"16"` are accepted as in Lightning) or
/// from HF's flags with [`Precision::from_flags`]. Serialised as its canonical string.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, SerializeDisplay, DeserializeFromStr,
)]
pub enum Precision {
    /// Everything in f32 (the default).
    #[default]
    Full32,
    /// f32 master weights, bf16 compute.
    Bf16Mixed,
    /// f32 master weights, f16 compute, dynamic loss scaling.
    F16Mixed,
    /// Parameters, optimizer state and compute in bf16.
    Bf16True,
    /// Parameters, optimizer state and compute in f16.
    F16True,
}

/// Accepted spellings, canonical one first for each policy.
const SPELLINGS: &[(&str, Precision)] = &[
    ("32-true", Precision::Full32),
    ("32", Precision::Full32),
    ("bf16-mixed", Precision::Bf16Mixed),
    ("bf16", Precision::Bf16Mixed),
    ("16-mixed", Precision::F16Mixed),
    ("16", Precision::F16Mixed),
    ("bf16-true", Precision::Bf16True),
    ("16-true", Precision::F16True),
];

impl Precision {
    /// Every policy, in table order.
    pub const ALL: [Precision; 5] = [
        Precision::Full32,
        Precision::Bf16Mixed,
        Precision::F16Mixed,
        Precision::Bf16True,
        Precision::F16True,
    ];

    /// From HF `TrainingArguments`-style flags: `bf16` -> `bf16-mixed`, `fp16` -> `16-mixed`,
    /// neither -> `32-true`; both is an error.
    pub fn from_flags(bf16: bool, fp16: bool) -> Result<Self, PrecisionError> {
        match (bf16, fp16) {
            (true, true) => Err(PrecisionError::ConflictingFlags),
            (true, false) => Ok(Self::Bf16Mixed),
            (false, true) => Ok(Self::F16Mixed),
            (false, false) => Ok(Self::Full32),
        }
    }

    /// The canonical (Lightning) spelling.
    pub fn as_str(self) -> &'static str {
        SPELLINGS
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(s, _)| *s)
            .unwrap_or("32-true")
    }

    /// The dtype the parameters and optimizer state are kept in.
    pub fn param_dtype(self) -> DType {
        match self {
            Self::Full32 | Self::Bf16Mixed | Self::F16Mixed => DType::F32,
            Self::Bf16True => DType::BF16,
            Self::F16True => DType::F16,
        }
    }

    /// The dtype matmul, conv and attention run in.
    pub fn compute_dtype(self) -> DType {
        match self {
            Self::Full32 => DType::F32,
            Self::Bf16Mixed | Self::Bf16True => DType::BF16,
            Self::F16Mixed | Self::F16True => DType::F16,
        }
    }

    /// True for the mixed policies (f32 master weights, half compute).
    pub fn is_mixed(self) -> bool {
        self.param_dtype() != self.compute_dtype()
    }

    /// True when the policy needs dynamic loss scaling (`16-mixed`).
    pub fn needs_loss_scaling(self) -> bool {
        self == Self::F16Mixed
    }

    /// Checks that backend `B` can run this policy's dtypes on `device`.
    ///
    /// An error rather than a silent f32 run: a run reported as bf16 must compute in bf16.
    pub fn check_backend<B: Backend>(self, device: &B::Device) -> Result<(), PrecisionError> {
        let dtype = self.compute_dtype();
        if B::supports_dtype(device, dtype) {
            Ok(())
        } else {
            Err(PrecisionError::UnsupportedDtype {
                precision: self.to_string(),
                dtype,
                backend: B::name(device),
            })
        }
    }
}

impl Precision {
    /// Whether this precision computes in a half dtype that backend `B` only emulates
    /// (Burn's CPU backends `flex` and `ndarray` convert every half op to f32 and back), so the
    /// run is slower than 32-true, not faster (as Lightning warns for 16-mixed on the CPU).
    pub fn is_emulated_on<B: Backend>(self, device: &B::Device) -> bool {
        let half = matches!(self.compute_dtype(), DType::BF16 | DType::F16);
        let name = B::name(device).to_ascii_lowercase();
        half && ["flex", "ndarray"].iter().any(|cpu| name.contains(cpu))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = PrecisionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        SPELLINGS
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|(_, p)| *p)
            .ok_or_else(|| PrecisionError::UnknownPrecision {
                given: s.to_string(),
                valid: SPELLINGS
                    .iter()
                    .map(|(n, _)| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precisions_are_emulated_on_the_cpu_backends() {
        use burn::backend::{Autodiff, Flex};
        let device = Default::default();
        for p in [
            Precision::Bf16Mixed,
            Precision::F16Mixed,
            Precision::Bf16True,
        ] {
            assert!(p.is_emulated_on::<Autodiff<Flex>>(&device), "{p}");
        }
        assert!(!Precision::Full32.is_emulated_on::<Autodiff<Flex>>(&device));
    }

    #[test]
    fn parses_lightning_spellings() {
        assert_eq!("32-true".parse::<Precision>().unwrap(), Precision::Full32);
        assert_eq!("32".parse::<Precision>().unwrap(), Precision::Full32);
        assert_eq!(
            "BF16-Mixed".parse::<Precision>().unwrap(),
            Precision::Bf16Mixed
        );
        assert_eq!(
            "16-mixed".parse::<Precision>().unwrap(),
            Precision::F16Mixed
        );
        assert_eq!(
            "bf16-true".parse::<Precision>().unwrap(),
            Precision::Bf16True
        );
        assert_eq!("16-true".parse::<Precision>().unwrap(), Precision::F16True);
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>().unwrap(), p);
        }
    }

    #[test]
    fn typo_lists_valid_values() {
        let err = "bf16-mixd".parse::<Precision>().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("bf16-mixd"), "{msg}");
        assert!(
            msg.contains("\"bf16-mixed\"") && msg.contains("\"16-true\""),
            "{msg}"
        );
    }

    #[test]
    fn hf_flags() {
        assert_eq!(
            Precision::from_flags(true, false).unwrap(),
            Precision::Bf16Mixed
        );
        assert_eq!(
            Precision::from_flags(false, true).unwrap(),
            Precision::F16Mixed
        );
        assert_eq!(
            Precision::from_flags(false, false).unwrap(),
            Precision::Full32
        );
        assert_eq!(
            Precision::from_flags(true, true).unwrap_err(),
            PrecisionError::ConflictingFlags
        );
    }

    #[test]
    fn dtypes_per_policy() {
        assert!(Precision::Bf16Mixed.is_mixed());
        assert!(!Precision::Bf16True.is_mixed());
        assert_eq!(Precision::Bf16True.param_dtype(), DType::BF16);
        assert_eq!(Precision::F16Mixed.param_dtype(), DType::F32);
        assert!(Precision::F16Mixed.needs_loss_scaling());
        assert!(!Precision::Bf16Mixed.needs_loss_scaling());
    }
}
