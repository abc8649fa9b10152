//! Runs the backend suite and the presets on one backend and writes the report.

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
    let mut checks = Vec::new();
    let chosen = |name: &str| {
        options
            .only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
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
        checks.push(outcome);
    }
    let all_reduce = match options.only {
        Some(_) => Err("not run (--only)".to_string()),
        None => catch_unwind(AssertUnwindSafe(|| {
            bench::bandwidth::all_reduce::<I>(64, 10)
        }))
        .unwrap_or_else(|_| Err("panicked (see the message above)".into())),
    };
    println!("gpu-check: all-reduce {all_reduce:?}");
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
    let presets = match options.only {
        Some(_) => Ok(Ok(Vec::new())),
        None => catch_unwind(AssertUnwindSafe(|| {
            bench::presets::rows::<I>(&bench_options)
        })),
    };
    let (presets, presets_error) = match presets {
        Ok(Ok(rows)) => (rows, None),
        Ok(Err(e)) => (Vec::new(), Some(e)),
        Err(_) => (Vec::new(), Some("panicked (see the message above)".into())),
    };
    let (device_name, driver) = if options.backend == "cuda" {
        cuda_env::device_and_driver()
    } else {
        (None, None)
    };
    let report = Report {
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
        checks,
        presets,
        presets_error,
        all_reduce,
    };
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
