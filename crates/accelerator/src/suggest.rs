//! The known name nearest to a mistyped one, for errors that say "did you mean ...?" (the
//! strategy names here, the Trainer's options).

/// The name in `known` nearest to a mistyped `name` (compared in kebab-case), when it is close
/// enough to be a typo of it; returned in kebab-case.
pub fn nearest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let name = name.replace('_', "-");
    known
        .into_iter()
        .map(|k| k.replace('_', "-"))
        .map(|k| (edit_distance(&name, &k), k))
        .filter(|(d, k)| *d <= (k.len() / 4).clamp(1, 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance between `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_finds_the_name_and_a_stranger_nothing() {
        let known = ["learning_rate", "num_train_epochs", "seed"];
        assert_eq!(
            nearest("learning-rat", known).as_deref(),
            Some("learning-rate")
        );
        assert_eq!(
            nearest("num-train-epoch", known).as_deref(),
            Some("num-train-epochs")
        );
        assert_eq!(nearest("batch", known), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
