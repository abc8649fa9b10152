//! `TrainingArguments` from the command line, like HF's `HfArgumentParser`: every key is a
//! `--kebab-case` option (`--num-train-epochs 3`, `--bf16`), the strategy's options are
//! `--<strategy>.<option>` (`--diloco.sync-every 50`), `--config FILE` reads a TOML or JSON
//! file first, and the options given override it.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::args::{TrainingArguments, read_file};
use super::help::{help, nearest};
use crate::{AccelerateError, StrategyConfig};

/// Older names HF still accepts, with the key they set.
const ALIASES: [(&str, &str); 1] = [("evaluation_strategy", "eval_strategy")];

impl TrainingArguments {
    /// Arguments from command-line options (without the program name): `--config FILE`,
    /// then `--key value`, `--key=value` or, for a flag, `--key` alone; the chosen
    /// strategy's options as `--<strategy>.<option> value` (`--strategy diloco
    /// --diloco.sync-every 50`, `--fsdp.sharding-strategy grad-op`). Unknown options are
    /// errors naming the nearest known one; a bad value is an error naming the option as
    /// typed (`--learning-rate`); `--help` returns [`AccelerateError::Help`], whose text lists
    /// every option with a description, its allowed values and its default (print it and
    /// exit 0).
    pub fn from_args<I, S>(args: I) -> Result<Self, AccelerateError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let (args, _) = Self::default().with_args(args, &[])?;
        Ok(args)
    }

    /// These arguments (a program's own defaults) overridden by a `--config` file, then by
    /// the command-line options `args`, as in [`from_args`](Self::from_args). The program's
    /// own options `extra` (kebab-case names without the dashes, each taking a value; a name
    /// may be followed by `: ` and the line `--help` shows for it, e.g.
    /// `"data: digits (default) or cifar10"`) are
    /// accepted too and returned by name.
    pub fn with_args<I, S>(
        &self,
        args: I,
        extra: &[&str],
    ) -> Result<(Self, BTreeMap<String, String>), AccelerateError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let defaults = as_map(self);
        let mut overrides = Map::new();
        let mut own = BTreeMap::new();
        let mut config_file = None;
        let mut strategy_options = StrategyOptions::default();
        // The keys set on the command line, as typed there (errors name them so).
        let mut typed_as = BTreeMap::new();
        let mut tokens = args.into_iter().map(Into::into).peekable();
        while let Some(token) = tokens.next() {
            let Some(option) = token.strip_prefix("--") else {
                return Err(AccelerateError::argument(
                    &token,
                    "a bare word",
                    "--key value options (see --help)",
                ));
            };
            let (name, inline) = match option.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (option.to_string(), None),
            };
            if name == "help" {
                return Err(AccelerateError::Help(help(&defaults, extra)));
            }
            let key = name.replace('-', "_");
            let key = ALIASES
                .iter()
                .find(|(alias, _)| *alias == key)
                .map_or(key.clone(), |(_, key)| key.to_string());
            let is_flag = matches!(defaults.get(&key), Some(Value::Bool(_)));
            let mut value = || -> Result<String, AccelerateError> {
                if let Some(v) = inline.clone() {
                    return Ok(v);
                }
                let takes_next = match (is_flag, tokens.peek()) {
                    (true, Some(next)) => next == "true" || next == "false",
                    (false, Some(_)) => true,
                    (_, None) => false,
                };
                match (takes_next, is_flag) {
                    (true, _) => Ok(tokens.next().unwrap_or_default()),
                    (false, true) => Ok("true".into()),
                    (false, false) => Err(AccelerateError::argument(
                        format!("--{name}"),
                        "nothing",
                        "a value after it",
                    )),
                }
            };
            if name == "config" {
                config_file = Some(value()?);
            } else if let Some((strategy, option)) = name.split_once('.') {
                let text = value()?;
                strategy_options.set(strategy, option, &text)?;
            } else if extra.iter().any(|e| option_name(e) == name) {
                own.insert(name.clone(), value()?);
            } else if let Some(default) = defaults.get(&key) {
                let parsed = typed(&name, &value()?, default)?;
                typed_as.insert(key.clone(), format!("--{name}"));
                overrides.insert(key, parsed);
            } else {
                let known = defaults.keys().map(String::as_str);
                let own = extra.iter().map(|e| option_name(e));
                let known = known.chain(own).chain(["config", "help"]);
                let reason = match nearest(&name, known) {
                    Some(near) => {
                        format!("unknown option; did you mean --{near}? (see --help)")
                    }
                    None => "unknown option; a TrainingArguments key in kebab-case is \
                             expected (see --help)"
                        .into(),
                };
                return Err(AccelerateError::InvalidArgument {
                    key: format!("--{name}"),
                    reason,
                });
            }
        }
        let mut merged = defaults;
        match config_file.map(|path| (read_file(Path::new(&path)), path)) {
            Some((Ok(Value::Object(mut file)), _)) => {
                for (alias, key) in ALIASES {
                    if let Some(value) = file.remove(alias) {
                        file.insert(key.to_string(), value);
                    }
                }
                merged.extend(file);
            }
            Some((Ok(_), path)) => {
                return Err(AccelerateError::argument(
                    "--config",
                    path,
                    "a file holding a table of keys",
                ));
            }
            Some((Err(e), _)) => return Err(e),
            None => {}
        }
        StrategyOptions::keep_file_options(&merged, &mut overrides);
        merged.extend(overrides);
        strategy_options.apply(&mut merged)?;
        let args = Self::from_value(Value::Object(merged)).map_err(|e| match e {
            AccelerateError::InvalidArgument { key, reason } => AccelerateError::InvalidArgument {
                key: typed_as.get(&key).cloned().unwrap_or(key),
                reason,
            },
            other => other,
        })?;
        Ok((args, own))
    }
}

/// The `--<strategy>.<option>` values given, by strategy: applied to the chosen strategy's
/// options table once the file and the other options are merged.
#[derive(Default)]
struct StrategyOptions {
    /// `(strategy name, option as typed, key, value)`, in order given.
    given: Vec<(String, String, String, Value)>,
}

impl StrategyOptions {
    /// Records `--<strategy>.<option> text`, typed by the strategy's default for the option.
    fn set(&mut self, strategy: &str, option: &str, text: &str) -> Result<(), AccelerateError> {
        let typed_as = format!("--{strategy}.{option}");
        let named = StrategyConfig::from_name(strategy).map_err(|e| match e {
            AccelerateError::InvalidArgument { reason, .. } => AccelerateError::InvalidArgument {
                key: typed_as.clone(),
                reason,
            },
            other => other,
        })?;
        let Some(defaults) = named.options() else {
            return Err(AccelerateError::argument(
                &typed_as,
                text,
                format!("no option: strategy {} takes none", named.name()),
            ));
        };
        let key = option.replace('-', "_");
        let Some(default) = defaults.get(&key) else {
            let near = nearest(&key, defaults.keys().map(String::as_str));
            let known = defaults.keys().map(|k| k.replace('_', "-"));
            let hint = near.map_or(String::new(), |n| format!(" (did you mean {n}?)"));
            return Err(AccelerateError::InvalidArgument {
                key: typed_as,
                reason: format!(
                    "strategy {} has no option {option}{hint}; its options: {}",
                    named.name(),
                    known.collect::<Vec<_>>().join(", ")
                ),
            });
        };
        let value = typed(&format!("{strategy}.{option}"), text, default)?;
        self.given
            .push((named.name().to_string(), typed_as, key, value));
        Ok(())
    }

    /// Keeps the file's options table when the command line names the same strategy with
    /// `--strategy` alone (`--strategy diloco` over a file's `[strategy.diloco]`).
    fn keep_file_options(merged: &Map<String, Value>, overrides: &mut Map<String, Value>) {
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
    fn apply(self, merged: &mut Map<String, Value>) -> Result<(), AccelerateError> {
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

/// The option name of a program's own option `extra` (before any `: description`).
fn option_name(extra: &str) -> &str {
    extra.split_once(':').map_or(extra, |(name, _)| name).trim()
}

/// Every key with its value in `args`, as JSON.
fn as_map(args: &TrainingArguments) -> Map<String, Value> {
    match serde_json::to_value(args) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// `text` as the JSON type of the key's default: a number, a flag, a string; for a key whose
/// default is unset, a number or flag when it reads as one, else a string.
fn typed(name: &str, text: &str, default: &Value) -> Result<Value, AccelerateError> {
    let as_json = || serde_json::from_str::<Value>(text).ok();
    let bad = |expected: &str| AccelerateError::argument(format!("--{name}"), text, expected);
    match default {
        Value::Number(_) => as_json()
            .filter(Value::is_number)
            .ok_or_else(|| bad("a number")),
        Value::Bool(_) => match text {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(bad("true or false")),
        },
        Value::Null => Ok(as_json()
            .filter(|v| v.is_number() || v.is_boolean())
            .unwrap_or_else(|| Value::String(text.into()))),
        _ => Ok(Value::String(text.into())),
    }
}
