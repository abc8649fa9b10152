//! The string-valued choices of `TrainingArguments`: when events happen, how the loss is
//! normalised, which learning-rate schedule; each parses HF's spellings.

use std::fmt;
use std::str::FromStr;

use serde_with::{DeserializeFromStr, SerializeDisplay};

/// When something (evaluation, logging, saving) happens, as in HF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum IntervalStrategy {
    /// Never.
    #[default]
    No,
    /// Every N optimizer steps.
    Steps,
    /// At the end of every epoch.
    Epoch,
}

impl fmt::Display for IntervalStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::No => "no",
            Self::Steps => "steps",
            Self::Epoch => "epoch",
        })
    }
}

/// A string that is none of a setting's values.
#[derive(Debug, thiserror::Error)]
#[error("'{given}' is not one of: {valid}")]
pub struct UnknownValue {
    given: String,
    valid: &'static str,
}

impl FromStr for IntervalStrategy {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "no" => Ok(Self::No),
            "steps" => Ok(Self::Steps),
            "epoch" => Ok(Self::Epoch),
            _ => Err(UnknownValue {
                given: s.into(),
                valid: "no, steps, epoch",
            }),
        }
    }
}

/// How the loss is normalised over an accumulation cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum LossNormalization {
    /// The mean of the micro-batches' mean losses.
    #[default]
    BatchMean,
    /// The cycle's summed loss divided by its number of items, across ranks.
    PerItem,
}

impl fmt::Display for LossNormalization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BatchMean => "batch-mean",
            Self::PerItem => "per-item",
        })
    }
}

impl FromStr for LossNormalization {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "batch-mean" => Ok(Self::BatchMean),
            "per-item" => Ok(Self::PerItem),
            _ => Err(UnknownValue {
                given: s.into(),
                valid: "batch-mean, per-item",
            }),
        }
    }
}

/// The learning-rate schedule, with HF's formulas (see [`HfSchedule`](super::HfSchedule)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum SchedulerType {
    /// Linear warmup from 0, then linear decay to 0 at the last step.
    #[default]
    Linear,
    /// Linear warmup, then half a cosine down to 0 at the last step.
    Cosine,
    /// The same learning rate throughout (no warmup).
    Constant,
    /// Linear warmup, then constant.
    ConstantWithWarmup,
}

impl fmt::Display for SchedulerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Linear => "linear",
            Self::Cosine => "cosine",
            Self::Constant => "constant",
            Self::ConstantWithWarmup => "constant_with_warmup",
        })
    }
}

impl FromStr for SchedulerType {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "linear" => Ok(Self::Linear),
            "cosine" => Ok(Self::Cosine),
            "constant" => Ok(Self::Constant),
            "constant_with_warmup" => Ok(Self::ConstantWithWarmup),
            _ => Err(UnknownValue {
                given: s.into(),
                valid: "linear, cosine, constant, constant_with_warmup",
            }),
        }
    }
}

/// The optimizer `Trainer::new` builds (HF's `optim`); for any other, hand yours to
/// [`Trainer::with_optimizers`](super::Trainer::with_optimizers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum OptimizerType {
    /// AdamW (decoupled weight decay): "adamw", HF's "adamw_torch" (the default).
    #[default]
    AdamW,
    /// Adam, `weight_decay` as an L2 penalty on the gradient (torch.optim.Adam's): "adam".
    Adam,
    /// Plain SGD, `weight_decay` as an L2 penalty: "sgd".
    Sgd,
}

impl fmt::Display for OptimizerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AdamW => "adamw",
            Self::Adam => "adam",
            Self::Sgd => "sgd",
        })
    }
}

impl FromStr for OptimizerType {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "adamw" | "adamw_torch" => Ok(Self::AdamW),
            "adam" => Ok(Self::Adam),
            "sgd" => Ok(Self::Sgd),
            _ => Err(UnknownValue {
                given: s.into(),
                valid: "adamw (adamw_torch), adam, sgd",
            }),
        }
    }
}
