//! The restart policy through the launcher binary, black box: under the default `auto` the
//! workers settle it at the rendezvous from the strategy they run, however it was configured
//! (a `[strategy.diloco]` table in a TOML config, its JSON form, `--strategy diloco`, a
//! registered strategy of the user's that heals alone): `replica`; `ddp`: `all`. The launcher
//! never reads the program's arguments. A worker whose strategy does not fit the policy the
//! launcher was given fails naming both.
#![cfg(all(unix, feature = "flex"))]

use std::path::Path;
use std::process::{Command, Output};

use afterburner::parallel::{Launched, ParallelStrategy, ProcessGroup, StateSaving};
use afterburner::{
    AccelerateError, Accelerator, AcceleratorConfig, AnyStrategy, Group, NamedStrategy,
    register_strategy,
};
use burn::module::AutodiffModule;
use burn::nn::{Linear, LinearConfig};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;

#[allow(dead_code)] // shared with tests/launch.rs, which uses the rest
mod launch_support;

use launch_support::*;

/// Set in a worker started by [`registered_worker_program`]'s launch: this test binary is
/// then the worker program.
const WORKER: &str = "AB_TEST_REGISTERED_WORKER";

/// `afterburner launch --nproc 2 [LAUNCHER] -- PROGRAM...`, the launcher binary built beside
/// this test (`cargo test --workspace` builds it).
fn launch_binary(launcher: &[&str], program: &[&str], envs: &[(&str, &str)]) -> Output {
    launcher_command(&["--nproc", "2"], launcher, program, envs)
        .output()
        .expect("the launcher runs")
}

/// The launcher binary's command `afterburner launch SIZE LAUNCHER -- PROGRAM`.
fn launcher_command(
    size: &[&str],
    launcher: &[&str],
    program: &[&str],
    envs: &[(&str, &str)],
) -> Command {
    let binary = built("afterburner");
    assert!(
        binary.exists(),
        "{} is not built: run `cargo build -p afterburner-launch` (cargo test --workspace does)",
        binary.display()
    );
    let mut command = Command::new(binary);
    command
        .arg("launch")
        .args(size)
        .args(launcher)
        .arg("--")
        .args(program)
        .envs(envs.iter().copied());
    command
}

/// This test binary as the worker program of the registered strategy.
fn registered_program() -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    [
        exe.to_str().unwrap(),
        "registered_worker_program",
        "--exact",
        "--nocapture",
    ]
    .map(String::from)
    .to_vec()
}

/// The ViT example for two optimizer steps, writing to `out`, with `trainer` arguments.
fn vit(out: &Path, trainer: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![example("vit_classify").to_string_lossy().into()];
    args.extend(trainer.iter().map(|a| a.to_string()));
    for arg in [
        "--max-steps",
        "2",
        "--eval-strategy",
        "no",
        "--save-strategy",
        "no",
        "--load-best-model-at-end",
        "false",
        "--per-device-train-batch-size",
        "8",
        "--disable-tqdm",
        "--output-dir",
    ] {
        args.push(arg.into());
    }
    args.push(out.to_string_lossy().into());
    args
}

/// Asserts the launch succeeded under `policy`, settled by the workers' strategy `strategy`.
fn settled(out: &Output, policy: &str, strategy: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = format!("restart policy `{policy}`, settled by rank ");
    let settled = stderr
        .lines()
        .find(|l| l.contains(&line))
        .unwrap_or_else(|| panic!("no `{line}` in {stderr}"));
    assert!(
        settled.ends_with(&format!("'s strategy {strategy}")),
        "{settled}"
    );
}

#[test]
fn every_way_of_choosing_diloco_runs_under_replica_and_ddp_under_all() {
    let dir = fresh("policy-forms");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("run.toml");
    std::fs::write(
        &toml,
        "logging_steps = 1\n\n[strategy.diloco]\nsync_every = 2\n",
    )
    .unwrap();
    let json = dir.join("run.json");
    std::fs::write(
        &json,
        "{\"logging_steps\": 1, \"strategy\": {\"diloco\": {\"sync_every\": 2}}}",
    )
    .unwrap();
    let (toml, json) = (toml.to_str().unwrap(), json.to_str().unwrap());
    for (form, trainer, policy, strategy) in [
        ("toml", vec!["--config", toml], "replica", "diloco"),
        ("json", vec!["--config", json], "replica", "diloco"),
        ("flag", vec!["--strategy", "diloco"], "replica", "diloco"),
        ("ddp", vec!["--strategy", "ddp"], "all", "ddp"),
    ] {
        let program = vit(&dir.join(form), &trainer);
        let program: Vec<&str> = program.iter().map(String::as_str).collect();
        settled(&launch_binary(&[], &program, &[]), policy, strategy);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_registered_strategy_that_heals_alone_runs_under_replica() {
    let program = registered_program();
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let out = launch_binary(&[], &program, &[(WORKER, "1")]);
    settled(&out, "replica", "independent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!(
                "[rank {rank}] independent replica {rank} of 2: 3 steps"
            )),
            "{stdout}"
        );
    }
}

/// On two nodes, node 1's launcher asks node 0's lighthouse for the policy its workers
/// settled: its worker, failing once after it met the rendezvous, is started again alone.
#[test]
fn another_nodes_launcher_restarts_by_the_policy_node_0_settled() {
    let rdzv = format!("127.0.0.1:{}", free_port());
    let program = registered_program();
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let node = |rank: &str| {
        let size = [
            "--nproc",
            "1",
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--rdzv",
            &rdzv,
        ];
        let envs = [(WORKER, "fail-once")];
        launcher_command(&size, &["--max-restarts", "1"], &program, &envs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the launcher runs")
    };
    let (zero, one) = (node("0"), node("1"));
    let (zero, one) = (
        zero.wait_with_output().unwrap(),
        one.wait_with_output().unwrap(),
    );
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let stderr = text(&one.stderr);
    assert!(one.status.success(), "{stderr}");
    assert!(zero.status.success(), "{}", text(&zero.stderr));
    assert!(
        stderr.contains("restart policy `replica`, settled by rank"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 1 exited with code 7; starting it again alone"),
        "{stderr}"
    );
    let stdout = text(&one.stdout);
    assert!(
        stdout.contains("[rank 1] independent replica 1 of 2: 3 steps"),
        "{stdout}"
    );
}

#[test]
fn a_strategy_that_does_not_fit_the_given_policy_is_named() {
    let dir = fresh("policy-misfit");
    let program = vit(&dir, &["--strategy", "diloco"]);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let out = launch_binary(&["--restart-policy", "all"], &program, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("runs strategy diloco")
            && stderr.contains("needs restart policy `replica`")
            && stderr.contains("--restart-policy replica"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A user's strategy: replicas that train alone (no collective at all), so one that dies is
/// simply started again by itself.
struct Independent {
    group: Group<B>,
}

impl StateSaving<B> for Independent {}

impl ParallelStrategy<B> for Independent {
    const HEALS_ALONE: bool = true;

    fn name(&self) -> &'static str {
        "independent"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<burn::backend::Flex>> {
        Some(&*self.group)
    }
}

impl NamedStrategy<B> for Independent {
    const NAME: &'static str = "independent";
    type Options = ();

    fn build(group: Option<Group<B>>, _: ()) -> Result<Self, AccelerateError> {
        let group = group.ok_or_else(|| AccelerateError::InvalidArgument {
            key: "strategy".into(),
            reason: "independent replicas need a launch".into(),
        })?;
        Ok(Self { group })
    }
}

/// The worker program of [`a_registered_strategy_that_heals_alone_runs_under_replica`]: does
/// nothing unless started by that test's launch.
#[test]
fn registered_worker_program() {
    if std::env::var_os(WORKER).is_none() {
        return;
    }
    register_strategy::<B, Independent>().unwrap();
    let launched = Launched::from_env()
        .unwrap()
        .expect("started by the launcher");
    let config = AcceleratorConfig::default().with_strategy("independent".parse().unwrap());
    let mut acc =
        Accelerator::<B, AnyStrategy<B, Independent>>::launched(config, &launched).unwrap();
    let fail_once = std::env::var(WORKER).is_ok_and(|w| w == "fail-once");
    if fail_once && launched.rank == 1 && launched.restart_count == 0 {
        // Fails once it met the rendezvous (its declaration settled or checked).
        std::process::exit(7);
    }
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
    let (mut model, mut optim) = acc.join(model, SgdConfig::new().init()).unwrap();
    let mut lr = 0.1;
    for _ in 0..3 {
        let x = Tensor::<B, 2>::ones([2, 4], &device);
        let loss = acc.forward(&model, x, |m, x| m.forward(x)).unwrap().mean();
        acc.backward(loss, &model).unwrap();
        model = acc.step(model, &mut optim, &mut lr).unwrap();
    }
    let _ = model.valid();
    println!(
        "independent replica {} of {}: {} steps",
        acc.rank(),
        acc.world_size(),
        acc.counters().optimizer_steps
    );
    if fail_once && launched.rank == 0 {
        // Node 0's launcher (and its lighthouse) outlives rank 1's restart.
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
}
