//! `cargo xtask equivalence`: every case of the equivalence matrix (afterburner-demos'
//! `equivalence` module), a table of verdicts and differences on stdout and in
//! docs/equivalence.md. Exits 1 when a case fails.

use std::fmt::Write as _;
use std::time::Instant;

use afterburner_demos::equivalence::{
    FLOOR_FACTOR, HALF_ERRORS, Outcome, References, Verdict, all_cases, initial_model, sample,
};

/// The command's help.
pub const USAGE: &str = "usage: cargo xtask equivalence [--sample <cases per strategy>] \
[--only <text in the case's row>] [--out <file>] (default: every case, written to \
docs/equivalence.md)";

/// Runs the matrix (or its sample) and writes the table.
pub fn run(args: &[String]) -> Result<bool, String> {
    let mut per_strategy = None;
    let mut only: Option<String> = None;
    let mut out = Some(std::path::PathBuf::from("docs/equivalence.md"));
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--sample" => {
                let n = value()?;
                per_strategy = Some(n.parse::<usize>().map_err(|_| {
                    format!("--sample takes a number of cases per strategy, not {n:?}")
                })?);
                out = None;
            }
            "--out" => out = Some(value()?.into()),
            "--only" => {
                only = Some(value()?.clone());
                out = None;
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    let cases: Vec<_> = match per_strategy {
        Some(n) => sample(n),
        None => all_cases(),
    }
    .into_iter()
    .filter(|case| {
        only.as_ref()
            .is_none_or(|text| case.to_string().contains(text.as_str()))
    })
    .collect();
    let started = Instant::now();
    let mut references = References::new(initial_model());
    let mut outcomes = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let outcome = references.judge(case);
        println!("{:>4}/{} {}", i + 1, cases.len(), row(&outcome));
        outcomes.push(outcome);
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = report(&outcomes, seconds, per_strategy);
    let failed = outcomes.iter().filter(|o| !o.passed()).count();
    println!("\n{}", summary(&outcomes, seconds));
    if let Some(path) = out {
        std::fs::write(&path, report).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("written to {}", path.display());
    }
    Ok(failed == 0)
}

fn figure(value: Option<f64>) -> String {
    value.map_or("".into(), |v| format!("{v:.1e}"))
}

/// One table row: the case's axes, its verdict, its error and bound, the precision's own
/// error, the note.
fn row(outcome: &Outcome) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} |",
        outcome.case,
        verdict(&outcome.verdict),
        figure(outcome.error),
        figure(outcome.bound),
        figure(outcome.precision_error),
        outcome.note.replace('|', "/").replace('\n', " "),
    )
}

fn verdict(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Equal => "equal",
        Verdict::ByDesign => "differs by design",
        Verdict::Refused => "refused by name",
        Verdict::Differs => "DIFFERS",
        Verdict::Broken => "BROKEN",
    }
}

fn summary(outcomes: &[Outcome], seconds: f64) -> String {
    let count = |v: Verdict| outcomes.iter().filter(|o| o.verdict == v).count();
    format!(
        "{} cases in {seconds:.0} s: {} equal, {} refused by name, {} differ by design, {} differ, {} broken",
        outcomes.len(),
        count(Verdict::Equal),
        count(Verdict::Refused),
        count(Verdict::ByDesign),
        count(Verdict::Differs),
        count(Verdict::Broken),
    )
}

/// docs/equivalence.md: how the matrix is built and judged, then every case.
fn report(outcomes: &[Outcome], seconds: f64, per_strategy: Option<usize>) -> String {
    let mut text = String::new();
    let command = match per_strategy {
        Some(n) => format!("cargo xtask equivalence --sample {n}"),
        None => "cargo xtask equivalence".into(),
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|name| name.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let _ = write!(
        text,
        "# The equivalence matrix\n\n\
         Every fast path must train like the plain one. The harness (afterburner-demos, \
         `equivalence` module) trains a 2-block transformer (width 16, 4 heads, bytes of the \
         built-in text) for 2 optimizer steps in every combination a user configures and \
         compares the whole model's parameters with the one-device run of the same data at the \
         same precision:\n\n\
         - **strategy**: single-device, ddp (its defaults: one bucket; and in 4 KiB buckets, \
         several a step, during backward and with `overlap = false`), zero-1, fsdp under each \
         sharding strategy (every transformer block a unit), tp 2, dp 2 x tp 2 under ddp and \
         under fsdp, local-sgd K=1 (2 ranks, 4 for dp x tp, in-process);\n\
         - **micro-batches** per step: 1 (DDP and ZeRO-1 reduce their buckets during \
         backward) or 3;\n\
         - **normalisation**: `mean` (whole windows, the mean over each micro-batch) or \
         `per-item` (windows cut to 3 to 8 targets and padded; the step's loss summed over \
         every rank's and micro-batch's targets, divided by their number: HF's \
         `num_items_in_batch` in the loop, `loss_normalization = \"per-item\"` in the Trainer);\n\
         - **precision**: 32-true, bf16-mixed, 16-mixed (per-op autocast);\n\
         - **checkpointing** of every block: none or all;\n\
         - **loss**: `plain`, `aux`, which adds a penalty on the head's weights read outside \
         `acc.forward`, or `forward`, which adds a term from a second, plain forward of the \
         model outside `acc.forward` (not under FSDP that shards parameters: there the model \
         outside `acc.forward` holds shards and a forward on them panics inside Burn, not yet \
         a named error);\n\
         - **step**: `host` (`acc.step`, plain SGD, under which any error in a gradient shows \
         in the update) or `device` (`DeviceAdamW` / `step_on_device`, the Trainer's default \
         AdamW; Local SGD is in the matrix with SGD only: under AdamW its ranks' moments see \
         only their own gradients, by design);\n\
         - **entry**: a hand-written Accelerator `loop` or the `trainer`.\n\n\
         **Judged** by `error = |params - reference| / |reference - initial|`: the difference \
         on the scale of the update itself. The reference is one device training each step's \
         items as one batch, host-decided, with the case's optimizer and precision. The bound \
         is the case's own: 1e-6 at 32-true (1e-4 at the half precisions), or {FLOOR_FACTOR} \
         times the case's reordering floor where larger (the same one-device run with the step \
         split as the case splits it, data-parallel ranks times micro-batches and in two at least: \
         the difference that summing in another order makes on this CPU); a half precision may also differ by \
         {HALF_ERRORS} times its own error against 32-true (the `precision` column), and Local SGD, which averages \
         parameters, by 1e-6 of the model's scale. A case passes when it is within its bound, \
         when it is refused with the named error the matrix expects, or where the matrix says \
         why it differs by design.\n\n\
         Run: `{command}` ({seconds:.0} s on {cpu}). CI runs a fixed sample: the \
         `equivalence` test of afterburner-demos (`cargo test -p afterburner-demos --test \
         equivalence`).\n\n{}\n\n\
         | strategy | micro-batches | normalisation | precision | checkpointing | loss | step | entry | verdict | error | bound | precision | note |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        summary(outcomes, seconds),
    );
    for outcome in outcomes {
        let _ = writeln!(text, "{}", row(outcome));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_sample_size_is_named() {
        let err = run(&["--sample".into(), "many".into()]).unwrap_err();
        assert!(err.contains("--sample") && err.contains("many"), "{err}");
        let err = run(&["--samples".into()]).unwrap_err();
        assert!(err.contains("unknown option --samples"), "{err}");
    }

    #[test]
    fn a_row_names_every_axis() {
        let case = &all_cases()[0];
        assert_eq!(case.to_string().matches('|').count(), 7);
    }
}
