//! CI's sample of the equivalence matrix (docs/equivalence.md): for every strategy a few
//! cases that together take every value of every axis; each one trains like one device
//! within its bound, or is refused with the named error the matrix expects.
//! `cargo xtask equivalence` runs every case.

use afterburner_demos::equivalence::{References, initial_model, sample};

#[test]
fn the_sample_of_the_matrix_trains_like_one_device() {
    let per_strategy = std::env::var("AFTERBURNER_EQUIVALENCE_SAMPLE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(16);
    let mut references = References::new(initial_model());
    let mut failed = Vec::new();
    for case in sample(per_strategy) {
        let outcome = references.judge(&case);
        println!(
            "{case} | {:?} | error {:?} bound {:?} precision {:?} | {}",
            outcome.verdict, outcome.error, outcome.bound, outcome.precision_error, outcome.note
        );
        if !outcome.passed() {
            failed.push(format!("{case}: {:?} {}", outcome.verdict, outcome.note));
        }
    }
    assert!(failed.is_empty(), "cases that fail:\n{}", failed.join("\n"));
}
