//! What the command line's `--help` says beyond what clap writes from the options: each
//! key's description (the first sentence of its doc comment), the text above the options
//! and the list of strategies below them.

use documented::DocumentedFields;

use crate::trainer::TrainingArguments;
use crate::{ParallelismConfig, StrategyConfig};

/// What `--help` says first, above the usage line.
pub(super) const ABOUT: &str = "Training arguments: HF's TrainingArguments keys in kebab-case \
     (HF's underscore spellings are taken too: --num_train_epochs 3); a flag may be given alone \
     (--bf16) or with true or false; --config FILE first, the options given override it.";

/// The strategies `--strategy` takes, each with its description: `--help`'s last part (their
/// options are listed above it, under a heading each).
pub(super) fn strategies() -> String {
    let mut lines =
        vec!["Strategies (--strategy NAME; its options as --NAME.OPTION VALUE, above):".into()];
    for name in StrategyConfig::names() {
        let about = StrategyConfig::about(&name).unwrap_or("a registered strategy");
        let about = about.split(". ").next().unwrap_or_default();
        let about = about.split_whitespace().collect::<Vec<_>>().join(" ");
        lines.push(format!("  {name}: {}", about.trim_end_matches('.')));
    }
    lines.join("\n")
}

/// The one-line description of `key` (snake_case): the first sentence of its field's doc
/// comment.
pub(super) fn description(key: &str) -> Option<String> {
    field_docs(key).map(first_sentence)
}

/// The doc comment of key `key`: its field's in [`TrainingArguments`], or in the
/// [`ParallelismConfig`] flattened into it (`strategy`, `devices`, `tp_size`).
fn field_docs(key: &str) -> Option<&'static str> {
    match key {
        "parallelism" => None,
        _ => TrainingArguments::get_field_docs(key)
            .or_else(|_| ParallelismConfig::get_field_docs(key))
            .ok(),
    }
}

/// The first sentence of a doc comment, on one line, without Markdown's backticks and
/// intra-doc link brackets: what `--help` shows beside an option.
pub(super) fn first_sentence(doc: &str) -> String {
    let one_line = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    // A sentence ends at ". ", but not after an abbreviation ("e.g. ", "i.e. ").
    let end = one_line.match_indices(". ").map(|(i, _)| i).find(|&i| {
        let before = &one_line[..i];
        !(before.ends_with("e.g") || before.ends_with("i.e"))
    });
    let first = match end {
        Some(end) => &one_line[..=end],
        None => &one_line,
    };
    without_links(first.trim_end_matches('.')).replace('`', "")
}

/// `text` with Markdown's intra-doc links, ``[`Name`]`` and ``[`Name`](path)``, as `Name`.
fn without_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        let Some(end) = rest[start..].find("`]").map(|e| start + e) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&rest[start + 1..=end]);
        rest = &rest[end + 2..];
        if rest.starts_with('(')
            && let Some(close) = rest.find(')')
        {
            rest = &rest[close + 1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn every_key_is_described_by_its_doc_comment() {
        let keys = match serde_json::to_value(TrainingArguments::default()) {
            Ok(Value::Object(map)) => map,
            _ => panic!("TrainingArguments is a table"),
        };
        // The parallelism keys are flattened in, each described once (in ParallelismConfig).
        for key in ["strategy", "devices", "tp_size"] {
            assert!(keys.contains_key(key), "{key}");
            assert!(TrainingArguments::get_field_docs(key).is_err(), "{key}");
        }
        for key in keys.keys() {
            let doc = field_docs(key).unwrap_or_else(|| panic!("{key} has no doc comment"));
            let line = description(key).unwrap_or_default();
            assert!(!line.is_empty() && !line.contains('`'), "{key}: {line}");
            assert_eq!(line, first_sentence(doc), "{key}");
        }
    }

    #[test]
    fn links_and_code_become_plain_words() {
        assert_eq!(
            first_sentence(
                "See [`StrategyConfig`] or [`Trainer::new`](super::Trainer::new). More."
            ),
            "See StrategyConfig or Trainer::new"
        );
        assert_eq!(
            first_sentence("A table (`[strategy.diloco]`). Default 1."),
            "A table ([strategy.diloco])"
        );
        assert_eq!(
            first_sentence("Modules (e.g. blocks, i.e. layers). More."),
            "Modules (e.g. blocks, i.e. layers)"
        );
    }
}
