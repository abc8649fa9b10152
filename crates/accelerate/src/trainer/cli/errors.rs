//! clap's errors as the Trainer's: `--help` as [`AccelerateError::Help`], everything else as
//! [`AccelerateError::InvalidArgument`] naming the option as typed, the value given, what is
//! allowed and, for a typo, the nearest option or value.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, Command};

use afterburner_accelerator::suggest::nearest;

use super::strategy::unknown_option;
use super::typed_as;
use crate::AccelerateError;
use crate::trainer::choices::{UnknownValue, listed};

/// The Trainer's error for clap's `error` from parsing `tokens` with `command`.
pub(super) fn from_clap(
    error: clap::Error,
    command: &Command,
    tokens: &[String],
) -> AccelerateError {
    let context = |kind| match error.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        _ => None,
    };
    let mut invalid = context(ContextKind::InvalidArg).unwrap_or_default();
    // clap names a short option by its first letter: name the word as typed (`-runs`).
    let short = invalid.starts_with('-') && !invalid.starts_with("--");
    let typed = |t: &&String| !t.starts_with("--") && t.starts_with(&invalid);
    if let Some(word) = tokens.iter().find(typed).filter(|_| short) {
        invalid = word.clone();
    }
    match error.kind() {
        ErrorKind::DisplayHelp => AccelerateError::Help(error.render().to_string()),
        ErrorKind::UnknownArgument => {
            unknown(&invalid, context(ContextKind::SuggestedArg), command)
        }
        ErrorKind::InvalidValue => {
            // clap names the option by its long name and value: "--optim <VALUE>".
            let long = invalid.split(' ').next().unwrap_or_default();
            let arg = command.get_arguments().find(|arg| {
                arg.get_long()
                    .is_some_and(|name| long.strip_prefix("--") == Some(name))
            });
            let key = arg.map_or(long.to_string(), |arg| typed_as(arg, tokens));
            match (context(ContextKind::InvalidValue), arg) {
                (Some(value), Some(arg)) if !value.is_empty() => {
                    let suggested = context(ContextKind::SuggestedValue);
                    bad_value(key, &value, arg, suggested)
                }
                _ => AccelerateError::argument(key, "nothing", "a value after it"),
            }
        }
        _ => AccelerateError::InvalidArgument {
            key: match invalid.is_empty() {
                true => "(command line)".into(),
                false => invalid,
            },
            reason: first_line(&error),
        },
    }
}

/// The error for an option clap does not know (`typed` as given, `--` included), with the
/// nearest option: clap's suggestion, else the nearest by edit distance, never one of a
/// strategy's options for a plain name; a word without `--` is no option at all.
fn unknown(typed: &str, suggested: Option<String>, command: &Command) -> AccelerateError {
    let Some(name) = typed.strip_prefix("--") else {
        let reason = match typed.starts_with('-') {
            true => {
                "not an option: options are --key value (a value that starts with '-' is \
                     given as --key=-value; see --help)"
            }
            false => "a bare word given, expected --key value options (see --help)",
        };
        return AccelerateError::InvalidArgument {
            key: typed.to_string(),
            reason: reason.into(),
        };
    };
    if name.contains('.') {
        return unknown_option(name);
    }
    let plain = |long: &&str| !long.contains('.');
    let longs = command
        .get_arguments()
        .filter_map(Arg::get_long)
        .filter(plain);
    let suggested = suggested
        .and_then(|near| Some(near.strip_prefix("--")?.to_string()))
        .filter(|near| plain(&near.as_str()))
        .or_else(|| nearest(name, longs))
        .map(|near| spelled_as_typed(&near, name, command));
    let reason = match suggested {
        Some(near) => format!("unknown option; did you mean --{near}? (see --help)"),
        None => {
            "unknown option; a TrainingArguments key in kebab-case is expected (see --help)".into()
        }
    };
    AccelerateError::InvalidArgument {
        key: typed.to_string(),
        reason,
    }
}

/// The option named `near` (a long name or an alias) by its long name, or by its underscore
/// spelling when the user `typed` underscores (`--learning_rat`: `learning_rate`).
fn spelled_as_typed(near: &str, typed: &str, command: &Command) -> String {
    let names = |arg: &Arg| {
        let aliases = arg.get_all_aliases().unwrap_or_default();
        aliases
            .into_iter()
            .chain(arg.get_long())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let Some(arg) = command
        .get_arguments()
        .find(|arg| names(arg).iter().any(|n| n == near))
    else {
        return near.to_string();
    };
    let long = arg.get_long().unwrap_or(near);
    let snake = long.replace('-', "_");
    match typed.contains('_') && names(arg).contains(&snake) {
        true => snake,
        false => long.to_string(),
    }
}

/// The error for `value`, none of `arg`'s values (listed with their other spellings), with
/// clap's suggestion of the nearest one.
fn bad_value(key: String, value: &str, arg: &Arg, suggested: Option<String>) -> AccelerateError {
    let valid = listed(&arg.get_possible_values());
    let hint = suggested.map_or(String::new(), |near| format!(" (did you mean {near}?)"));
    AccelerateError::InvalidArgument {
        key,
        reason: format!("{}{hint}", UnknownValue::new(value, valid)),
    }
}

/// The first line of clap's message, without its `error: `.
fn first_line(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    line.trim_start_matches("error: ").to_string()
}
