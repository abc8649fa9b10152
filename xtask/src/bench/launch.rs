//! The launch suite: `afterburner launch` running the ViT example under DiLoCo (H = 10) on 3
//! replica processes, without faults and with a random replica SIGKILLed every second for the
//! whole run (the launcher restarts it, the Trainer heals it). Useful optimizer steps per
//! second of each, side by side. Writes `bench-results/launch-<backend>.*`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use afterburner_launch::{kill_worker, launch, launched_workers, parse_args};
use serde::Serialize;

use super::Options;

const REPLICAS: usize = 3;
/// Inner steps per DiLoCo round.
const H: usize = 10;
/// How often a replica is killed in the chaos run.
const EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize)]
struct Row {
    run: String,
    /// Which of the runs of this scenario (from 1).
    repeat: usize,
    optimizer_steps: usize,
    seconds: f64,
    replicas_killed: usize,
    useful_steps_per_second: f64,
}

/// Runs the suite (the example is built for flex, whatever `--backend` says).
pub fn bench(o: &Options) -> Result<(), String> {
    let example = vit_example()?;
    let repeats = o.rounds.max(1);
    let runs = [("no fault", false), ("a replica killed every second", true)];
    let mut progress = super::progress::Progress::new("launch", runs.len() * repeats);
    let mut rows = Vec::new();
    for repeat in 1..=repeats {
        for (name, chaos) in runs {
            progress.next(format!("{name}, run {repeat} of {repeats}"));
            let (seconds, killed) = run(o, &example, chaos)?;
            rows.push(Row {
                run: name.into(),
                repeat,
                optimizer_steps: o.steps,
                seconds,
                replicas_killed: killed,
                useful_steps_per_second: o.steps as f64 / seconds,
            });
        }
    }
    let mean = |name: &str, f: fn(&Row) -> f64| {
        let of: Vec<f64> = rows.iter().filter(|r| r.run == name).map(f).collect();
        of.iter().sum::<f64>() / of.len() as f64
    };
    let base = mean(runs[0].0, |r| r.useful_steps_per_second);
    let mut md = format!(
        "`afterburner launch` of the ViT example (`vit_classify`, this build's profile), DiLoCo \
         (H = {H}) on {REPLICAS} replica processes, {} optimizer steps, batch {} per replica, \
         each run {repeats} times; the chaos run SIGKILLs a random replica every {} s for the \
         whole run (the launcher starts it again, the Trainer heals it from a live one).\n\n\
         | run | wall s (mean) | replicas killed (mean) | useful steps/s | share of \
         failure-free |\n|---|---|---|---|---|\n",
        o.steps,
        o.batch_size,
        EVERY.as_secs_f64(),
    );
    for (name, _) in runs {
        let rate = mean(name, |r| r.useful_steps_per_second);
        let _ = writeln!(
            md,
            "| {name} | {:.1} | {:.1} | {rate:.1} | {:.1}% |",
            mean(name, |r| r.seconds),
            mean(name, |r| r.replicas_killed as f64),
            100.0 * rate / base,
        );
    }
    super::write_report(o, "launch", &rows, &md)
}

/// One launch; its wall time and the replicas killed.
fn run(o: &Options, example: &Path, chaos: bool) -> Result<(f64, usize), String> {
    let out = std::env::temp_dir().join(format!("ab-bench-launch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (steps, batch, h) = (o.steps.to_string(), o.batch_size.to_string(), H.to_string());
    let mut args = vec![
        "afterburner",
        "launch",
        "--nproc",
        "3",
        "--max-restarts",
        "100000",
    ];
    args.extend([
        "--",
        path(example)?,
        "--strategy",
        "diloco",
        "--diloco.sync-every",
        &h,
    ]);
    args.extend([
        "--max-steps",
        &steps,
        "--per-device-train-batch-size",
        &batch,
    ]);
    args.extend([
        "--eval-strategy",
        "no",
        "--save-strategy",
        "no",
        "--logging-strategy",
        "no",
    ]);
    args.extend(["--load-best-model-at-end", "false", "--disable-tqdm"]);
    args.extend(["--output-dir", path(&out)?]);
    let args = parse_args(args).map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicBool::new(false));
    let killer = chaos.then(|| {
        let (done, marker) = (done.clone(), out.to_string_lossy().into_owned());
        std::thread::spawn(move || {
            let (mut seed, mut killed) = (0x9E37_79B9_7F4A_7C15u64, 0);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(EVERY);
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let rank = format!("RANK={}", seed % REPLICAS as u64);
                let pids = launched_workers(&marker, &[&rank]);
                if pids.first().is_some_and(|pid| kill_worker(*pid)) {
                    killed += 1;
                }
            }
            killed
        })
    });
    let start = Instant::now();
    let code = launch(&args).map_err(|e| e.to_string());
    let seconds = start.elapsed().as_secs_f64();
    done.store(true, Ordering::SeqCst);
    let killed = killer.map_or(0, |k| k.join().unwrap_or(0));
    let _ = std::fs::remove_dir_all(&out);
    match code? {
        0 => Ok((seconds, killed)),
        code => Err(format!("the launch exited with {code}")),
    }
}

fn path(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{}: not UTF-8", path.display()))
}

/// The ViT example of this build's profile, built when missing.
fn vit_example() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("xtask's folder")?.to_path_buf();
    let example = dir.join("examples").join("vit_classify");
    if !example.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "-p",
            "afterburner-examples",
            "--example",
            "vit_classify",
        ]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().map_err(|e| format!("cargo build: {e}"))?;
        if !status.success() || !example.exists() {
            return Err(format!("could not build {}", example.display()));
        }
    }
    Ok(example)
}
