//! The launcher's command line: `afterburner launch [OPTIONS] -- PROGRAM [ARGS]...`, through
//! clap, with torchrun's option names as aliases.

use std::ffi::OsString;
use std::time::Duration;

use afterburner_rendezvous::{Engine, RestartPolicy, launched};
use clap::{Arg, ArgAction, Command, value_parser};

use crate::LaunchError;

/// Which restart policy a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyChoice {
    /// Settled by the workers at the rendezvous: each declares its strategy and the policy
    /// it needs (`replica` where replicas heal alone: Local SGD, DiLoCo, a strategy of one's
    /// own that says so; `all` for the others).
    Auto,
    /// The one given.
    Fixed(RestartPolicy),
}

/// Which engine a launch runs on (docs/launch.md, "Which engine").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    /// `mpi` where Open MPI's `mpirun` is on the PATH and the launch can use it (one node, a
    /// restart policy other than `replica`), else `tcp`.
    Auto,
    /// The one given.
    Fixed(Engine),
}

/// What `afterburner launch` was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchArgs {
    /// Workers on this node.
    pub nproc: usize,
    /// Nodes in all.
    pub nnodes: usize,
    /// This node's rank.
    pub node_rank: usize,
    /// `HOST:PORT` of the rendezvous: node 0 serves the lighthouse there.
    pub rdzv: String,
    /// Restarts allowed before the launch fails (all workers under `all`, one under `replica`).
    pub max_restarts: u32,
    /// The restart policy.
    pub policy: PolicyChoice,
    /// What starts the workers and moves their values.
    pub engine: EngineChoice,
    /// How long a collective waits for a late rank.
    pub collective_timeout: Duration,
    /// How long workers get to stop after a forwarded signal before they are killed.
    pub stop_timeout: Duration,
    /// The program and its arguments.
    pub program: Vec<OsString>,
}

fn command() -> Command {
    let number = |name: &'static str, help: &'static str, default: &'static str| {
        Arg::new(name)
            .long(name)
            .value_name("N")
            .help(help)
            .default_value(default)
    };
    let launch = Command::new("launch")
        .about(
            "Start PROGRAM once per worker with RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous \
             in its environment (the Accelerator and the Trainer read them), prefix each \
             worker's output with its rank, forward Ctrl-C and SIGTERM, restart failed workers, \
             and exit with the workers' status.",
        )
        .arg(
            number("nproc", "workers on this node", "1")
                .visible_alias("nproc-per-node")
                .alias("nproc_per_node")
                .value_parser(value_parser!(u64).range(1..=4096)),
        )
        .arg(
            number("nnodes", "nodes (hosts) in all", "1")
                .value_parser(value_parser!(u64).range(1..=4096)),
        )
        .arg(
            number(
                "node-rank",
                "this node's rank, from 0 (node 0 serves the rendezvous)",
                "0",
            )
            .alias("node_rank")
            .value_parser(value_parser!(u64)),
        )
        .arg(
            Arg::new("rdzv")
                .long("rdzv")
                .visible_alias("rdzv-endpoint")
                .alias("rdzv_endpoint")
                .value_name("HOST:PORT")
                .help(
                    "where the workers' group meets: node 0 serves it, the others connect \
                     [default on one node: 127.0.0.1 on a free port; needed with --nnodes]",
                ),
        )
        .arg(
            number(
                "max-restarts",
                "restarts allowed before the launch fails (of all workers under the `all` \
                 policy, of one under `replica`)",
                "0",
            )
            .alias("max_restarts")
            .value_parser(value_parser!(u32)),
        )
        .arg(
            Arg::new("restart-policy")
                .long("restart-policy")
                .value_name("POLICY")
                .help(
                    "on a worker's death: `all` (stop all, start all again: they resume from \
                     the last checkpoint; DDP, ZeRO-1, FSDP), `replica` (start only the dead \
                     one, healed from a live replica; Local SGD, DiLoCo), or `auto` (the workers \
                     declare it from their strategy at the rendezvous)",
                )
                .value_parser(["auto", "all", "replica"])
                .default_value("auto"),
        )
        .arg(
            Arg::new("engine")
                .long("engine")
                .value_name("ENGINE")
                .help(
                    "what starts the workers and moves their values: `tcp` (the launcher starts \
                     each worker; collectives over a TCP ring between them; every strategy), \
                     `mpi` (each attempt is one `mpirun` job: collectives over Open MPI in a \
                     program built with feature `mpi`; DDP, ZeRO-1, FSDP, tensor parallel on \
                     one node), or `auto` (`mpi` where mpirun is installed and the launch can \
                     use it, else `tcp`; a strategy whose replicas heal alone then moves to \
                     `tcp` once it declares itself)",
                )
                .value_parser(["tcp", "mpi", "auto"])
                .default_value("tcp"),
        )
        .arg(
            number(
                "collective-timeout",
                "seconds a collective waits for a late rank (then it fails, or under \
                 `replica` the late one is dropped)",
                "300",
            )
            .value_name("SECONDS")
            .value_parser(positive_seconds),
        )
        .arg(
            number(
                "stop-timeout",
                "seconds workers get to stop (and save) after a forwarded Ctrl-C or SIGTERM \
                 before they are killed",
                "60",
            )
            .value_name("SECONDS")
            .value_parser(positive_seconds),
        )
        .arg(
            Arg::new("program")
                .value_name("PROGRAM")
                .help("the program to run, then its arguments (after --)")
                .num_args(1..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .required(true)
                .value_parser(value_parser!(OsString))
                .action(ArgAction::Append),
        );
    Command::new("afterburner")
        .about("afterburner's command line")
        .subcommand_required(true)
        .subcommand(launch)
}

fn positive_seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .and_then(launched::timeout)
        .ok_or_else(|| {
            format!("{value}: expected a number of seconds > 0 and at most 604800 (one week)")
        })
}

/// Parses `afterburner launch ...` (the program name first). `--help` and bad input come back
/// as clap's error, which the caller prints and exits with (`clap::Error::exit`).
pub fn parse_args<I, T>(args: I) -> Result<LaunchArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    let Some(("launch", m)) = matches.subcommand() else {
        return Err(command().error(
            clap::error::ErrorKind::InvalidSubcommand,
            "the one command is `launch`",
        ));
    };
    let count = |name: &str| m.get_one::<u64>(name).copied().unwrap_or(0) as usize;
    let (nproc, nnodes, node_rank) = (count("nproc"), count("nnodes"), count("node-rank"));
    let mut cmd = command();
    if node_rank >= nnodes {
        return Err(cmd.error(
            clap::error::ErrorKind::ValueValidation,
            format!("--node-rank {node_rank}: expected below --nnodes {nnodes}"),
        ));
    }
    let rdzv = match m.get_one::<String>("rdzv") {
        Some(rdzv) => rdzv.clone(),
        None if nnodes > 1 => {
            return Err(cmd.error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--rdzv HOST:PORT is needed with --nnodes above 1 (node 0's address, \
                 the same on every node)",
            ));
        }
        None => "127.0.0.1:0".into(),
    };
    if !rdzv.contains(':') {
        return Err(cmd.error(
            clap::error::ErrorKind::ValueValidation,
            format!("--rdzv {rdzv}: expected HOST:PORT"),
        ));
    }
    let policy = match m.get_one::<String>("restart-policy").map(String::as_str) {
        Some("all") => PolicyChoice::Fixed(RestartPolicy::All),
        Some("replica") => PolicyChoice::Fixed(RestartPolicy::Replica),
        _ => PolicyChoice::Auto,
    };
    let engine = match m.get_one::<String>("engine").map(String::as_str) {
        Some("mpi") => EngineChoice::Fixed(Engine::Mpi),
        Some("auto") => EngineChoice::Auto,
        _ => EngineChoice::Fixed(Engine::Tcp),
    };
    Ok(LaunchArgs {
        nproc,
        nnodes,
        node_rank,
        rdzv,
        max_restarts: m.get_one::<u32>("max-restarts").copied().unwrap_or(0),
        policy,
        engine,
        collective_timeout: seconds(m, "collective-timeout", 300),
        stop_timeout: seconds(m, "stop-timeout", 60),
        program: m
            .get_many::<OsString>("program")
            .map(|values| values.cloned().collect())
            .unwrap_or_default(),
    })
}

impl From<clap::Error> for LaunchError {
    fn from(error: clap::Error) -> Self {
        LaunchError::Usage(error.to_string())
    }
}

fn seconds(m: &clap::ArgMatches, name: &str, default: u64) -> Duration {
    m.get_one::<Duration>(name)
        .copied()
        .unwrap_or(Duration::from_secs(default))
}
