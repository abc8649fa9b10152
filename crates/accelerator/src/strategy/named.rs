//! A strategy of the user's, chosen by name like a built-in one: the type implements
//! [`NamedStrategy`] (its name, its options, how a rank builds it), the program registers it
//! once ([`register_strategy`]) so configs and command lines accept the name and its options
//! table, and the Accelerator is built as `Accelerator<B, AnyStrategy<B, Mine>>` (with
//! [`Accelerator::run_with`](crate::Accelerator::run_with) and
//! [`AnyStrategy::from_config`](super::AnyStrategy::from_config)).

use std::sync::{Mutex, PoisonError};

use afterburner_parallel::{ParallelStrategy, StateSaving};
use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::BUILT_IN;
use crate::AccelerateError;
use crate::group::Group;

/// A [`ParallelStrategy`] that configs choose by name: `strategy = "mine"`, or
/// `[strategy.mine]` with its options, `--strategy mine --mine.key value` on the Trainer's
/// command line.
pub trait NamedStrategy<B: AutodiffBackend>: ParallelStrategy<B> + Sized {
    /// The name configs write (lower case; no built-in strategy's name).
    const NAME: &'static str;
    /// Its options table (a struct with `#[serde(default)]`, or `()` for none).
    type Options: Serialize + DeserializeOwned + Default;

    /// This rank's strategy over `group` (`None` on a single device).
    fn build(group: Option<Group<B>>, options: Self::Options) -> Result<Self, AccelerateError>;

    /// What option `key` sets, for `--help` (default: no description). With
    /// `#[derive(documented::DocumentedFields)]` on the options struct, its field docs:
    /// `Options::get_field_docs(key).ok()`.
    fn option_about(key: &str) -> Option<&'static str> {
        let _ = key;
        None
    }
}

/// No strategy of the user's: [`AnyStrategy`](super::AnyStrategy)'s default, which builds the
/// built-in strategies only.
#[derive(Debug, Clone, Copy)]
pub enum NoStrategy {}

impl<B: AutodiffBackend> ParallelStrategy<B> for NoStrategy {
    fn name(&self) -> &'static str {
        match *self {}
    }
}

impl<B: AutodiffBackend> StateSaving<B> for NoStrategy {}

impl<B: AutodiffBackend> NamedStrategy<B> for NoStrategy {
    const NAME: &'static str = "";
    type Options = ();

    fn build(_: Option<Group<B>>, _: ()) -> Result<Self, AccelerateError> {
        Err(AccelerateError::InvalidArgument {
            key: "strategy".into(),
            reason: "no strategy of the user's in this Accelerator's type".into(),
        })
    }
}

/// A registered strategy chosen by a config: its name and its options as given.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredConfig {
    name: String,
    options: Value,
}

impl RegisteredConfig {
    /// The name it was registered under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its options, as the config gave them (defaults filled in).
    pub fn options(&self) -> &Value {
        &self.options
    }

    /// The config value: the name and its options.
    pub(super) fn to_value(&self) -> Value {
        let mut table = Map::new();
        table.insert(self.name.clone(), self.options.clone());
        Value::Object(table)
    }
}

/// A strategy registered under a name: its default options and how to check given ones.
struct Registration {
    name: &'static str,
    defaults: fn() -> Value,
    check: fn(Value) -> Result<Value, String>,
    about: fn(&str) -> Option<&'static str>,
}

static REGISTERED: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// Lets configs and command lines choose the strategy `S` by its name
/// ([`NamedStrategy::NAME`]), options table included; call it once before parsing them
/// (again: no change). Errors for an empty name or one a built-in strategy has.
pub fn register_strategy<B: AutodiffBackend, S: NamedStrategy<B>>() -> Result<(), AccelerateError> {
    let name = S::NAME;
    let taken = BUILT_IN
        .iter()
        .any(|b| b.name == name || b.aliases.contains(&name));
    if name.trim().is_empty() || name != name.to_ascii_lowercase() || taken {
        return Err(AccelerateError::InvalidArgument {
            key: "strategy".into(),
            reason: format!(
                "cannot register a strategy named '{name}': a name in lower case that no \
                 built-in strategy has is expected"
            ),
        });
    }
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    registered.retain(|r| r.name != name);
    registered.push(Registration {
        name,
        defaults: || serde_json::to_value(S::Options::default()).unwrap_or(Value::Null),
        check: check_options::<S::Options>,
        about: S::option_about,
    });
    Ok(())
}

/// The registered names, in registration order.
pub(super) fn names() -> Vec<String> {
    let registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    registered.iter().map(|r| r.name.to_string()).collect()
}

/// What option `key` of the registered strategy `name` sets, if it says.
pub(super) fn option_about(name: &str, key: &str) -> Option<&'static str> {
    let registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let registration = registered.iter().find(|r| r.name == name)?;
    (registration.about)(key)
}

/// The registered strategy `name` with `options` (defaults when `None`), or `None` when no
/// strategy is registered under that name.
pub(super) fn parse(
    name: &str,
    options: Option<Value>,
) -> Option<Result<RegisteredConfig, String>> {
    let registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let registration = registered.iter().find(|r| r.name == name)?;
    let options = options.unwrap_or_else(registration.defaults);
    Some(
        (registration.check)(options).map(|options| RegisteredConfig {
            name: name.into(),
            options,
        }),
    )
}

/// `options` checked against `O` (unknown keys and bad values named), defaults filled in.
fn check_options<O: Serialize + DeserializeOwned>(options: Value) -> Result<Value, String> {
    let empty_table = options.as_object().is_some_and(Map::is_empty);
    let parsed: O = match serde_path_to_error::deserialize(options) {
        Ok(parsed) => parsed,
        // `()` (no options) reads from null, not from an empty table.
        Err(_) if empty_table => serde_json::from_value(Value::Null).map_err(|e| e.to_string())?,
        Err(e) => {
            let path = e.path().to_string();
            return Err(format!("{path}: {}", e.into_inner()));
        }
    };
    serde_json::to_value(parsed).map_err(|e| e.to_string())
}

/// The user's strategy `U` for a config that chose `registered`.
pub(super) fn build_user<B: AutodiffBackend, U: NamedStrategy<B>>(
    registered: &RegisteredConfig,
    group: Option<Group<B>>,
) -> Result<U, AccelerateError> {
    if registered.name != U::NAME {
        return Err(AccelerateError::InvalidArgument {
            key: "strategy".into(),
            reason: format!(
                "'{}' is a registered strategy, but this Accelerator's strategy type holds {}: \
                 build it with AnyStrategy::<B, ThatStrategy>::from_config",
                registered.name,
                match U::NAME {
                    "" => "no strategy of the user's".to_string(),
                    other => format!("'{other}'"),
                }
            ),
        });
    }
    let options = check_options::<U::Options>(registered.options.clone())
        .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
        .map_err(|reason| AccelerateError::InvalidArgument {
            key: format!("strategy.{}", U::NAME),
            reason,
        })?;
    U::build(group, options)
}
