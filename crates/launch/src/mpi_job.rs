//! The `mpi` engine: each attempt of a launch is one Open MPI job, `mpirun -np N PROGRAM
//! ARGS`, which starts and wires the ranks; the launcher watches it like one worker and starts
//! it again after a failure (`mpirun` stops every rank when one dies).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use afterburner_rendezvous::engine::LOOPBACK_MPIRUN_FLAGS;
use afterburner_rendezvous::launched::{TOKEN, token};
use afterburner_rendezvous::{Engine, Launched, RestartPolicy};

use crate::LaunchError;
use crate::args::{EngineChoice, LaunchArgs, PolicyChoice};

/// The Debian/Ubuntu packages of Open MPI's `mpirun`.
const MPI_INSTALL: &str = "sudo apt-get install -y openmpi-bin libopenmpi-dev";

/// The engine a launch runs on: the one given, or under `auto` the `mpi` engine where `mpirun`
/// is on the PATH and the launch can use it (one node, a restart policy other than
/// `replica`), else `tcp`. `--engine mpi` where it cannot serve is an error naming why.
pub(crate) fn engine(args: &LaunchArgs) -> Result<Engine, LaunchError> {
    let replica = args.policy == PolicyChoice::Fixed(RestartPolicy::Replica);
    let why_not = if replica {
        Some(
            "--restart-policy replica restarts one worker alone, which mpirun cannot do (it \
             stops the whole job when a rank dies): use --engine tcp"
                .to_string(),
        )
    } else if args.nnodes > 1 {
        Some(
            "the mpi engine runs on one node (several hosts under one launcher's mpirun are \
             not wired yet): use --engine tcp"
                .to_string(),
        )
    } else {
        mpirun().err()
    };
    match (args.engine, why_not) {
        (EngineChoice::Fixed(engine), None) => Ok(engine),
        (EngineChoice::Fixed(Engine::Tcp), Some(_)) => Ok(Engine::Tcp),
        (EngineChoice::Fixed(Engine::Mpi), Some(reason)) => {
            Err(LaunchError::Usage(format!("--engine mpi: {reason}")))
        }
        (EngineChoice::Auto, None) => Ok(Engine::Mpi),
        (EngineChoice::Auto, Some(_)) => Ok(Engine::Tcp),
    }
}

/// `mpirun` on the PATH, or why not (with the install line).
fn mpirun() -> Result<PathBuf, String> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("mpirun"))
        .find(|path| path.is_file())
        .ok_or_else(|| format!("Open MPI's mpirun is not on the PATH ({MPI_INSTALL})"))
}

/// Each rank's torchrun variables from Open MPI's, set by a shell around the program (which it
/// then becomes, keeping its pid): a program reading `RANK` finds it as under `tcp`.
const RANK_SHIM: &str = "export RANK=\"$OMPI_COMM_WORLD_RANK\" \
     LOCAL_RANK=\"$OMPI_COMM_WORLD_LOCAL_RANK\" \
     LOCAL_WORLD_SIZE=\"$OMPI_COMM_WORLD_LOCAL_SIZE\"; exec \"$0\" \"$@\"";

/// The `mpirun` command of one attempt: `args.nproc` ranks of `args.program` on this machine,
/// each with the job's variables (`job`, [`Launched::to_vars`]) and its rank's, every output
/// line tagged with its rank.
pub(crate) fn command(args: &LaunchArgs, job: &Launched) -> Result<Command, LaunchError> {
    let mpirun = mpirun().map_err(|reason| LaunchError::Program {
        program: "mpirun".into(),
        reason,
    })?;
    let mut command = Command::new(mpirun);
    command
        .args(LOOPBACK_MPIRUN_FLAGS)
        .args(["-np", &args.nproc.to_string()])
        .arg("--tag-output");
    for (name, value) in job.to_vars() {
        command.env(name, value).args(["-x", name]);
    }
    if let Some(token) = token() {
        command.env(TOKEN, token).args(["-x", TOKEN]);
    }
    command.args(["sh", "-c", RANK_SHIM]);
    command.args(args.program.iter().map(OsString::as_os_str));
    Ok(command)
}

/// A line of `mpirun --tag-output` (`[1,2]<stderr>:text`) as the launcher prints a worker's
/// (`[rank 2] text`); other lines (mpirun's own) as `[mpirun] text`.
pub(crate) fn retag(line: &str) -> String {
    let tagged = line.strip_prefix('[').and_then(|rest| {
        let (ids, rest) = rest.split_once(']')?;
        let (_, rank) = ids.split_once(',')?;
        let rank: usize = rank.parse().ok()?;
        let text = rest
            .strip_prefix("<stdout>:")
            .or_else(|| rest.strip_prefix("<stderr>:"))?;
        Some(format!("[rank {rank}] {text}"))
    });
    tagged.unwrap_or_else(|| format!("[mpirun] {line}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    fn engine_of(options: &[&str]) -> Result<Engine, String> {
        let mut args = vec!["afterburner", "launch"];
        args.extend(options);
        args.extend(["--", "prog"]);
        engine(&parse_args(args).unwrap()).map_err(|e| e.to_string())
    }

    /// `tcp` by default; `auto` and `mpi` never put a launch on mpirun that it cannot serve.
    #[test]
    fn the_engine_is_tcp_unless_mpi_is_asked_for_and_can_serve() {
        assert_eq!(engine_of(&[]), Ok(Engine::Tcp));
        for replica in [
            &["--restart-policy", "replica"][..],
            &["--nnodes", "2", "--rdzv", "h:1"],
        ] {
            let mut auto = vec!["--engine", "auto"];
            auto.extend(replica);
            assert_eq!(engine_of(&auto), Ok(Engine::Tcp));
            let mut mpi = vec!["--engine", "mpi"];
            mpi.extend(replica);
            let error = engine_of(&mpi).unwrap_err();
            assert!(
                error.contains("--engine mpi") && error.contains("tcp"),
                "{error}"
            );
        }
        let found = mpirun().is_ok();
        assert_eq!(engine_of(&["--engine", "mpi"]).is_ok(), found);
        let auto = engine_of(&["--engine", "auto"]);
        assert_eq!(auto, Ok(if found { Engine::Mpi } else { Engine::Tcp }));
    }

    #[test]
    fn mpiruns_tags_become_the_launchers() {
        assert_eq!(retag("[1,3]<stderr>:loss 0.5"), "[rank 3] loss 0.5");
        assert_eq!(retag("[1,0]<stdout>:"), "[rank 0] ");
        assert_eq!(
            retag("mpirun noticed that process rank 2"),
            "[mpirun] mpirun noticed that process rank 2"
        );
        assert_eq!(retag("[x] y"), "[mpirun] [x] y");
    }
}
