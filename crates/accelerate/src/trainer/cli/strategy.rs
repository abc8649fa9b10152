//! The strategies' options on the command line, `--<strategy>.<option> value`: the strategy's
//! name in any of its spellings, the options given applied to the chosen strategy's table,
//! and what is wrong with an option clap does not know.

use serde_json::{Map, Value};

use afterburner_accelerator::suggest::nearest;

use crate::{AccelerateError, StrategyConfig};

/// `token` with the strategy of a `--<strategy>.<option>` written by its list name
/// (`--localsgd.local-sgd-steps` → `--local-sgd.local-sgd-steps`): the command knows each
/// option under the list name, and `--strategy` takes every spelling of it.
pub(super) fn spelled_by_list_name(token: String) -> String {
    let Some(option) = token.strip_prefix("--") else {
        return token;
    };
    let name = option.split_once('=').map_or(option, |(name, _)| name);
    let Some((strategy, rest)) = option.split_once('.').filter(|_| name.contains('.')) else {
        return token;
    };
    match StrategyConfig::from_name(strategy) {
        Ok(config) if config.name() != strategy => format!("--{}.{rest}", config.name()),
        _ => token,
    }
}

/// Why `--<strategy>.<option>` (`typed`, without the dashes) is no option: the strategy is
/// unknown, takes no options, or has no option of that name (the nearest one suggested).
pub(super) fn unknown_option(typed: &str) -> AccelerateError {
    let (strategy, option) = typed.split_once('.').unwrap_or((typed, ""));
    let typed_as = format!("--{typed}");
    let named = match StrategyConfig::from_name(strategy) {
        Ok(named) => named,
        Err(AccelerateError::InvalidArgument { reason, .. }) => {
            return AccelerateError::InvalidArgument {
                key: typed_as,
                reason,
            };
        }
        Err(other) => return other,
    };
    let Some(defaults) = named.options() else {
        return AccelerateError::InvalidArgument {
            key: typed_as,
            reason: format!("no option: strategy {} takes none", named.name()),
        };
    };
    let near = nearest(option, defaults.keys().map(String::as_str));
    let known = defaults.keys().map(|k| k.replace('_', "-"));
    let hint = near.map_or(String::new(), |n| format!(" (did you mean {n}?)"));
    AccelerateError::InvalidArgument {
        key: typed_as,
        reason: format!(
            "strategy {} has no option {option}{hint}; its options: {}",
            named.name(),
            known.collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The `--<strategy>.<option>` values given, by strategy: applied to the chosen strategy's
/// options table once the file and the other options are merged.
#[derive(Default)]
pub(super) struct StrategyOptions {
    /// `(strategy's list name, option as typed, key, value)`, in order given.
    given: Vec<(String, String, String, Value)>,
}

impl StrategyOptions {
    /// Records the option `key` of `strategy`, typed as `typed_as`, set to `value`.
    pub(super) fn set(&mut self, strategy: &str, typed_as: String, key: &str, value: Value) {
        self.given
            .push((strategy.to_string(), typed_as, key.to_string(), value));
    }

    /// Keeps the file's options table when the command line names the same strategy with
    /// `--strategy` alone (`--strategy diloco` over a file's `[strategy.diloco]`).
    pub(super) fn keep_file_options(
        merged: &Map<String, Value>,
        overrides: &mut Map<String, Value>,
    ) {
        let name_of = |v: &Value| {
            StrategyConfig::from_value(v.clone())
                .ok()
                .map(|c| c.name().to_string())
        };
        if let (Some(file @ Value::Object(_)), Some(given @ Value::String(_))) =
            (merged.get("strategy"), overrides.get("strategy"))
            && let Some(name) = name_of(file)
            && Some(name) == name_of(given)
        {
            overrides.remove("strategy");
        }
    }

    /// Writes the recorded options into the merged arguments' strategy table; errors when an
    /// option belongs to another strategy than the one chosen.
    pub(super) fn apply(self, merged: &mut Map<String, Value>) -> Result<(), AccelerateError> {
        let Some((_, first_typed, _, _)) = self.given.first() else {
            return Ok(());
        };
        let chosen = merged
            .get("strategy")
            .cloned()
            .map(StrategyConfig::from_value)
            .transpose()
            .map_err(|e| AccelerateError::argument(first_typed, e, "a valid --strategy"))?
            .unwrap_or_default();
        let mut options = chosen.options().unwrap_or_default();
        for (strategy, typed_as, key, value) in self.given {
            if strategy != chosen.name() {
                return Err(AccelerateError::InvalidArgument {
                    key: typed_as,
                    reason: format!(
                        "an option of strategy {strategy}, but the strategy is {} \
                         (give --strategy {strategy})",
                        chosen.name()
                    ),
                });
            }
            options.insert(key, value);
        }
        let mut table = Map::new();
        table.insert(chosen.name().to_string(), Value::Object(options));
        merged.insert("strategy".into(), Value::Object(table));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strategy_option_is_spelled_by_the_strategys_list_name() {
        let spelled = |token: &str| spelled_by_list_name(token.to_string());
        assert_eq!(
            spelled("--localsgd.local-sgd-steps"),
            "--local-sgd.local-sgd-steps"
        );
        assert_eq!(spelled("--DiLoCo.sync_every=3"), "--diloco.sync_every=3");
        assert_eq!(spelled("--diloco.sync-every"), "--diloco.sync-every");
        assert_eq!(spelled("--output-dir=a.b"), "--output-dir=a.b");
        assert_eq!(spelled("--nothing.x"), "--nothing.x");
        assert_eq!(spelled("a.b"), "a.b");
    }
}
