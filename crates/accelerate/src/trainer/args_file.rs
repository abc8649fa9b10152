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
    // TOML has nan and inf, JSON (what the keys go through) has not: say so by name.
    for (key, value) in &table {
        if let toml::Value::Float(x) = value
            && !x.is_finite()
        {
            return Err(AccelerateError::argument(
                key,
                x,
                "a finite number (NaN and inf are not allowed)",
            ));
        }
    }
    serde_json::to_value(table).map_err(|e| AccelerateError::InvalidArgument {
        key: "(TOML)".into(),
        reason: e.to_string(),
    })
}

pub(super) fn parse_json(text: &str) -> Result<serde_json::Value, AccelerateError> {
    serde_json::from_str(text).map_err(|e| AccelerateError::InvalidArgument {
        key: "(JSON)".into(),
        reason: e.to_string(),
    })
}
