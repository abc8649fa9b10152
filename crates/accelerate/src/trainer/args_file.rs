//! `TrainingArguments` files: a TOML or JSON file's keys as one JSON object, which the
//! arguments (and the command line's `--config`) read.

use std::path::Path;

use crate::AccelerateError;

/// A TOML or JSON file's keys as a JSON object.
pub(super) fn read_file(path: &Path) -> Result<serde_json::Value, AccelerateError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| AccelerateError::io("read training arguments", path, e))?;
    let parsed = match path.extension().is_some_and(|e| e == "toml") {
        true => parse_toml(&text),
        false => parse_json(&text),
    };
    parsed.map_err(|e| AccelerateError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

pub(super) fn parse_toml(text: &str) -> Result<serde_json::Value, AccelerateError> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| AccelerateError::InvalidArgument {
            key: "(TOML)".into(),
            reason: e.to_string(),
        })?;
    // TOML has nan and inf, JSON (what the keys go through) has not, and would read them as
    // null: say so by name, in nested tables (`[strategy.diloco]`) and arrays too.
    for (key, value) in &table {
        refuse_nonfinite(key, value)?;
    }
    serde_json::to_value(table).map_err(|e| AccelerateError::InvalidArgument {
        key: "(TOML)".into(),
        reason: e.to_string(),
    })
}

/// An error naming the dotted `key` of the first nan or inf float in `value`.
fn refuse_nonfinite(key: &str, value: &toml::Value) -> Result<(), AccelerateError> {
    match value {
        toml::Value::Float(x) if !x.is_finite() => Err(AccelerateError::argument(
            key,
            x,
            "a finite number (NaN and inf are not allowed)",
        )),
        toml::Value::Table(table) => table
            .iter()
            .try_for_each(|(name, inner)| refuse_nonfinite(&format!("{key}.{name}"), inner)),
        toml::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, inner)| refuse_nonfinite(&format!("{key}[{i}]"), inner)),
        _ => Ok(()),
    }
}

/// A JSON argument file: one object of keys, each key once (serde_json alone would keep the
/// last of a repeated key, and read a top-level array as positional fields).
pub(super) fn parse_json(text: &str) -> Result<serde_json::Value, AccelerateError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = serde::de::DeserializeSeed::deserialize(UniqueKeys, &mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| AccelerateError::InvalidArgument {
            key: "(JSON)".into(),
            reason: e.to_string(),
        })?;
    match value {
        serde_json::Value::Object(_) => Ok(value),
        other => Err(AccelerateError::InvalidArgument {
            key: "(JSON)".into(),
            reason: format!(
                "the arguments must be one JSON object of keys ({{\"output_dir\": ...}}), not {}",
                json_kind(&other)
            ),
        }),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Reads any JSON value as `serde_json::Value`, refusing an object that repeats a key.
#[derive(Clone, Copy)]
struct UniqueKeys;

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(items.into())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key \"{key}\" is given twice (which one was meant?)"
                )));
            }
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(object.into())
    }
}
