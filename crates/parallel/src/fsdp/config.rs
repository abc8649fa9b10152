//! FSDP settings ([`FsdpConfig`], the `[fsdp]` table of a config file): what is sharded
//! ([`ShardingStrategy`]), which modules are units ([`AutoWrapPolicy`]) and what a save writes
//! ([`StateDictType`]). Each parses from the strings Accelerate and Lightning use.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_with::{DeserializeFromStr, SerializeDisplay};

use crate::{ParallelError, spellings};

/// FSDP settings: Accelerate's `fsdp_config` section, as a `[fsdp]` table (unknown keys are
/// errors; missing ones take the defaults). Each field's doc comment is the description
/// `--help` shows for the option.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, documented::DocumentedFields,
)]
#[serde(default, deny_unknown_fields)]
pub struct FsdpConfig {
    /// What is sharded: "full" (default; ZeRO-3, `FULL_SHARD`), "grad-op" (ZeRO-2,
    /// `SHARD_GRAD_OP`: parameters stay replicated) or "none" (`NO_SHARD`: plain DDP, which
    /// [`Ddp`](crate::Ddp) is).
    pub sharding_strategy: ShardingStrategy,
    /// Which modules are units, each gathered with one collective: "none" (default: the
    /// whole model is one unit), module type names separated by commas (e.g.
    /// "TransformerEncoderLayer"), or `"size:<min parameters>"`.
    pub auto_wrap_policy: AutoWrapPolicy,
    /// What a saved training state holds: "sharded" (default; one part per rank, loads at the
    /// same world size) or "full" (gathered; rank 0 writes an ordinary state that loads at
    /// any world size and without FSDP).
    pub state_dict_type: StateDictType,
}

/// What an FSDP save writes.
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
    strum::EnumIter,
    strum::EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = ParallelError,
    parse_err_fn = StateDictType::unknown
)]
pub enum StateDictType {
    /// Every rank writes its own shards (`SHARDED_STATE_DICT`).
    #[default]
    #[strum(to_string = "sharded", serialize = "SHARDED_STATE_DICT")]
    Sharded,
    /// Rank 0 writes the gathered parameters and optimizer state (`FULL_STATE_DICT`).
    #[strum(to_string = "full", serialize = "FULL_STATE_DICT")]
    Full,
}

impl StateDictType {
    fn unknown(given: &str) -> ParallelError {
        ParallelError::InvalidConfig {
            field: "fsdp.state_dict_type",
            value: given.into(),
            expected: format!("one of: {}", spellings::<Self>()),
        }
    }
}

/// What each rank keeps only a shard of.
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
    strum::EnumIter,
    strum::EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = ParallelError,
    parse_err_fn = ShardingStrategy::unknown
)]
pub enum ShardingStrategy {
    /// Parameters, gradients and optimizer state sharded (ZeRO-3, PyTorch `FULL_SHARD`):
    /// a unit's parameters are gathered when the forward pass first reads them.
    #[default]
    #[strum(
        to_string = "full",
        serialize = "FULL_SHARD",
        serialize = "full-shard",
        serialize = "1"
    )]
    Full,
    /// Gradients and optimizer state sharded, parameters replicated (ZeRO-2,
    /// `SHARD_GRAD_OP`): one gather per unit after each optimizer step, none in the forward.
    #[strum(
        to_string = "grad-op",
        serialize = "grad_op",
        serialize = "SHARD_GRAD_OP",
        serialize = "shard-grad-op",
        serialize = "2"
    )]
    GradOp,
    /// Nothing sharded (`NO_SHARD`): plain DDP.
    #[strum(
        to_string = "none",
        serialize = "NO_SHARD",
        serialize = "no-shard",
        serialize = "3"
    )]
    NoShard,
}

impl ShardingStrategy {
    fn unknown(given: &str) -> ParallelError {
        ParallelError::InvalidConfig {
            field: "fsdp.sharding_strategy",
            value: given.into(),
            expected: format!("one of: {}", spellings::<Self>()),
        }
    }
}

/// Which modules become FSDP units: each unit's parameters are gathered together, with one
/// collective. Parameters outside every unit form the root unit.
#[derive(Debug, Clone, PartialEq, Eq, Default, SerializeDisplay, DeserializeFromStr)]
pub enum AutoWrapPolicy {
    /// One unit: the whole model (PyTorch's default without an auto-wrap policy).
    #[default]
    None,
    /// Each module whose struct type has one of these names is a unit (Lightning's
    /// `auto_wrap_policy={Block}`, Accelerate's `transformer_layer_cls_to_wrap`), e.g.
    /// `"TransformerEncoderLayer"`; a listed module inside another listed one is a unit of its
    /// own. Written as a comma-separated list.
    Modules(Vec<String>),
    /// Deepest modules first, a module whose not-yet-wrapped parameters number at least this
    /// many becomes a unit (PyTorch's `size_based_auto_wrap_policy`). Written `size:<n>`.
    Size(usize),
}

impl fmt::Display for AutoWrapPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Modules(names) => f.write_str(&names.join(",")),
            Self::Size(n) => write!(f, "size:{n}"),
        }
    }
}

impl FromStr for AutoWrapPolicy {
    type Err = ParallelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ParallelError::InvalidConfig {
            field: "fsdp.auto_wrap_policy",
            value: s.to_string(),
            expected: "none, size:<min parameters> (a number > 0), or module type names \
                       separated by commas (e.g. TransformerEncoderLayer)"
                .into(),
        };
        let text = s.trim();
        if text.is_empty() || text.eq_ignore_ascii_case("none") {
            return Ok(Self::None);
        }
        if let Some(n) = text.strip_prefix("size:") {
            return match n.trim().replace('_', "").parse::<usize>() {
                Ok(n) if n > 0 => Ok(Self::Size(n)),
                _ => Err(invalid()),
            };
        }
        let names: Vec<String> = text.split(',').map(|n| n.trim().to_string()).collect();
        let valid = |n: &String| {
            n.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && n.chars().all(|c| c.is_alphanumeric() || c == '_')
        };
        if names.iter().all(valid) {
            Ok(Self::Modules(names))
        } else {
            Err(invalid())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_spellings_and_names_typos() {
        assert_eq!(
            "FULL_SHARD".parse::<ShardingStrategy>(),
            Ok(ShardingStrategy::Full)
        );
        assert_eq!(
            "grad-op".parse::<ShardingStrategy>(),
            Ok(ShardingStrategy::GradOp)
        );
        assert_eq!(
            "NO_SHARD".parse::<ShardingStrategy>(),
            Ok(ShardingStrategy::NoShard)
        );
        let err = "fully".parse::<ShardingStrategy>().unwrap_err().to_string();
        assert!(err.contains("fully") && err.contains("grad-op"), "{err}");

        assert_eq!("none".parse::<AutoWrapPolicy>(), Ok(AutoWrapPolicy::None));
        assert_eq!(
            "size:1_000".parse::<AutoWrapPolicy>(),
            Ok(AutoWrapPolicy::Size(1000))
        );
        assert_eq!(
            "Block, Mlp".parse::<AutoWrapPolicy>(),
            Ok(AutoWrapPolicy::Modules(vec!["Block".into(), "Mlp".into()]))
        );
        for bad in ["size:0", "size:x", "Block,", "a.b"] {
            let err = bad.parse::<AutoWrapPolicy>().unwrap_err().to_string();
            assert!(err.contains("fsdp.auto_wrap_policy"), "{bad}: {err}");
        }
        for policy in [
            AutoWrapPolicy::Size(7),
            AutoWrapPolicy::Modules(vec!["A".into()]),
        ] {
            assert_eq!(policy.to_string().parse::<AutoWrapPolicy>(), Ok(policy));
        }
    }
}
