//! The engines between processes side by side: one all-reduce between 2 and 4 worker processes
//! on loopback, through the lighthouse (the star `afterburner launch` used before the ring),
//! over the ring between the ranks, and (feature `mpi`) over Open MPI: ms per all-reduce and
//! the value bytes each rank sends. `xtask engine-all-reduce ENGINE ADDRESS RANK LEN REPS` is
//! the rank side.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use afterburner::parallel::{LighthouseServer, ProcessGroup, QuorumConfig, ReduceOp, connect_tcp};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// What rank 0 prints: the mean all-reduce time in nanoseconds and the value bytes it sent.
const MARK: &str = "ENGINE_ALL_REDUCE";

/// One measured engine: its name, processes, ms per all-reduce, value bytes rank 0 sent.
pub struct Measured {
    /// "star" (through the lighthouse), "ring" or "MPI".
    pub engine: &'static str,
    /// Worker processes.
    pub processes: usize,
    /// Mean ms per all-reduce.
    pub ms: f64,
    /// Value bytes one rank sends per all-reduce (the star's hub sends `processes` times its
    /// buffer on top).
    pub bytes_per_rank: f64,
}

/// Every engine at 2 and 4 processes, an all-reduce of `len` values, `reps` times each.
pub fn measure(len: usize, reps: usize) -> Result<Vec<Measured>, String> {
    let mut out = Vec::new();
    for processes in [2, 4] {
        for engine in ["star", "ring"] {
            let (ms, bytes) = over_tcp(engine, processes, len, reps)?;
            out.push(Measured {
                engine,
                processes,
                ms,
                bytes_per_rank: bytes,
            });
        }
        if let Some(ms) = over_mpi(processes, len, reps)? {
            // Open MPI's ring all-reduce for large buffers: 2(n-1)/n of it, as ours.
            let bytes = 2.0 * (processes - 1) as f64 * 4.0 * len as f64 / processes as f64;
            out.push(Measured {
                engine: "MPI",
                processes,
                ms,
                bytes_per_rank: bytes,
            });
        }
    }
    Ok(out)
}

#[cfg(feature = "mpi")]
fn over_mpi(processes: usize, len: usize, reps: usize) -> Result<Option<f64>, String> {
    Ok(Some(
        super::mpi::all_reduce_time(processes, len, reps)?.as_secs_f64() * 1e3,
    ))
}

#[cfg(not(feature = "mpi"))]
fn over_mpi(_: usize, _: usize, _: usize) -> Result<Option<f64>, String> {
    Ok(None)
}

/// Serves a lighthouse for `processes` ranks and runs each as this binary with the arguments
/// `args(address, rank)` and `env` added to its environment; returns rank 0's standard output
/// (an error names a failed rank).
pub(super) fn ranks_of_this_binary(
    processes: usize,
    env: &[(&str, String)],
    args: impl Fn(&str, usize) -> Vec<String>,
) -> Result<String, String> {
    let config = QuorumConfig::new(processes)
        .with_min_replicas(processes)
        .with_timeout(Duration::from_secs(120));
    let server = LighthouseServer::bind("127.0.0.1:0", config).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let address = server.address().to_string();
    let ranks: Vec<_> = (0..processes)
        .map(|rank| {
            Command::new(&exe)
                .args(args(&address, rank))
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut first = String::new();
    for (rank, child) in ranks.into_iter().enumerate() {
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!("rank {rank} of {processes} failed"));
        }
        if rank == 0 {
            first = String::from_utf8_lossy(&output.stdout).into_owned();
        }
    }
    Ok(first)
}

/// `processes` ranks of this binary timing `engine`'s all-reduce: (ms, value bytes per rank).
fn over_tcp(engine: &str, processes: usize, len: usize, reps: usize) -> Result<(f64, f64), String> {
    let output = ranks_of_this_binary(processes, &[], |address, rank| {
        [
            "engine-all-reduce",
            engine,
            address,
            &rank.to_string(),
            &len.to_string(),
            &reps.to_string(),
        ]
        .map(String::from)
        .to_vec()
    })
    .map_err(|e| format!("{engine}: {e}"))?;
    let line = output.lines().find_map(|l| l.strip_prefix(MARK));
    let mut words = line.into_iter().flat_map(|l| l.split_whitespace());
    match (words.next(), words.next()) {
        (Some(ns), Some(bytes)) => match (ns.parse::<f64>(), bytes.parse::<f64>()) {
            (Ok(ns), Ok(bytes)) => Ok((ns / 1e6, bytes)),
            _ => Err(format!("{engine}: an unreadable {MARK} line")),
        },
        _ => Err(format!("no {MARK} line from {engine} rank 0")),
    }
}

/// The rank side: `ENGINE ADDRESS RANK LEN REPS`, a group failing together (as `afterburner
/// launch` gives DDP), its values through the lighthouse (`star`) or over the ring (`ring`).
pub fn rank(args: &[String]) -> Result<(), String> {
    let usage = || "usage: xtask engine-all-reduce star|ring ADDRESS RANK LEN REPS".to_string();
    let [engine, address, rank, len, reps] = args else {
        return Err(usage());
    };
    let number = |s: &String| s.parse::<usize>().map_err(|_| usage());
    let (rank, len, reps) = (number(rank)?, number(len)?, number(reps)?);
    let device = Default::default();
    let group = connect_tcp::<Flex>(address.as_str(), rank, &device, Duration::from_secs(60))
        .map_err(|e| e.to_string())?
        .failing_together();
    let group = match engine.as_str() {
        "star" => group.through_lighthouse(),
        "ring" => group,
        _ => return Err(usage()),
    };
    let tensor = Tensor::<Flex, 1>::ones([len], &device);
    let err = |e: afterburner::parallel::ParallelError| e.to_string();
    group
        .all_reduce(tensor.clone(), ReduceOp::Sum)
        .map_err(err)?; // warm-up (and ring set-up)
    let before = group.ring_bytes_sent();
    let start = Instant::now();
    for _ in 0..reps {
        let reduced = group
            .all_reduce(tensor.clone(), ReduceOp::Sum)
            .map_err(err)?;
        Flex::sync(&device).ok();
        drop(reduced);
    }
    let nanos = (start.elapsed() / reps as u32).as_nanos();
    let bytes = match engine.as_str() {
        "star" => 4 * len as u64, // its buffer to the lighthouse
        _ => (group.ring_bytes_sent() - before) / reps as u64,
    };
    if rank == 0 {
        println!("{MARK} {nanos} {bytes}");
    }
    Ok(())
}

/// The suite's rows (scenario, value, unit): one step's gradients (`len` values) and, unless
/// `quick`, 16 MiB, at 2 and 4 processes.
pub fn rows(len: usize, quick: bool) -> Result<Vec<(String, f64, &'static str)>, String> {
    let mut sizes = vec![(len, 20, "one step's gradients")];
    if !quick {
        sizes.push((1 << 22, 5, "16 MiB"));
    }
    let mut rows = Vec::new();
    for (len, reps, what) in sizes {
        for m in measure(len, reps)? {
            let name = format!(
                "all_reduce of {what} ({len} values), {} worker processes on loopback, {}",
                m.processes,
                match m.engine {
                    "star" => "star through the lighthouse",
                    "ring" => "ring between the ranks",
                    _ => "Open MPI",
                }
            );
            rows.push((
                format!("{name}: value bytes sent per rank"),
                m.bytes_per_rank,
                "B",
            ));
            if m.engine == "star" {
                let hub = (m.processes * 4 * len) as f64;
                rows.push((
                    format!("{name}: value bytes the lighthouse sends"),
                    hub,
                    "B",
                ));
            }
            rows.push((name, m.ms, "ms"));
        }
    }
    Ok(rows)
}

/// `xtask ring-vs-mpi [MIB...]`: one all-reduce of each size (default 4, 16, 64 and 100 MiB)
/// between 2 and 4 processes, over the ring and (feature `mpi`) over Open MPI, side by side.
pub fn print(args: &[String]) -> Result<(), String> {
    let sizes: Vec<f64> = match args {
        [] => vec![4.0, 16.0, 64.0, 100.0],
        given => given
            .iter()
            .map(|a| {
                a.parse::<f64>()
                    .map_err(|_| format!("{a}: not a size in MiB"))
            })
            .collect::<Result<_, _>>()?,
    };
    println!("| MiB | processes | ring ms | MPI ms | ring / MPI |\n|---|---|---|---|---|");
    for mib in sizes {
        let len = (mib * 262_144.0) as usize;
        let reps = if mib > 32.0 { 3 } else { 10 };
        for processes in [2, 4] {
            let (ring, _) = over_tcp("ring", processes, len, reps)?;
            let mpi = over_mpi(processes, len, reps)?;
            let (mpi_ms, ratio) = match mpi {
                Some(mpi) => (format!("{mpi:.2}"), format!("{:.2}", ring / mpi)),
                None => ("-".into(), "-".into()),
            };
            println!("| {mib} | {processes} | {ring:.2} | {mpi_ms} | {ratio} |");
        }
    }
    Ok(())
}
