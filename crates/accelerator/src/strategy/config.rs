//! [`StrategyConfig`] as configs write it: a name (`"ddp"`) or a table of one strategy's
//! options (`{ diloco = { sync_every = 50 } }`, a `[strategy.diloco]` table in TOML), names
//! matched in any case and in every spelling of the list, a registered strategy's name too.

use std::fmt;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{BUILT_IN, StrategyConfig, built_in, named};
use crate::AccelerateError;

impl Default for StrategyConfig {
    /// `"single-device"`.
    fn default() -> Self {
        Self::SingleDevice
    }
}

impl StrategyConfig {
    /// Whether the strategy runs on several ranks (every one but `"single-device"`).
    pub fn is_distributed(&self) -> bool {
        !matches!(self, Self::SingleDevice)
    }

    /// The strategy's name, as configs write it (`"zero-1"`, a registered name).
    pub fn name(&self) -> &str {
        match self {
            Self::Registered(registered) => registered.name(),
            built_in => {
                let value = Self::serialize(built_in, serde_json::value::Serializer);
                let name = match value {
                    Ok(Value::String(name)) => Some(name),
                    Ok(Value::Object(map)) => map.keys().next().cloned(),
                    _ => None,
                };
                BUILT_IN
                    .iter()
                    .find(|b| Some(b.name) == name.as_deref())
                    .map_or("", |b| b.name)
            }
        }
    }

    /// The strategy's options as a table (`None` for a strategy without options).
    pub fn options(&self) -> Option<Map<String, Value>> {
        match self.to_value() {
            Value::Object(mut map) => match map.remove(self.name()) {
                Some(Value::Object(options)) => Some(options),
                _ => None,
            },
            _ => None,
        }
    }

    /// The strategy named `name` (any spelling, a registered name too) with default options.
    pub fn from_name(name: &str) -> Result<Self, AccelerateError> {
        Self::from_value(Value::String(name.into()))
    }

    /// The strategy a config value gives: a name, or a table with one key, the name, whose
    /// value is the table of options. Errors name the strategy and the option.
    pub fn from_value(value: Value) -> Result<Self, AccelerateError> {
        let bad = |reason: String| AccelerateError::InvalidArgument {
            key: "strategy".into(),
            reason,
        };
        let (given, options) = match value {
            Value::String(name) => (name, None),
            Value::Object(map) if map.len() == 1 => {
                let (name, options) = map.into_iter().next().unwrap_or_default();
                (name, Some(options))
            }
            other => {
                return Err(bad(format!(
                    "{other} given, expected a strategy name (\"ddp\") or a table of one \
                     strategy's options ({{ diloco = {{ sync_every = 50 }} }})"
                )));
            }
        };
        let name = given.trim().to_ascii_lowercase();
        let options = options.filter(|o| !o.is_null());
        if let Some(built_in) = BUILT_IN
            .iter()
            .find(|b| b.name == name || b.aliases.contains(&name.as_str()))
        {
            return parse_built_in(built_in.name, options).map_err(bad);
        }
        if let Some(registered) = named::parse(&name, options) {
            return Ok(Self::Registered(registered.map_err(bad)?));
        }
        Err(bad(unknown_name(&given)))
    }

    /// The config value: the name, or a table of the name and its options.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Registered(registered) => registered.to_value(),
            built_in => {
                Self::serialize(built_in, serde_json::value::Serializer).unwrap_or(Value::Null)
            }
        }
    }

    /// Checks the options, naming the first bad one.
    pub fn validate(&self) -> Result<(), AccelerateError> {
        built_in::validate(self)
    }

    /// Every strategy name a config may give: the built-in ones, then the registered ones.
    pub fn names() -> Vec<String> {
        let built_in = BUILT_IN.iter().map(|b| b.name.to_string());
        built_in.chain(named::names()).collect()
    }

    /// The description of the strategy named `name` (built-in ones only).
    pub fn about(name: &str) -> Option<&'static str> {
        BUILT_IN.iter().find(|b| b.name == name).map(|b| b.about)
    }
}

/// The built-in strategy `name` (its list name) from its options, if any.
fn parse_built_in(name: &str, options: Option<Value>) -> Result<StrategyConfig, String> {
    let without_options = StrategyConfig::deserialize(Value::String(name.into())).ok();
    let given = options.filter(|o| o.as_object().is_none_or(|map| !map.is_empty()));
    match (without_options, given) {
        (Some(config), None) => Ok(config),
        (Some(_), Some(options)) => {
            Err(format!("strategy {name} takes no options, {options} given"))
        }
        (None, options) => {
            let mut table = Map::new();
            table.insert(name.into(), options.unwrap_or(Value::Object(Map::new())));
            // The derived shape (not `Deserialize`, which parses names and comes back here).
            let mut track = serde_path_to_error::Track::new();
            let tracked = serde_path_to_error::Deserializer::new(Value::Object(table), &mut track);
            StrategyConfig::deserialize(tracked).map_err(|e| format!("{}: {e}", track.path()))
        }
    }
}

/// The error for a name that is no strategy: the names there are, and the nearest.
fn unknown_name(given: &str) -> String {
    let names = StrategyConfig::names();
    let near = crate::suggest::nearest(given.trim(), names.iter().map(String::as_str));
    let hint = near.map_or(String::new(), |n| format!("; did you mean {n}?"));
    format!(
        "'{given}' is not a strategy: expected one of {}{hint}",
        names.join(", ")
    )
}

impl Serialize for StrategyConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StrategyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_value(value).map_err(|e| match e {
            AccelerateError::InvalidArgument { reason, .. } => D::Error::custom(reason),
            other => D::Error::custom(other),
        })
    }
}

impl fmt::Display for StrategyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyConfig {
    type Err = AccelerateError;

    /// A strategy by name, with default options.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afterburner_localsgd::DiLoCoConfig;

    /// The test that fails when a name is missing from the list, the parser, Display or the
    /// error's list of names.
    #[test]
    fn every_built_in_name_parses_prints_and_is_listed() {
        let unknown = StrategyConfig::from_name("no-such-strategy")
            .unwrap_err()
            .to_string();
        assert!(BUILT_IN.len() >= 6);
        for built_in in BUILT_IN {
            let config = StrategyConfig::from_name(built_in.name).unwrap();
            assert_eq!(config.name(), built_in.name);
            assert_eq!(config.to_string(), built_in.name);
            assert!(unknown.contains(built_in.name), "{unknown}");
            assert!(!built_in.about.trim().is_empty(), "{}", built_in.name);
            for alias in built_in.aliases {
                let upper = alias.to_ascii_uppercase();
                assert_eq!(StrategyConfig::from_name(&upper).unwrap(), config);
            }
            // The value round-trips, options included.
            let value = config.to_value();
            assert_eq!(StrategyConfig::from_value(value).unwrap(), config);
        }
    }

    #[test]
    fn options_come_in_a_table_under_the_name() {
        let config: StrategyConfig =
            serde_json::from_str(r#"{"diloco": {"sync_every": 7}}"#).unwrap();
        let StrategyConfig::DiLoCo(diloco) = &config else {
            panic!("{config:?}")
        };
        assert_eq!(diloco.sync_every, 7);
        assert_eq!(diloco.outer_lr, DiLoCoConfig::default().outer_lr);
        assert_eq!(config.options().unwrap()["sync_every"], 7);
        let toml: toml::Table =
            toml::from_str("[strategy.local-sgd]\nlocal_sgd_steps = 3").unwrap();
        let config =
            StrategyConfig::from_value(serde_json::to_value(&toml["strategy"]).unwrap()).unwrap();
        assert!(matches!(config, StrategyConfig::LocalSgd(ref l) if l.local_sgd_steps == 3));
    }

    #[test]
    fn bad_names_and_options_are_named() {
        let err = StrategyConfig::from_name("dpp").unwrap_err().to_string();
        assert!(
            err.contains("'dpp'") && err.contains("did you mean ddp"),
            "{err}"
        );
        let err = serde_json::from_str::<StrategyConfig>(r#"{"diloco": {"sync_evry": 7}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sync_evry") && err.contains("sync_every"),
            "{err}"
        );
        let err = serde_json::from_str::<StrategyConfig>(r#"{"ddp": {"x": 1}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`x`") && err.contains("bucket_cap_mb"),
            "{err}"
        );
        let err = serde_json::from_str::<StrategyConfig>(r#"{"single-device": {"x": 1}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("single-device takes no options"), "{err}");
        let err = serde_json::from_str::<StrategyConfig>(r#"{"ddp": {}, "fsdp": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a table of one strategy's options"), "{err}");
    }
}
