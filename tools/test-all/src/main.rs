//! `cargo test-all [ARGS]`: runs `cargo test --workspace`, adding the suites whose system
//! packages this machine has, and says which it skipped and how to install what they need.
//! Extra arguments go to every `cargo test` it runs (e.g. `cargo test-all -- --nocapture`).
//! The exit code is the first failing `cargo test`'s, 0 when all pass.
//!
//! Suites behind system packages:
//! - MPI (`--features mpi`: multi-process runs under `mpirun`): Open MPI and libclang.
//! - wgpu (the backend suite of xtask/src/suite on Burn's wgpu backend): a Vulkan loader and
//!   driver; Mesa's software driver (lavapipe) runs it on a machine with no GPU.
//! - tensorboard (crates/accelerate/tests/tensorboard.rs reads the Trainer's event files with
//!   TensorBoard's own reader): a Python (`AFTERBURNER_PYTHON`, else `python3`) with the
//!   `tensorboard` package. The test skips itself where it is missing; this says so at the end.

use std::path::Path;
use std::process::{Command, ExitCode};

/// The Debian/Ubuntu packages the MPI suites need.
const MPI_PACKAGES: &str = "libopenmpi-dev openmpi-bin libclang-dev";
/// The Debian/Ubuntu packages of the Vulkan loader and Mesa's drivers (lavapipe on the CPU).
const VULKAN_PACKAGES: &str = "libvulkan1 mesa-vulkan-drivers";

/// How to install what the TensorBoard reader test needs.
const TENSORBOARD_INSTALL: &str = "python3 -m pip install tensorboard";

/// Set to a comma-separated list of suites (`mpi`, `wgpu`, `tensorboard`) that must run: a machine missing
/// their packages then fails instead of skipping them (CI sets it).
const REQUIRE: &str = "AFTERBURNER_REQUIRE_SUITES";

fn main() -> ExitCode {
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let mpi = missing_for_mpi();
    let vulkan = missing_for_vulkan();
    let tensorboard = missing_for_tensorboard();
    let required = std::env::var(REQUIRE).unwrap_or_default();
    for (suite, missing) in [
        ("mpi", &mpi),
        ("wgpu", &vulkan),
        ("tensorboard", &tensorboard),
    ] {
        if let Some(missing) = missing
            && required.split(',').any(|r| r.trim() == suite)
        {
            eprintln!(
                "test-all: the {suite} suites are required ({REQUIRE}) but {missing} is missing"
            );
            return ExitCode::from(2);
        }
    }
    // Every test binary runs even after one fails, so a failure does not hide the others.
    let mut workspace = vec![
        "test".to_string(),
        "--workspace".to_string(),
        "--no-fail-fast".to_string(),
    ];
    match &mpi {
        None => workspace.extend(["--features".to_string(), "mpi".to_string()]),
        Some(missing) => {
            println!("test-all: skipping the MPI suites ({missing} not found)");
            println!("test-all: to run them: sudo apt-get install -y {MPI_PACKAGES}");
        }
    }
    let (cargo_side, test_side) = split_extra(&extra);
    workspace.extend(cargo_side.iter().cloned());
    if !test_side.is_empty() {
        workspace.push("--".into());
        workspace.extend(test_side.iter().cloned());
    }
    let mut runs = vec![(workspace, Vec::new())];
    match &vulkan {
        None => runs.push((wgpu_suite(cargo_side, test_side), wgpu_env())),
        Some(missing) => {
            println!("test-all: skipping the wgpu backend suite ({missing} not found)");
            println!("test-all: to run it: sudo apt-get install -y {VULKAN_PACKAGES}");
        }
    }
    let mut code = 0;
    for (args, env) in runs {
        let status = cargo(&args, &env);
        if code == 0 && status != 0 {
            code = status;
        }
    }
    if let Some(missing) = &mpi {
        println!(
            "test-all: the MPI suites were skipped ({missing} not found; sudo apt-get install \
             -y {MPI_PACKAGES})"
        );
    }
    if let Some(missing) = &vulkan {
        println!(
            "test-all: the wgpu backend suite was skipped ({missing} not found; sudo apt-get \
             install -y {VULKAN_PACKAGES})"
        );
    }
    if let Some(missing) = &tensorboard {
        println!(
            "test-all: the TensorBoard reader test was skipped ({missing}; {TENSORBOARD_INSTALL}, \
             or set AFTERBURNER_PYTHON to a Python that has it)"
        );
    }
    ExitCode::from(code)
}

/// What the TensorBoard reader test lacks (`None`: nothing): a Python that imports
/// `tensorboard` (`AFTERBURNER_PYTHON`, else `python3`).
fn missing_for_tensorboard() -> Option<String> {
    let python = std::env::var("AFTERBURNER_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let found = Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|out| out.status.success());
    match found {
        true => None,
        false => Some(format!("{python} cannot import tensorboard")),
    }
}

/// The caller's arguments: those for cargo (before `--`) and those for the test binaries.
fn split_extra(extra: &[String]) -> (&[String], &[String]) {
    match extra.iter().position(|a| a == "--") {
        Some(i) => (&extra[..i], &extra[i + 1..]),
        None => (extra, &[]),
    }
}

/// The backend suite's wgpu tests only (its flex tests ran in the workspace run). Of the
/// caller's arguments it takes the build and output settings (`--release`, `--offline`,
/// `--nocapture`, `--test-threads=N`, ...), not test filters or package selections, which
/// name the workspace run's tests.
fn wgpu_suite(cargo_side: &[String], test_side: &[String]) -> Vec<String> {
    const CARGO_FLAGS: &[&str] = &[
        "--release",
        "--offline",
        "--locked",
        "--frozen",
        "-q",
        "--quiet",
        "-v",
        "--verbose",
    ];
    const TEST_FLAGS: &[&str] = &["--nocapture", "--show-output", "--quiet", "-q"];
    let mut args: Vec<String> = ["test", "-p", "xtask", "--features", "wgpu"]
        .map(String::from)
        .to_vec();
    args.extend(
        cargo_side
            .iter()
            .filter(|a| CARGO_FLAGS.contains(&a.as_str()))
            .cloned(),
    );
    args.extend(["--test", "backend_suite", "--", "wgpu"].map(String::from));
    args.extend(
        test_side
            .iter()
            .filter(|a| TEST_FLAGS.contains(&a.as_str()) || a.starts_with("--test-threads="))
            .cloned(),
    );
    args
}

/// The wgpu suite's environment: CubeCL's autotune at its `minimal` level unless the caller
/// chose one. wgpu is built with fusion and autotune, and the suite checks results, not
/// speed: on lavapipe (no GPU) timing every candidate kernel took it from about 190 s to 380.
fn wgpu_env() -> Vec<(String, String)> {
    const LEVEL: &str = "CUBECL_AUTOTUNE_LEVEL";
    match std::env::var_os(LEVEL) {
        Some(_) => Vec::new(),
        None => vec![(LEVEL.to_string(), "minimal".to_string())],
    }
}

/// Runs cargo with `args` and the extra environment `env`; its exit code (2 when it cannot
/// start, 1 when killed by a signal).
fn cargo(args: &[String], env: &[(String, String)]) -> u8 {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    println!("test-all: {}cargo {}", shown.concat(), args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    match Command::new(cargo)
        .args(args)
        .envs(env.iter().cloned())
        .status()
    {
        Ok(status) => match status.code() {
            Some(0) => 0,
            Some(code) => code.clamp(1, 255) as u8,
            None => 1,
        },
        Err(e) => {
            eprintln!("test-all: cannot run cargo: {e}");
            2
        }
    }
}

/// What the wgpu suite lacks on this machine (`None`: nothing): the Vulkan loader and at
/// least one installed driver (an ICD manifest). macOS runs wgpu on Metal and needs neither.
fn missing_for_vulkan() -> Option<String> {
    if cfg!(target_os = "macos") {
        return None;
    }
    let loader = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .iter()
    .any(|dir| Path::new(dir).join("libvulkan.so.1").exists());
    let icd_dirs = [
        "/usr/share/vulkan/icd.d",
        "/etc/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
    ];
    let driver = std::env::var_os("VK_ICD_FILENAMES").is_some()
        || std::env::var_os("VK_DRIVER_FILES").is_some()
        || icd_dirs.iter().any(|dir| {
            std::fs::read_dir(dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".json"))
            })
        });
    match (loader, driver) {
        (true, true) => None,
        (false, true) => Some("the Vulkan loader libvulkan.so.1".into()),
        (true, false) => Some("a Vulkan driver".into()),
        (false, false) => Some("the Vulkan loader and driver".into()),
    }
}

/// What the MPI suites lack on this machine (`None`: nothing): Open MPI's compiler wrapper
/// and launcher, and libclang for the bindings.
fn missing_for_mpi() -> Option<String> {
    let mut missing = Vec::new();
    for tool in ["mpicc", "mpirun"] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            missing.push(tool.to_string());
        }
    }
    if !has_libclang() {
        missing.push("libclang".to_string());
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Whether libclang can be found where bindgen looks (`LIBCLANG_PATH`, the usual library
/// directories, LLVM's versioned ones).
fn has_libclang() -> bool {
    let mut dirs: Vec<String> = std::env::var("LIBCLANG_PATH").into_iter().collect();
    dirs.extend(
        [
            "/usr/lib",
            "/usr/lib64",
            "/usr/local/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
        ]
        .map(String::from),
    );
    for root in ["/usr/lib", "/usr/local/opt"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("llvm") {
                    dirs.push(entry.path().join("lib").to_string_lossy().into_owned());
                }
            }
        }
    }
    dirs.iter().any(|dir| holds_libclang(Path::new(dir)))
}

fn holds_libclang(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let library = name.contains(".so") || name.ends_with(".dylib");
            // libclang itself, not libclang-cpp or the runtime libraries.
            let clang = name.starts_with("libclang.") || name.starts_with("libclang-1");
            clang && library
        })
    })
}
