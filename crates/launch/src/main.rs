//! The `afterburner` command: `afterburner launch [OPTIONS] -- PROGRAM [ARGS]...` (see
//! `afterburner launch --help` and docs/launch.md).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match afterburner_launch::parse_args(std::env::args_os()) {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    match afterburner_launch::launch(&args) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(error) => {
            eprintln!("afterburner launch: {error}");
            ExitCode::from(1)
        }
    }
}
