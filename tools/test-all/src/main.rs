//! `cargo test-all [ARGS]`: runs `cargo test --workspace`, adding the suites whose system
//! packages this machine has, and says which it skipped and how to install what they need.
//! Extra arguments go to `cargo test` (e.g. `cargo test-all -- --nocapture`). The exit code
//! is `cargo test`'s.
//!
//! Suites behind system packages:
//! - MPI (`--features mpi`: multi-process runs under `mpirun`): Open MPI and libclang.

use std::path::Path;
use std::process::{Command, ExitCode};

/// The Debian/Ubuntu packages the MPI suites need.
const MPI_PACKAGES: &str = "libopenmpi-dev openmpi-bin libclang-dev";

fn main() -> ExitCode {
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let mpi = missing_for_mpi();
    let mut args = vec!["test".to_string(), "--workspace".to_string()];
    match &mpi {
        None => args.extend(["--features".to_string(), "mpi".to_string()]),
        Some(missing) => {
            println!("test-all: skipping the MPI suites ({missing} not found)");
            println!("test-all: to run them: sudo apt-get install -y {MPI_PACKAGES}");
        }
    }
    let (before, after) = match extra.iter().position(|a| a == "--") {
        Some(i) => (&extra[..i], &extra[i..]),
        None => (&extra[..], &[][..]),
    };
    args.extend(before.iter().cloned());
    args.extend(after.iter().cloned());
    println!("test-all: cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = match Command::new(cargo).args(&args).status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("test-all: cannot run cargo: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(missing) = &mpi {
        println!(
            "test-all: the MPI suites were skipped ({missing} not found; sudo apt-get install \
             -y {MPI_PACKAGES})"
        );
    }
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(code.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
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
