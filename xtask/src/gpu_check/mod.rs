//! `cargo xtask gpu-check`: the backend suite on the first CUDA device, then the bench presets,
//! in one report (markdown and JSON). See docs/gpu.md.
//!
//! Built without the `cuda` feature (the default), it builds a release binary with it and runs
//! that; the binary also runs alone on a GPU machine without cargo, finding CUDA's libraries
//! itself. Exit codes: see [`Exit`].

mod cuda_env;
mod report;
mod runner;

use std::process::Command;

/// The command line.
pub const USAGE: &str =
    "usage: cargo xtask gpu-check [--dry-run] [--quick] [--out DIR] [--backend B]
  --dry-run    list what it would run and check that a CUDA device is there; run nothing
  --quick      the bench presets with tiny step counts (as CI runs them on flex)
  --out DIR    where the report goes (default bench-results/gpu-check)
  --backend B  cuda (default), or flex / wgpu to try the same run without a GPU
exit codes: 0 every check passed, 1 a check or preset failed, 2 bad arguments or the build
failed, 3 no CUDA device (or CUDA's libraries are missing)";

/// How gpu-check ends (its process exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: every check and preset ran and passed (or the dry run found a device).
    Passed = 0,
    /// 1: a check or a preset failed (the report says which).
    Failed = 1,
    /// 2: bad arguments, or building the CUDA binary failed.
    Usage = 2,
    /// 3: no CUDA device, or CUDA's run-time libraries are missing.
    NoDevice = 3,
}

impl Exit {
    /// The exit of a gpu-check run in a child process.
    fn of_child(status: std::io::Result<std::process::ExitStatus>) -> Exit {
        match status.ok().and_then(|s| s.code()) {
            Some(0) => Exit::Passed,
            Some(1) => Exit::Failed,
            Some(3) => Exit::NoDevice,
            _ => Exit::Usage,
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
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        dry_run: false,
        quick: false,
        out: "bench-results/gpu-check".into(),
        backend: "cuda".into(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dry-run" => o.dry_run = true,
            "--quick" => o.quick = true,
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
            other => return Err(format!("unknown option {other}")),
        }
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
    if options.dry_run {
        println!("gpu-check: dry run on {}", options.backend);
        return Exit::Passed;
    }
    match options.backend.as_str() {
        #[cfg(feature = "flex")]
        "flex" => runner::run_on::<burn::backend::Flex>(options),
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
    let needs_cuda_path = std::env::var_os("CUDA_PATH").is_none() && libraries.cuda_path.is_some();
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
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("gpu-check: cargo {}", BUILD_ARGS.join(" "));
    let built = Command::new(&cargo)
        .args(BUILD_ARGS)
        .current_dir(&workspace)
        .status();
    match built {
        Ok(status) if status.success() => {}
        Ok(_) => return Exit::Usage,
        Err(e) => {
            eprintln!(
                "gpu-check: this binary has no CUDA backend and cargo cannot run ({e}); on a \
                 machine with cargo, run `cargo {}` and copy target/release/xtask here",
                BUILD_ARGS.join(" ")
            );
            return Exit::Usage;
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let binary = target.join("release").join("xtask");
    let mut full = vec!["gpu-check".to_string()];
    full.extend(args.iter().cloned());
    let mut command = Command::new(&binary);
    command.args(&full);
    with_cuda_paths(&mut command, &libraries);
    let status = command.status();
    if let Err(e) = &status {
        eprintln!("gpu-check: cannot run {}: {e}", binary.display());
    }
    Exit::of_child(status)
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
    if std::env::var_os("CUDA_PATH").is_none()
        && let Some(cuda) = &libraries.cuda_path
    {
        command.env("CUDA_PATH", cuda);
    }
}

/// The build that gives a binary with the CUDA backend.
const BUILD_ARGS: &[&str] = &["build", "--release", "-p", "xtask", "--features", "cuda"];

fn print_plan(options: &Options) {
    println!("gpu-check plan:");
    if cfg!(feature = "cuda") {
        println!("  1. build: none (this binary has the CUDA backend)");
    } else {
        println!("  1. build: cargo {}", BUILD_ARGS.join(" "));
    }
    println!("  2. the backend suite on the first CUDA device:");
    for name in xtask::suite::CHECK_NAMES {
        println!("     - {name}");
    }
    println!(
        "  3. the bench presets on every visible CUDA device{}:",
        if options.quick { " (quick)" } else { "" }
    );
    for preset in crate::bench::PRESET_NAMES {
        println!(
            "     - {preset}: 32-true, bf16-mixed, 16-mixed; checkpointing off/on; one device and DDP/FSDP"
        );
    }
    println!(
        "  4. report: {0}/gpu-check.md and {0}/gpu-check.json",
        options.out
    );
    println!("exit codes: 0 passed, 1 a check failed, 2 bad arguments or build, 3 no CUDA device");
}
