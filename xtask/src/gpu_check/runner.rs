//! Runs the backend suite and the presets on one backend and writes the report; under
//! `--perf`, the PyTorch twins first, then the tensor-parallel check and the focused presets,
//! the report written again after each part (a run cut short keeps what it measured).

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::backend::Autodiff;
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use xtask::suite;

use super::report::Report;
use super::{Exit, Options, cuda_env};
use crate::bench;

/// The suite on `I`'s default device, then the presets on all of `I`'s devices.
pub fn run_on<I: Backend>(options: &Options) -> Exit {
    let device = I::Device::default();
    let probe = catch_unwind(AssertUnwindSafe(|| {
        let name = I::name(&device);
        let dtypes: Vec<(String, bool)> = [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .map(|d| (format!("{d:?}"), I::supports_dtype(&device, d)))
            .collect();
        (name, dtypes)
    }));
    let Ok((backend_name, dtypes)) = probe else {
        eprintln!(
            "gpu-check: the {} backend could not open its device (see the message above)",
            options.backend
        );
        return Exit::NoDevice;
    };
    println!("gpu-check: {backend_name}; dtypes {dtypes:?}");
    let (device_name, driver) = if options.backend == "cuda" {
        cuda_env::device_and_driver()
    } else {
        (None, None)
    };
    let mut report = Report {
        backend: options.backend.clone(),
        backend_name,
        built_with: super::report::built_with::<I>(),
        gpus: if options.backend == "cuda" {
            cuda_env::gpus()
        } else {
            Vec::new()
        },
        device: device_name,
        driver,
        dtypes,
        checks: Vec::new(),
        presets: Vec::new(),
        presets_error: None,
        all_reduce: None,
        twins: Vec::new(),
        twins_error: None,
    };
    if options.perf {
        // The twins first: a minute of Python, kept even if the Rust side runs out of time.
        match super::twins::run(options) {
            Ok(rows) => report.twins = rows,
            Err(e) => report.twins_error = Some(e),
        }
        write_partial(&report, options);
    }
    let chosen = |name: &str| match (&options.only, options.perf) {
        (Some(only), _) => only.iter().any(|o| o == name),
        (None, true) => PERF_CHECKS.contains(&name),
        (None, false) => true,
    };
    for check in suite::checks::<Autodiff<I>>() {
        if !chosen(check.name) {
            continue;
        }
        let outcome = suite::run_check(&check, &device);
        println!(
            "gpu-check: {} {} ({:.1} s): {}",
            outcome.name,
            if outcome.passed { "passed" } else { "FAILED" },
            outcome.seconds,
            outcome.detail
        );
        report.checks.push(outcome);
    }
    if options.only.is_none() && !options.perf {
        let all_reduce = catch_unwind(AssertUnwindSafe(|| {
            bench::bandwidth::all_reduce::<I>(64, 10)
        }))
        .unwrap_or_else(|_| Err("panicked (see the message above)".into()));
        println!("gpu-check: all-reduce {all_reduce:?}");
        report.all_reduce = Some(all_reduce);
    }
    write_partial(&report, options);
    let bench_options = bench::Options {
        backend: options.backend.clone(),
        steps: 10,
        warmup: 3,
        batch_size: 0,
        rounds: 1,
        out: options.out.clone(),
        models: "all".into(),
        preset: Some("all".into()),
        quick: options.quick,
    };
    let presets = match (&options.only, options.perf) {
        (Some(_), _) => Ok(Ok(Vec::new())),
        (None, true) => catch_unwind(AssertUnwindSafe(|| {
            let mut partial = |rows: &[bench::presets::Row]| {
                report.presets = rows.to_vec();
                write_partial(&report, options);
            };
            bench::perf::rows::<I>(&bench_options, &mut partial)
        })),
        (None, false) => catch_unwind(AssertUnwindSafe(|| {
            bench::presets::rows::<I>(&bench_options)
        })),
    };
    match presets {
        Ok(Ok(rows)) => report.presets = rows,
        Ok(Err(e)) => report.presets_error = Some(e),
        Err(_) => report.presets_error = Some("panicked (see the message above)".into()),
    }
    println!("{}", report.markdown());
    if let Err(e) = report.write(&options.out) {
        eprintln!("gpu-check: {e}");
        return Exit::Usage;
    }
    if report.passed() {
        Exit::Passed
    } else {
        Exit::Failed
    }
}

/// The backend suite's checks `--perf` runs: the one whose CUDA figure is open (TF32).
const PERF_CHECKS: &[&str] = &["tensor_parallel_equals_one_device"];

/// Writes the report so far (a `--perf` run cut short keeps what it measured); a failure is
/// reported and the run goes on (the final write reports it as the exit code).
fn write_partial(report: &Report, options: &Options) {
    if let Err(e) = report.write(&options.out) {
        eprintln!("gpu-check: {e}");
    }
}
