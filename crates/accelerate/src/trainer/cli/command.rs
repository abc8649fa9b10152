//! The command line as a `clap::Command`, built at each parse from what can change: the
//! arguments' keys and the program's defaults, the program's own options, and the strategies
//! (the built-in ones and those registered by name) with their options.

use std::collections::{BTreeMap, BTreeSet};

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{Arg, ArgAction, Command};
use serde_json::{Map, Value};

use super::help::{ABOUT, description, first_sentence, strategies};
use crate::trainer::choices::{
    IntervalStrategy, LossNormalization, OptimizerType, ReportTo, SchedulerType, Spelled,
};
use crate::{AccelerateError, StrategyConfig};

/// Older names HF still accepts, with the key they set.
pub(super) const ALIASES: [(&str, &str); 1] = [("evaluation_strategy", "eval_strategy")];

/// What an option sets; the command's options are found by their id, their long name.
#[derive(Debug, Clone)]
pub(super) enum Role {
    /// `--config FILE`.
    Config,
    /// A `TrainingArguments` key (snake_case), with the program's default for it.
    Key(String, Value),
    /// One of the program's own options, by the name it gave.
    Own(String),
    /// `--<strategy>.<option>`: the strategy's list name, the option's key, its default.
    StrategyOption(String, String, Value),
}

/// The command and what each of its options sets, by id.
pub(super) struct Options {
    /// The clap command.
    pub command: Command,
    /// Each option's role, by its id (its long name).
    pub roles: BTreeMap<String, Role>,
    /// Every long name and alias taken so far (clap refuses a name twice).
    taken: BTreeSet<String>,
}

impl Options {
    /// The command for the program's `defaults` and its own options `extra` (`"name"` or
    /// `"name: its --help line"`); errors on an own option's name the command line cannot
    /// take.
    pub(super) fn new(
        defaults: &Map<String, Value>,
        extra: &[&str],
    ) -> Result<Self, AccelerateError> {
        let command = Command::new(program_name())
            .about(ABOUT)
            .no_binary_name(true)
            .disable_help_flag(true)
            .disable_version_flag(true)
            .args_override_self(true)
            // One line per option, never wrapped (programs print the text as it is).
            .term_width(0)
            .after_help(strategies())
            .arg(
                Arg::new("help")
                    .short('h')
                    .long("help")
                    .help("this text")
                    .action(ArgAction::HelpShort),
            );
        let mut options = Self {
            command,
            roles: BTreeMap::new(),
            taken: ["help".to_string()].into(),
        };
        let config = Arg::new("config")
            .value_name("FILE")
            .help("a TOML or JSON file of keys; options after it override it");
        options.add(config, Role::Config, []);
        // The program's own options first: one named as a key is the program's.
        options.command = options.command.next_help_heading("This program's options");
        for own in extra {
            options.add_own(own)?;
        }
        // The keys in clap's own "Options" section, shown first.
        options.command = options.command.next_help_heading(None::<&str>);
        for (key, default) in defaults {
            let old = ALIASES.iter().filter(|(_, k)| k == key);
            let old = old.flat_map(|(alias, _)| [alias.replace('_', "-"), alias.to_string()]);
            let role = Role::Key(key.clone(), default.clone());
            options.add(key_arg(key, default), role, old.chain([key.clone()]));
        }
        for name in StrategyConfig::names() {
            options.add_strategy(&name);
        }
        Ok(options)
    }

    /// The program's own option `own` (`"name"` or `"name: its --help line"`); errors on a
    /// name the command line cannot take.
    fn add_own(&mut self, own: &str) -> Result<(), AccelerateError> {
        let (name, text) = own
            .split_once(':')
            .map_or((own, "this program's own option"), |(n, t)| (n, t));
        let name = name.trim();
        let plain = !name.is_empty()
            && !name.starts_with('-')
            && !name.contains(['=', '.'])
            && !name.contains(char::is_whitespace);
        if !plain || self.taken.contains(name) {
            return Err(AccelerateError::InvalidArgument {
                key: format!("--{name}"),
                reason: "a program's own option the command line cannot take: its name is \
                         used already (config, help, another own option) or has a '.', '=' \
                         or space; a new kebab-case name is expected"
                    .into(),
            });
        }
        let arg = Arg::new(name.to_string())
            .value_name("VALUE")
            .help(text.trim().to_string());
        self.add(arg, Role::Own(name.to_string()), [name.replace('-', "_")]);
        Ok(())
    }

    /// The options of strategy `name`, under a heading of their own.
    fn add_strategy(&mut self, name: &str) {
        let Ok(config) = StrategyConfig::from_name(name) else {
            return;
        };
        let defaults = config.options().unwrap_or_default();
        if defaults.is_empty() {
            return;
        }
        let heading = format!("Options of strategy {name} (with --strategy {name})");
        self.command = std::mem::take(&mut self.command).next_help_heading(heading);
        for (key, default) in defaults {
            let long = format!("{name}.{}", key.replace('_', "-"));
            let snake = name.replace('-', "_");
            let aliases = [
                format!("{name}.{key}"),
                format!("{snake}.{key}"),
                format!("{snake}.{}", key.replace('_', "-")),
            ];
            let about = config.option_about(&key).map(first_sentence);
            let arg = with_default(
                Arg::new(long).value_name(value_name(&default)),
                about.as_deref().unwrap_or_default(),
                &default,
            );
            self.add(
                arg,
                Role::StrategyOption(name.into(), key, default),
                aliases,
            );
        }
    }

    /// Adds `arg` (its id the long name) for `role`, with the `aliases` not taken yet (hidden:
    /// `--help` says that the underscore spellings are taken); an arg whose name is taken is
    /// left out (the program's own option wins over a key of the same name).
    fn add(&mut self, arg: Arg, role: Role, aliases: impl IntoIterator<Item = String>) {
        let long = arg.get_id().to_string();
        if !self.taken.insert(long.clone()) {
            return;
        }
        let mut arg = arg.long(long.clone()).allow_negative_numbers(true);
        for alias in aliases {
            if self.taken.insert(alias.clone()) {
                arg = match alias.contains('_') {
                    true => arg.alias(alias),
                    false => arg.visible_alias(alias),
                };
            }
        }
        self.command = std::mem::take(&mut self.command).arg(arg);
        self.roles.insert(long, role);
    }
}

/// The option of `key`: its description, its values (a flag may be given alone, a choice
/// lists its values) and the program's default.
fn key_arg(key: &str, default: &Value) -> Arg {
    let arg = Arg::new(key.replace('_', "-")).value_name(value_name(default));
    let arg = match (default, choices(key)) {
        (Value::Bool(_), _) => arg
            .num_args(0..=1)
            .default_missing_value("true")
            .value_parser(["true", "false"])
            .hide_possible_values(true),
        (_, Some(values)) => arg
            .value_parser(PossibleValuesParser::new(values))
            .ignore_case(true),
        _ => arg,
    };
    with_default(arg, &description(key).unwrap_or_default(), default)
}

/// `arg` with its help line `text` and its `default` shown (`[default: unset]` for none).
fn with_default(arg: Arg, text: &str, default: &Value) -> Arg {
    match default {
        Value::Null => arg.help(format!("{text} [default: unset]").trim_start().to_string()),
        Value::String(s) => arg.help(text.to_string()).default_value(s.clone()),
        other => arg.help(text.to_string()).default_value(other.to_string()),
    }
}

/// The placeholder of an option's value: `BOOL` for a flag, `N` for a number.
fn value_name(default: &Value) -> &'static str {
    match default {
        Value::Bool(_) => "BOOL",
        Value::Number(_) => "N",
        _ => "VALUE",
    }
}

/// The values of a choice-valued `key`, from its enum's spelling table.
fn choices(key: &str) -> Option<Vec<PossibleValue>> {
    Some(match key {
        "optim" => OptimizerType::possible_values(),
        "lr_scheduler_type" => SchedulerType::possible_values(),
        "loss_normalization" => LossNormalization::possible_values(),
        "report_to" => ReportTo::possible_values(),
        "eval_strategy" | "logging_strategy" | "save_strategy" => {
            IntervalStrategy::possible_values()
        }
        _ => return None,
    })
}

/// The running program's file name, for the usage line.
fn program_name() -> String {
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&arg0).file_name().unwrap_or_default();
    match name.to_string_lossy() {
        name if name.is_empty() => "train".into(),
        name => name.into_owned(),
    }
}
