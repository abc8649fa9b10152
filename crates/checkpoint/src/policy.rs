//! Which wrapped blocks a forward pass checkpoints.

use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};
use serde_with::SerializeDisplay;

use crate::CheckpointError;

/// What a [`Checkpointed`](crate::Checkpointed) wrapper holds, which decides the policies that
/// recompute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockKind {
    /// A whole block (a transformer layer, a residual stage): recomputed under `all` and
    /// `every-<k>`.
    #[default]
    Block,
    /// A part that is cheap to recompute and costly to keep: norms, activations, softmax and
    /// other elementwise chains. Recomputed under `all` and `selective`.
    Cheap,
}

/// The activation-checkpointing policy.
///
/// Parsed from (and written as) a string: `"none"`, `"all"`, `"every-<k>"`, `"selective"`,
/// `"balanced"`; a config may also give `true` (= `all`) or `false` (= `none`), like HF's
/// `gradient_checkpointing` flag.
///
/// ```
/// use afterburner_checkpoint::CheckpointPolicy;
/// let p: CheckpointPolicy = "every-2".parse().unwrap();
/// assert_eq!(p.to_string(), "every-2");
/// assert!("every-0".parse::<CheckpointPolicy>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, SerializeDisplay)]
pub enum CheckpointPolicy {
    /// Nothing is recomputed: every activation is kept (the default of the Accelerator).
    #[default]
    None,
    /// Every wrapped block is recomputed (`torch.utils.checkpoint` on every block; HF's
    /// `gradient_checkpointing_enable()`).
    All,
    /// Blocks 0, k, 2k, ... of each forward pass are recomputed ([`BlockKind::Block`] only).
    EveryKth(NonZeroUsize),
    /// Keep what is costly to recompute: only [`BlockKind::Cheap`] parts (norms, activations,
    /// softmax) are recomputed; matmul and conv outputs stay saved.
    Selective,
    /// Burn's own `BalancedCheckpointing`: the backend recomputes the elementwise ops it marks
    /// memory-bound, op by op. Chosen by the backend type ([`Balanced`](crate::Balanced));
    /// wrappers run plain under it.
    Balanced,
}

impl CheckpointPolicy {
    /// Whether a wrapper of `kind` that is the `block_index`-th [`BlockKind::Block`] of this
    /// forward pass is recomputed.
    pub fn checkpoints(&self, kind: BlockKind, block_index: usize) -> bool {
        match self {
            Self::None | Self::Balanced => false,
            Self::All => true,
            Self::EveryKth(k) => kind == BlockKind::Block && block_index.is_multiple_of(k.get()),
            Self::Selective => kind == BlockKind::Cheap,
        }
    }

    /// Whether any wrapper is ever recomputed under this policy.
    pub fn is_active(&self) -> bool {
        !matches!(self, Self::None | Self::Balanced)
    }
}

impl fmt::Display for CheckpointPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::All => f.write_str("all"),
            Self::EveryKth(k) => write!(f, "every-{k}"),
            Self::Selective => f.write_str("selective"),
            Self::Balanced => f.write_str("balanced"),
        }
    }
}

impl FromStr for CheckpointPolicy {
    type Err = CheckpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let given = s.trim().to_ascii_lowercase();
        let unknown = || CheckpointError::UnknownPolicy {
            given: s.to_string(),
        };
        match given.as_str() {
            "none" | "off" | "false" => Ok(Self::None),
            "all" | "every-block" | "full" | "true" => Ok(Self::All),
            "selective" => Ok(Self::Selective),
            "balanced" => Ok(Self::Balanced),
            other => {
                let k = other.strip_prefix("every-").ok_or_else(unknown)?;
                let k: usize = k.parse().map_err(|_| unknown())?;
                NonZeroUsize::new(k).map(Self::EveryKth).ok_or_else(unknown)
            }
        }
    }
}

impl From<bool> for CheckpointPolicy {
    fn from(on: bool) -> Self {
        if on { Self::All } else { Self::None }
    }
}

impl<'de> Deserialize<'de> for CheckpointPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Flag(bool),
            Name(String),
        }
        match Given::deserialize(deserializer)? {
            Given::Flag(on) => Ok(on.into()),
            Given::Name(name) => name.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_round_trips() {
        for (text, canonical) in [
            ("none", "none"),
            ("false", "none"),
            ("ALL", "all"),
            ("every-block", "all"),
            ("every-3", "every-3"),
            ("selective", "selective"),
            ("balanced", "balanced"),
        ] {
            let p: CheckpointPolicy = text.parse().unwrap();
            assert_eq!(p.to_string(), canonical);
            assert_eq!(p.to_string().parse::<CheckpointPolicy>().unwrap(), p);
        }
    }

    #[test]
    fn rejects_bad_spellings_naming_the_value() {
        for bad in ["every-0", "every-x", "sometimes", "every-"] {
            let err = bad.parse::<CheckpointPolicy>().unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
            assert!(err.to_string().contains("selective"), "{err}");
        }
    }

    #[test]
    fn serde_accepts_flags_and_names() {
        let p: CheckpointPolicy = serde_json::from_str("true").unwrap();
        assert_eq!(p, CheckpointPolicy::All);
        let p: CheckpointPolicy = serde_json::from_str("\"every-2\"").unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"every-2\"");
        assert!(serde_json::from_str::<CheckpointPolicy>("\"evry-2\"").is_err());
    }

    #[test]
    fn decisions_follow_the_policy() {
        use BlockKind::*;
        let every2 = CheckpointPolicy::EveryKth(NonZeroUsize::new(2).unwrap());
        let picked: Vec<bool> = (0..4).map(|i| every2.checkpoints(Block, i)).collect();
        assert_eq!(picked, [true, false, true, false]);
        assert!(!every2.checkpoints(Cheap, 0));
        assert!(CheckpointPolicy::Selective.checkpoints(Cheap, 5));
        assert!(!CheckpointPolicy::Selective.checkpoints(Block, 0));
        assert!(CheckpointPolicy::All.checkpoints(Cheap, 1));
        assert!(!CheckpointPolicy::None.checkpoints(Block, 0));
        assert!(!CheckpointPolicy::Balanced.checkpoints(Block, 0));
    }
}
