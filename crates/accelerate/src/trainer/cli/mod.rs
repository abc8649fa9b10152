//! `TrainingArguments` from the command line, like HF's `HfArgumentParser`, through clap:
//! every key is a `--kebab-case` option (`--num-train-epochs 3`, HF's `--num_train_epochs 3`
//! too, `--bf16`), the strategy's options are `--<strategy>.<option>` (`--diloco.sync-every
//! 50`), `--config FILE` reads a TOML or JSON file first, and the options given override it.

mod command;
mod errors;
mod help;
mod strategy;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches};
use serde_json::{Map, Value};

use super::args::TrainingArguments;
use super::args_file::read_file;
use crate::AccelerateError;
use command::{ALIASES, Options, Role};
use strategy::StrategyOptions;

impl TrainingArguments {
    /// Arguments from command-line options (without the program name): `--config FILE`,
    /// then `--key value`, `--key=value` or, for a flag, `--key` alone; the chosen
    /// strategy's options as `--<strategy>.<option> value` (`--strategy diloco
    /// --diloco.sync-every 50`, `--fsdp.sharding-strategy grad-op`). Unknown options are
    /// errors naming the nearest known one; a bad value is an error naming the option as
    /// typed (`--learning-rate`) and what is allowed; `--help` returns
    /// [`AccelerateError::Help`], whose text lists every option with a description, its
    /// allowed values and its default (print it and exit 0).
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
        let tokens: Vec<String> = args
            .into_iter()
            .map(|token| strategy::spelled_by_list_name(token.into()))
            .collect();
        let Options { command, roles, .. } = Options::new(&defaults, extra)?;
        let matches = command
            .clone()
            .try_get_matches_from(&tokens)
            .map_err(|e| errors::from_clap(e, &command, &tokens))?;
        let mut overrides = Map::new();
        let mut own = BTreeMap::new();
        let mut config_file = None;
        let mut strategy_options = StrategyOptions::default();
        // The keys set on the command line, as typed there (errors name them so).
        let mut typed_keys = BTreeMap::new();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            let (Some(role), Some(text)) = (roles.get(id), given(&matches, arg)) else {
                continue;
            };
            let typed = typed_as(arg, &tokens);
            match role {
                Role::Config => config_file = Some(text),
                Role::Own(name) => {
                    own.insert(name.clone(), text);
                }
                Role::Key(key, default) => {
                    overrides.insert(key.clone(), typed_value(&typed, &text, default)?);
                    typed_keys.insert(key.clone(), typed);
                }
                Role::StrategyOption(strategy, key, default) => {
                    let value = typed_value(&typed, &text, default)?;
                    strategy_options.set(strategy, typed, key, value);
                }
            }
        }
        let mut merged = defaults;
        if let Some(path) = config_file {
            merged.extend(config(&path)?);
        }
        StrategyOptions::keep_file_options(&merged, &mut overrides);
        merged.extend(overrides);
        strategy_options.apply(&mut merged)?;
        let args = Self::from_value(Value::Object(merged)).map_err(|e| match e {
            AccelerateError::InvalidArgument { key, reason } => AccelerateError::InvalidArgument {
                key: typed_keys.get(&key).cloned().unwrap_or(key),
                reason,
            },
            other => other,
        })?;
        Ok((args, own))
    }
}

/// The keys of the `--config` file at `path`, HF's older names under the keys they set.
fn config(path: &str) -> Result<Map<String, Value>, AccelerateError> {
    let Value::Object(mut file) = read_file(Path::new(path))? else {
        return Err(AccelerateError::argument(
            "--config",
            path,
            "a file holding a table of keys",
        ));
    };
    for (alias, key) in ALIASES {
        if let Some(value) = file.remove(alias) {
            file.insert(key.to_string(), value);
        }
    }
    Ok(file)
}

/// The value `arg` was given on the command line (not its default), if any.
fn given(matches: &ArgMatches, arg: &Arg) -> Option<String> {
    let id = arg.get_id().as_str();
    if matches.value_source(id) != Some(ValueSource::CommandLine) {
        return None;
    }
    matches.try_get_one::<String>(id).ok().flatten().cloned()
}

/// `arg` as the user typed it in `tokens` (`--num_train_epochs`; the last one when given
/// twice), else by its long name.
fn typed_as(arg: &Arg, tokens: &[String]) -> String {
    let long = arg.get_long().unwrap_or_default();
    let names: Vec<&str> = std::iter::once(long)
        .chain(arg.get_all_aliases().unwrap_or_default())
        .collect();
    let typed = tokens.iter().rev().find_map(|token| {
        let option = token.strip_prefix("--")?;
        let name = option.split_once('=').map_or(option, |(name, _)| name);
        names.contains(&name).then_some(name)
    });
    format!("--{}", typed.unwrap_or(long))
}

/// Every key with its value in `args`, as JSON.
fn as_map(args: &TrainingArguments) -> Map<String, Value> {
    match serde_json::to_value(args) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// `text`, given to the option `typed_as`, as the JSON type of the key's default: a number, a
/// flag, a string; for a key whose default is unset, a number or flag when it reads as one,
/// else a string.
fn typed_value(typed_as: &str, text: &str, default: &Value) -> Result<Value, AccelerateError> {
    let as_json = || serde_json::from_str::<Value>(text).ok();
    let bad = |expected: &str| AccelerateError::argument(typed_as, text, expected);
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
