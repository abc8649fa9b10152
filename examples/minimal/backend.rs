//! The backend, picked by cargo feature: `flex` (default, CPU), `cuda`, `wgpu`.
//!
//! `Autocast` under `Autodiff` computes what the inner backend computes, with every Burn
//! `Linear` applied to the 2-D view of its input (faster and leaner on 3-D inputs; see
//! docs/performance.md).

#[cfg(feature = "cuda")]
pub type B = burn::backend::Autodiff<afterburner::Autocast<burn::backend::Cuda>>;
#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
pub type B = burn::backend::Autodiff<afterburner::Autocast<burn::backend::Wgpu>>;
#[cfg(all(feature = "flex", not(any(feature = "cuda", feature = "wgpu"))))]
pub type B = burn::backend::Autodiff<afterburner::Autocast<burn::backend::Flex>>;

/// The default device of the selected backend.
pub fn device() -> burn::tensor::Device<B> {
    Default::default()
}

/// Shows afterburner's warnings (a skipped non-finite step, an emulated half precision, ...)
/// on stderr; `RUST_LOG=info` (or `debug`) shows more.
pub fn show_warnings() {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs an example's `run` with its warnings shown and ends the program as a command-line
/// tool does: `--help`'s text on standard output with exit 0, an error's message on standard
/// error with exit 2.
pub fn main_with(
    run: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    show_warnings();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<afterburner::AccelerateError>() {
            Some(afterburner::AccelerateError::Help(text)) => {
                println!("{text}");
                std::process::ExitCode::SUCCESS
            }
            _ => {
                eprintln!("error: {e}");
                std::process::ExitCode::from(2)
            }
        },
    }
}
