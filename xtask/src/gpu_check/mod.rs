//! `cargo xtask gpu-check`: the backend suite on the first CUDA device, then the bench presets,
//! in one report (markdown and JSON). See docs/gpu.md.
//!
//! Built without the `cuda` feature (the default), it builds a release binary with it and runs
//! that; the binary also runs alone on a GPU machine without cargo, finding CUDA's libraries
//! itself. Exit codes: see [`Exit`].

mod cuda_env;
mod report;
mod runner;
mod twins;

use std::process::Command;
use xtask::suite;

/// The command line.
pub const USAGE: &str =
    "usage: cargo xtask gpu-check [--dry-run] [--quick] [--perf [--compile]] [--only CHECKS] [--out DIR] [--backend B]
  --dry-run    list what it would run and check that a CUDA device is there; run nothing
  --quick      the bench presets with tiny step counts (as CI runs them on flex)
  --perf       the short session's run (docs/gpu.md): the PyTorch twins of GPT-2 small and
               ViT-B/16, the tensor-parallel check, then the two presets at 32-true and
               bf16-mixed on one device; the report is rewritten after each part
  --compile    with --perf: the twins also under torch.compile
  --only C,..  only these checks of the backend suite (no all-reduce, no presets)
  --out DIR    where the report goes (default bench-results/gpu-check)
  --backend B  cuda (default), or flex / wgpu to try the same run without a GPU
exit codes: 0 every check passed, 1 a check or preset failed (or the run crashed), 2 bad
arguments, the build failed or the report could not be written, 3 no CUDA device (or CUDA's
libraries are missing)";

/// How gpu-check ends (its process exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: every check and preset ran and passed (or the dry run found a device).
    Passed = 0,
    /// 1: a check or a preset failed (the report says which), or the run crashed.
    Failed = 1,
    /// 2: bad arguments, building the CUDA binary failed, or the report could not be written.
    Usage = 2,
    /// 3: no CUDA device, or CUDA's run-time libraries are missing.
    NoDevice = 3,
}

impl Exit {
    /// The exit of a gpu-check run in a child process.
    /// A crash of the child (a panic, the OOM killer) is a failed check run.
    fn of_child(status: std::io::Result<std::process::ExitStatus>) -> Exit {
        let Ok(status) = status else {
            return Exit::Usage;
        };
        match status.code() {
            Some(0) => Exit::Passed,
            Some(2) => Exit::Usage,
            Some(3) => Exit::NoDevice,
            _ => {
                eprintln!("gpu-check: the CUDA run ended with {status}");
                Exit::Failed
            }
        }
    }
}

/// Settings of one gpu-check run.
#[derive(Debug, Clone)]
pub struct Options {
    /// List and probe only.
    pub dry_run: bool,
    /// Presets with tiny step counts.
    pub quick: bool,
    /// Report directory.
    pub out: String,
    /// The backend: "cuda", or "flex" / "wgpu" (the same run without an NVIDIA GPU).
    pub backend: String,
    /// Only these checks of the suite, and neither the all-reduce nor the presets.
    pub only: Option<Vec<String>>,
    /// The short session's focused run (twins, the tensor-parallel check, two presets).
    pub perf: bool,
    /// With `perf`: the twins under `torch.compile` as well.
    pub compile: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        dry_run: false,
        quick: false,
        out: "bench-results/gpu-check".into(),
        backend: "cuda".into(),
        only: None,
        perf: false,
        compile: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dry-run" => o.dry_run = true,
            "--quick" => o.quick = true,
            "--perf" => o.perf = true,
            "--compile" => o.compile = true,
            "--out" => {
                o.out = it
                    .next()
                    .ok_or_else(|| "--out needs a directory".to_string())?
                    .clone()
            }
            "--backend" => {
                o.backend = it
                    .next()
                    .ok_or_else(|| "--backend needs a name".to_string())?
                    .clone()
            }
            "--only" => {
                let names = it
                    .next()
                    .ok_or_else(|| "--only needs check names".to_string())?;
                let names: Vec<String> = names.split(',').map(|n| n.trim().to_string()).collect();
                if let Some(bad) = names
                    .iter()
                    .find(|n| !suite::CHECK_NAMES.contains(&n.as_str()))
                {
                    return Err(format!(
                        "--only {bad}: no such check (the checks: {})",
                        suite::CHECK_NAMES.join(", ")
                    ));
                }
                o.only = Some(names);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.compile && !o.perf {
        return Err("--compile goes with --perf".into());
    }
    Ok(o)
}

/// Runs gpu-check with the arguments after `gpu-check`; returns the exit code.
pub fn run(args: &[String]) -> Exit {
    let options = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-check: {e}\n{USAGE}");
            return Exit::Usage;
        }
    };
    if options.dry_run {
        print_plan(&options);
    }
    if options.backend != "cuda" {
        return other_backend(&options);
    }
    let gpus = cuda_env::gpus();
    if gpus.is_empty() {
        eprintln!(
            "gpu-check: no CUDA device found (`nvidia-smi -L` lists none and \
             /proc/driver/nvidia/gpus is absent); run it on a machine with an NVIDIA GPU and \
             its driver (exit code {})",
            Exit::NoDevice as i32
        );
        return Exit::NoDevice;
    }
    println!("gpu-check: found {}", gpus.join("; "));
    let libraries = cuda_env::libraries();
    if !libraries.missing.is_empty() {
        eprintln!(
            "gpu-check: CUDA's run-time pieces are missing: {} (exit code {})",
            libraries.missing.join("; "),
            Exit::NoDevice as i32
        );
        return Exit::NoDevice;
    }
    if options.dry_run {
        println!("gpu-check: dry run; a CUDA device and CUDA's libraries are there");
        return Exit::Passed;
    }
    run_with_cuda(args, &options, libraries)
}

/// gpu-check's run on flex or wgpu (no GPU needed: it tries the whole pipeline).
fn other_backend(options: &Options) -> Exit {
    let dry = |backend: &str| {
        println!("gpu-check: dry run; {backend} is compiled in");
        Exit::Passed
    };
    match options.backend.as_str() {
        #[cfg(feature = "flex")]
        "flex" if options.dry_run => dry("flex"),
        #[cfg(feature = "flex")]
        "flex" => runner::run_on::<burn::backend::Flex>(options),
        #[cfg(feature = "wgpu")]
        "wgpu" if options.dry_run => dry("wgpu"),
        #[cfg(feature = "wgpu")]
        "wgpu" => runner::run_on::<burn::backend::Wgpu>(options),
        other => {
            eprintln!(
                "gpu-check: backend '{other}' is not compiled in (build xtask with \
                 --features {other}); valid: cuda, flex, wgpu"
            );
            Exit::Usage
        }
    }
}

/// With the `cuda` feature: makes sure the loader and the backend find CUDA's libraries and
/// headers (running itself again with `LD_LIBRARY_PATH` / `CUDA_PATH` set when they are only
/// under the toolkit), then runs.
#[cfg(feature = "cuda")]
fn run_with_cuda(args: &[String], options: &Options, libraries: cuda_env::CudaLibraries) -> Exit {
    const AGAIN: &str = "AFTERBURNER_GPU_CHECK_ENV_SET";
    let needs_path = !libraries.add_to_library_path.is_empty();
    let needs_cuda_path = libraries.cuda_path.is_some();
    if (needs_path || needs_cuda_path) && std::env::var_os(AGAIN).is_none() {
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("gpu-check: cannot find its own binary to set CUDA's paths: {e}");
                return Exit::Usage;
            }
        };
        let mut command = Command::new(exe);
        command.arg("gpu-check").args(args).env(AGAIN, "1");
        with_cuda_paths(&mut command, &libraries);
        println!(
            "gpu-check: running again with LD_LIBRARY_PATH += {:?}, CUDA_PATH = {:?}",
            libraries.add_to_library_path, libraries.cuda_path
        );
        return Exit::of_child(command.status());
    }
    runner::run_on::<burn::backend::Cuda>(options)
}

/// Without the `cuda` feature: builds the release binary with it and runs that.
#[cfg(not(feature = "cuda"))]
fn run_with_cuda(args: &[String], _: &Options, libraries: cuda_env::CudaLibraries) -> Exit {
    const BUILT: &str = "AFTERBURNER_GPU_CHECK_BUILT";
    if std::env::var_os(BUILT).is_some() {
        eprintln!(
            "gpu-check: the binary built for CUDA has no CUDA backend (was the build changed?)"
        );
        return Exit::Usage;
    }
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("gpu-check: cargo {}", BUILD_ARGS.join(" "));
    let built = Command::new(&cargo)
        .args(BUILD_ARGS)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(&workspace)
        .stderr(std::process::Stdio::inherit())
        .output();
    let binary = match built {
        Ok(out) if out.status.success() => match built_binary(&out.stdout) {
            Some(binary) => binary,
            None => {
                eprintln!("gpu-check: cargo built no xtask binary");
                return Exit::Usage;
            }
        },
        Ok(_) => return Exit::Usage,
        Err(e) => {
            eprintln!(
                "gpu-check: this binary has no CUDA backend and cargo cannot run ({e}); on a \
                 machine with cargo, run `cargo {}` and copy target/release/xtask here",
                BUILD_ARGS.join(" ")
            );
            return Exit::Usage;
        }
    };
    let mut command = Command::new(&binary);
    command.arg("gpu-check").args(args).env(BUILT, "1");
    with_cuda_paths(&mut command, &libraries);
    let status = command.status();
    if let Err(e) = &status {
        eprintln!("gpu-check: cannot run {}: {e}", binary.display());
    }
    Exit::of_child(status)
}

/// The xtask binary's path in cargo's JSON messages.
#[cfg(not(feature = "cuda"))]
fn built_binary(messages: &[u8]) -> Option<std::path::PathBuf> {
    String::from_utf8_lossy(messages)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "xtask")
        .filter_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
        .next_back()
}

/// Sets `LD_LIBRARY_PATH` (the toolkit's library directories first) and `CUDA_PATH` for a
/// run of the CUDA binary.
fn with_cuda_paths(command: &mut Command, libraries: &cuda_env::CudaLibraries) {
    if !libraries.add_to_library_path.is_empty() {
        let mut paths = libraries.add_to_library_path.clone();
        paths.extend(std::env::split_paths(
            &std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default(),
        ));
        command.env(
            "LD_LIBRARY_PATH",
            std::env::join_paths(paths).unwrap_or_default(),
        );
    }
    if let Some(cuda) = &libraries.cuda_path {
        command.env("CUDA_PATH", cuda);
    }
}

/// The build that gives a binary with the CUDA backend.
const BUILD_ARGS: &[&str] = &["build", "--release", "-p", "xtask", "--features", "cuda"];

fn print_plan(options: &Options) {
    println!("gpu-check plan:");
    if options.backend != "cuda" {
        println!(
            "  1. build: none (backend {}, no CUDA device needed)",
            options.backend
        );
    } else if cfg!(feature = "cuda") {
        println!("  1. build: none (this binary has the CUDA backend)");
    } else {
        println!("  1. build: cargo {}", BUILD_ARGS.join(" "));
    }
    let devices = if options.backend == "cuda" {
        "CUDA device"
    } else {
        "device"
    };
    if options.perf {
        println!(
            "  2. the PyTorch twins (xtask/torch/preset_twins.py): gpt2-small and vit-b16 at \
             32-true and bf16-mixed, eager{}, TF32 as Burn's CUDA matmuls use it",
            if options.compile {
                " and torch.compile"
            } else {
                ""
            }
        );
        println!("  3. the backend suite's tensor_parallel_equals_one_device");
        println!(
            "  4. gpt2-small (batch 8 x 1024) and vit-b16 (batch 64, 224 px) at 32-true and \
             bf16-mixed on one {devices}{}",
            if options.quick { " (quick shapes)" } else { "" }
        );
        println!(
            "  5. report: {0}/gpu-check.md and {0}/gpu-check.json, rewritten after each part",
            options.out
        );
        return;
    }
    println!("  2. the backend suite on the first {devices}:");
    for name in xtask::suite::CHECK_NAMES {
        println!("     - {name}");
    }
    println!("  3. an all-reduce of 64 MiB over every {devices} (bandwidth)");
    println!(
        "  4. the bench presets on every visible {devices}{}:",
        if options.quick { " (quick)" } else { "" }
    );
    for preset in crate::bench::PRESET_NAMES {
        println!(
            "     - {preset}: 32-true, bf16-mixed, 16-mixed; checkpointing off/on; one device and DDP/FSDP"
        );
    }

    println!(
        "  5. report: {0}/gpu-check.md and {0}/gpu-check.json",
        options.out
    );
    println!(
        "exit codes: 0 passed, 1 a check failed or the run crashed, 2 bad arguments, build or \
         report, 3 no CUDA device"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_unknown_flags() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&[
            "--dry-run",
            "--quick",
            "--out",
            "r",
            "--backend",
            "flex",
        ]))
        .unwrap();
        assert!(o.dry_run && o.quick);
        assert_eq!((o.out.as_str(), o.backend.as_str()), ("r", "flex"));
        assert!(parse(&args(&["--out"])).is_err());
        assert!(parse(&args(&["--bogus"])).is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn the_built_binary_comes_from_cargos_messages() {
        let messages = br#"{"reason":"compiler-artifact","target":{"name":"burn","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"xtask","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"xtask","kind":["bin"]},"executable":"/t/release/xtask"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            built_binary(messages),
            Some(std::path::PathBuf::from("/t/release/xtask"))
        );
        assert_eq!(built_binary(b"not json"), None);
    }

    #[test]
    fn a_crashed_child_is_a_failure_not_a_usage_error() {
        use std::os::unix::process::ExitStatusExt;
        let code = |c: i32| Ok(std::process::ExitStatus::from_raw(c << 8));
        assert_eq!(Exit::of_child(code(0)), Exit::Passed);
        assert_eq!(Exit::of_child(code(3)), Exit::NoDevice);
        assert_eq!(Exit::of_child(code(101)), Exit::Failed);
        assert_eq!(
            Exit::of_child(Ok(std::process::ExitStatus::from_raw(9))),
            Exit::Failed
        );
    }
}
