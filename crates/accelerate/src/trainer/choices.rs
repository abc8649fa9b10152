//! The string-valued choices of `TrainingArguments`: when events happen, how the loss is
//! normalised, which learning-rate schedule, which optimizer. Each variant's spellings are
//! written once, in its `strum` attribute (`to_string` the one printed): parsing (any case),
//! printing, the error's list of values and the command line's values (`--help`, its
//! errors) all read them.

use clap::builder::PossibleValue;
use serde_with::{DeserializeFromStr, SerializeDisplay};
use strum::{EnumIter, EnumMessage, EnumString, IntoEnumIterator};

/// A string that is none of a setting's values.
#[derive(Debug, thiserror::Error)]
#[error("'{given}' is not one of: {valid}")]
pub struct UnknownValue {
    given: String,
    valid: String,
}

impl UnknownValue {
    /// The error for `given`, listing `valid` (as [`listed`] writes them).
    pub(super) fn new(given: impl Into<String>, valid: impl Into<String>) -> Self {
        Self {
            given: given.into(),
            valid: valid.into(),
        }
    }

    /// The error for `given`, listing `E`'s values.
    fn of<E: Spelled>(given: &str) -> Self {
        Self::new(given, E::values())
    }
}

/// A choice whose variants list their spellings.
pub(super) trait Spelled: IntoEnumIterator + EnumMessage + std::fmt::Display {
    /// Every value as the command line takes it: the printed name, the other spellings as
    /// aliases (`adamw`, also `adamw_torch`).
    fn possible_values() -> Vec<PossibleValue> {
        let each = Self::iter().map(|value| {
            let printed = value.to_string();
            let others = value.get_serializations().iter().copied();
            let others: Vec<&'static str> = others.filter(|name| *name != printed).collect();
            PossibleValue::new(printed).aliases(others)
        });
        each.collect()
    }

    /// Every value as printed, its other spellings in parentheses: `adamw (adamw_torch), sgd`.
    fn values() -> String {
        listed(&Self::possible_values())
    }
}

/// `values` as errors list them: each name, its other spellings in parentheses.
pub(super) fn listed(values: &[PossibleValue]) -> String {
    let each = values.iter().map(|value| {
        let mut names = value.get_name_and_aliases();
        let printed = names.next().unwrap_or_default();
        let others: Vec<&str> = names.collect();
        match others.is_empty() {
            true => printed.to_string(),
            false => format!("{printed} ({})", others.join(", ")),
        }
    });
    each.collect::<Vec<_>>().join(", ")
}

impl<E: IntoEnumIterator + EnumMessage + std::fmt::Display> Spelled for E {}

/// When something (evaluation, logging, saving) happens, as in HF.
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
    EnumString,
    EnumIter,
    EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = UnknownValue,
    parse_err_fn = UnknownValue::of::<Self>
)]
pub enum IntervalStrategy {
    /// Never.
    #[default]
    #[strum(to_string = "no")]
    No,
    /// Every N optimizer steps.
    #[strum(to_string = "steps")]
    Steps,
    /// At the end of every epoch.
    #[strum(to_string = "epoch")]
    Epoch,
}

/// How the loss is normalised over an accumulation cycle.
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
    EnumString,
    EnumIter,
    EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = UnknownValue,
    parse_err_fn = UnknownValue::of::<Self>
)]
pub enum LossNormalization {
    /// The mean of the micro-batches' mean losses.
    #[default]
    #[strum(to_string = "batch-mean", serialize = "batch_mean")]
    BatchMean,
    /// The cycle's summed loss divided by its number of items, across ranks.
    #[strum(to_string = "per-item", serialize = "per_item")]
    PerItem,
}

/// The learning-rate schedule, with HF's formulas (see [`HfSchedule`](super::HfSchedule)).
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
    EnumString,
    EnumIter,
    EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = UnknownValue,
    parse_err_fn = UnknownValue::of::<Self>
)]
pub enum SchedulerType {
    /// Linear warmup from 0, then linear decay to 0 at the last step.
    #[default]
    #[strum(to_string = "linear")]
    Linear,
    /// Linear warmup, then half a cosine down to 0 at the last step.
    #[strum(to_string = "cosine")]
    Cosine,
    /// The same learning rate throughout (no warmup).
    #[strum(to_string = "constant")]
    Constant,
    /// Linear warmup, then constant.
    #[strum(to_string = "constant_with_warmup", serialize = "constant-with-warmup")]
    ConstantWithWarmup,
}

/// The optimizer `Trainer::new` builds (HF's `optim`); for any other, hand yours to
/// [`Trainer::with_optimizers`](super::Trainer::with_optimizers).
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
    EnumString,
    EnumIter,
    EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = UnknownValue,
    parse_err_fn = UnknownValue::of::<Self>
)]
pub enum OptimizerType {
    /// AdamW (decoupled weight decay): "adamw", HF's "adamw_torch" (the default).
    #[default]
    #[strum(
        to_string = "adamw",
        serialize = "adamw_torch",
        serialize = "adamw-torch"
    )]
    AdamW,
    /// Adam, `weight_decay` as an L2 penalty on the gradient (torch.optim.Adam's): "adam".
    #[strum(to_string = "adam")]
    Adam,
    /// Plain SGD, `weight_decay` as an L2 penalty: "sgd".
    #[strum(to_string = "sgd")]
    Sgd,
}

/// Where the Trainer reports its logs besides `log.jsonl` (HF's `report_to`).
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
    EnumString,
    EnumIter,
    EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = UnknownValue,
    parse_err_fn = UnknownValue::of::<Self>
)]
pub enum ReportTo {
    /// Nowhere else.
    #[default]
    #[strum(to_string = "none")]
    None,
    /// TensorBoard event files in `logging_dir`.
    #[strum(to_string = "tensorboard")]
    TensorBoard,
    /// Every integration there is (TensorBoard).
    #[strum(to_string = "all")]
    All,
}

impl ReportTo {
    /// Whether TensorBoard event files are written.
    pub fn tensorboard(self) -> bool {
        matches!(self, Self::TensorBoard | Self::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_parses_and_the_first_prints() {
        fn check<E: Spelled + std::str::FromStr + PartialEq + Copy>() {
            for value in E::iter() {
                let names = value.get_serializations();
                assert!(names.contains(&value.to_string().as_str()), "{names:?}");
                for name in names {
                    let upper = name.to_ascii_uppercase();
                    assert!(matches!(upper.parse::<E>(), Ok(v) if v == value), "{name}");
                }
            }
        }
        check::<IntervalStrategy>();
        check::<LossNormalization>();
        check::<SchedulerType>();
        check::<OptimizerType>();
        check::<ReportTo>();
        let err = "adam_w".parse::<OptimizerType>().unwrap_err().to_string();
        assert_eq!(
            err,
            "'adam_w' is not one of: adamw (adamw_torch, adamw-torch), adam, sgd"
        );
    }
}
