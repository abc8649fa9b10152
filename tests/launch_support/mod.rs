//! What the launcher tests share: the built programs, fresh folders, a launch of the ViT
//! example, finding and killing a run's workers, and reading what they saved.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use afterburner::parallel::flat_params;
use afterburner::weights::LoadWeights;
use afterburner_demos::models::{Vit, VitConfig};
use afterburner_launch::{kill_worker, launch, launched_workers, parse_args};
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};

/// The examples' training backend.
pub type B = Autodiff<Flex>;

/// The binary `name` of this build's profile (`cargo test --workspace` builds every package's).
pub fn built(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("the test binary's path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// The example `name`, built beside this test.
pub fn example(name: &str) -> PathBuf {
    built("examples").join(name)
}

/// A fresh folder for one run.
pub fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ab-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `afterburner launch LAUNCHER_ARGS -- vit_classify TRAINER_ARGS --output-dir OUT` (no
/// evaluation, batch 16 per rank), in this process; the launcher's exit code.
pub fn launch_vit(launcher: &[&str], trainer: &[&str], out: &Path) -> i32 {
    let mut trainer = trainer.to_vec();
    trainer.extend(["--eval-strategy", "no"]);
    launch_vit_evaluating(launcher, &trainer, out)
}

/// [`launch_vit`] with the evaluation the trainer arguments ask for (the example's own
/// default: one per epoch).
pub fn launch_vit_evaluating(launcher: &[&str], trainer: &[&str], out: &Path) -> i32 {
    let vit = example("vit_classify");
    let mut args = vec!["afterburner", "launch"];
    args.extend(launcher);
    args.extend(["--", vit.to_str().unwrap()]);
    args.extend(trainer);
    args.extend(["--load-best-model-at-end", "false"]);
    args.extend(["--per-device-train-batch-size", "16", "--disable-tqdm"]);
    args.extend(["--output-dir", out.to_str().unwrap()]);
    let args = parse_args(args).expect("the launcher's arguments");
    launch(&args).unwrap_or_else(|e| panic!("the launch failed: {e}"))
}

/// The pids of the live workers of the run writing to `out` whose environment holds every
/// one of `vars` (`RANK=1`, ...).
pub fn workers(out: &Path, vars: &[String]) -> Vec<u32> {
    let vars: Vec<&str> = vars.iter().map(String::as_str).collect();
    launched_workers(&out.to_string_lossy(), &vars)
}

/// SIGKILLs the workers of `out` with `vars` once `ready` holds (polling for at most 5 min);
/// whether it killed one.
pub fn kill_when(out: &Path, vars: &[String], ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !ready() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pids = workers(out, vars);
    for pid in &pids {
        kill_worker(*pid);
    }
    !pids.is_empty()
}

/// Whether a worker of `out` with `vars` shows up within a minute.
pub fn appears(out: &Path, vars: &[String]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if !workers(out, vars).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Waits (at most 2 min) until rank 0 of the run writing to `out` has logged `step`.
pub fn wait_for_step(out: &Path, step: u64) {
    let (log, wanted) = (out.join("log.jsonl"), format!("\"step\":{step}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains(&wanted)) {
        assert!(
            Instant::now() < deadline,
            "the workers did not reach step {step}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port free on loopback now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The tensor bytes of a safetensors file (its header's metadata map is unordered).
pub fn tensor_bytes(file: &Path) -> Vec<u8> {
    let bytes = std::fs::read(file).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..].to_vec()
}

/// The parameters rank `rank` of `world` saved in `checkpoint`.
pub fn saved_params(checkpoint: &Path, rank: usize, world: usize) -> Vec<f32> {
    let device = Default::default();
    let file = checkpoint
        .join(format!("rank-{rank:05}-of-{world:05}"))
        .join("model.mpk");
    let model: Vit<B> = VitConfig::new()
        .with_num_classes(10)
        .init::<B>(&device)
        .load_file(
            file,
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            &device,
        )
        .expect("the replica's saved model");
    flat_params::<B, _>(&model)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The parameters of the ViT the example saved as `file` (safetensors, Burn's layout).
pub fn model_params(file: &Path) -> Vec<f32> {
    let device = Default::default();
    let model: Vit<B> = LoadWeights::from_file(file)
        .into_model(VitConfig::new().with_num_classes(10).init::<B>(&device))
        .expect("the example's saved model");
    flat_params::<B, _>(&model)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The replicas' parts saved in `checkpoint` (`rank-<r>-of-<n>`), as rank numbers.
pub fn saved_ranks(checkpoint: &Path) -> Vec<usize> {
    let mut ranks: Vec<usize> = std::fs::read_dir(checkpoint)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("rank-")?
                        .split_once("-of-")?
                        .0
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    ranks.sort();
    ranks
}
