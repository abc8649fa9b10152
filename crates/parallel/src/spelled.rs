//! Settings spelled once: a string-valued setting is an enum whose `strum` attributes list
//! every spelling of each value (`to_string` the one printed); parsing (any case), printing
//! and the error's list of allowed values all read them.

use std::fmt::Display;

use strum::{EnumMessage, IntoEnumIterator};

/// Every value of `E` as printed, its other spellings in parentheses:
/// `full (FULL_SHARD, 1), grad-op (grad_op, SHARD_GRAD_OP, 2)`.
pub fn spellings<E: IntoEnumIterator + EnumMessage + Display>() -> String {
    let each = E::iter().map(|value| {
        let printed = value.to_string();
        let others: Vec<&str> = value
            .get_serializations()
            .iter()
            .copied()
            .filter(|name| *name != printed)
            .collect();
        match others.is_empty() {
            true => printed,
            false => format!("{printed} ({})", others.join(", ")),
        }
    });
    each.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use strum::{EnumMessage, IntoEnumIterator};

    use super::spellings;
    use crate::{ShardingStrategy, StateDictType};

    /// Every spelling parses (in any case) to its value, which prints as its first spelling
    /// and parses back; an unknown one is an error listing every spelling.
    #[test]
    fn every_spelling_parses_prints_and_is_listed_in_the_error() {
        for value in ShardingStrategy::iter() {
            for name in value.get_serializations() {
                assert_eq!(ShardingStrategy::from_str(name).unwrap(), value, "{name}");
                let upper = name.to_ascii_uppercase();
                assert_eq!(
                    ShardingStrategy::from_str(&upper).unwrap(),
                    value,
                    "{upper}"
                );
            }
            assert_eq!(
                ShardingStrategy::from_str(&value.to_string()).unwrap(),
                value
            );
        }
        assert_eq!(ShardingStrategy::GradOp.to_string(), "grad-op");
        let err = ShardingStrategy::from_str("half").unwrap_err().to_string();
        assert!(
            err.contains("fsdp.sharding_strategy") && err.contains("half"),
            "{err}"
        );
        assert!(err.contains(&spellings::<ShardingStrategy>()), "{err}");
        assert!(err.contains("grad-op (grad_op, SHARD_GRAD_OP"), "{err}");
        assert_eq!(
            spellings::<StateDictType>(),
            "sharded (SHARDED_STATE_DICT), full (FULL_STATE_DICT)"
        );
    }
}
