//! Fault-tolerant DiLoCo in a plain Burn loop (docs/fault-tolerance.md).
//!
//! Without arguments: 3 replica threads over an in-process lighthouse; replica 2 fails at step
//! 8, the other two go on, replica 2 restarts once they are past step 15 and is healed from a
//! live replica; every round prints who took part.
//! `cargo run -p afterburner-localsgd --example fault_tolerant`
//!
//! As one process of a multi-process run, against a lighthouse served by
//! `cargo run -p afterburner-rendezvous --example lighthouse -- --replicas 3`:
//! `cargo run -p afterburner-localsgd --example fault_tolerant -- --connect 127.0.0.1:29510 --replica 0`
//! and `--replica 1`, `--replica 2` in two more shells (a step every 0.3 s: kill one with
//! `kill -9` or Ctrl-C, start it again while the others still run: it rejoins).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use afterburner_localsgd::{DiLoCo, DiLoCoConfig};
use afterburner_parallel::{
    Lighthouse, LocalReplicas, ParallelError, ParallelStrategy, QuorumConfig, QuorumGroup,
    connect_tcp, flat_params,
};
use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;

type B = Autodiff<Flex>;
const STEPS: u64 = 30;

/// Trains replica `id` over `group` until `STEPS` (failing at `fail_at`); returns its final
/// parameters. `progress` counts replica 0's steps.
fn replica(
    group: QuorumGroup<Flex>,
    id: usize,
    fail_at: Option<u64>,
    progress: &AtomicU64,
    step_time: Duration,
) -> Result<Vec<f32>, ParallelError> {
    let config = DiLoCoConfig {
        sync_every: 5,
        ..Default::default()
    };
    let device = Default::default();
    let mut diloco = DiLoCo::<B, _>::new(group, config)?;
    let mut optim = AdamWConfig::new().init();
    // Every replica builds the same model here; a founding replica takes replica 0's, a
    // restarted one the live state.
    let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
    let (mut model, start) = diloco.join(model, &mut optim)?;
    if start > 0 {
        println!("replica {id}: healed from a live replica, continues after step {start}");
    }
    for step in start + 1..=STEPS {
        if fail_at == Some(step) {
            println!("replica {id}: fails at step {step}");
            return Err(ParallelError::Record("replica failed (the example)".into()));
        }
        // A batch of this replica's data: y = sum(x) / 2.
        let x = Tensor::<B, 2>::random(
            [8, 4],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let y = x.clone().sum_dim(1).mul_scalar(0.5);
        let loss = (model.forward(x) - y).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        model = diloco.after_optimizer_step(model, &mut optim, step)?;
        if id == 0 {
            progress.store(step, Ordering::SeqCst);
        }
        if step % 5 == 0 {
            let members = diloco.group().and_then(|g| g.quorum()).map(|q| q.members());
            let members = members.unwrap_or_default();
            println!("replica {id}: round {} over replicas {members:?}", step / 5);
        }
        std::thread::sleep(step_time); // time to kill a process by hand
    }
    let model = diloco.finish(model, STEPS)?;
    let values = flat_params::<B, _>(&model).expect("a model with parameters");
    Ok(values.into_data().to_vec::<f32>().unwrap_or_default())
}

fn main() {
    if let Err(error) = run() {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), ParallelError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let progress = AtomicU64::new(0);
    if let Some(address) = arg("--connect") {
        let id: usize = arg("--replica").and_then(|r| r.parse().ok()).unwrap_or(0);
        let group = connect_tcp::<Flex>(address, id, &Default::default(), Duration::from_secs(30))?;
        let step_time = Duration::from_millis(300);
        let values = replica(group, id, None, &progress, step_time)?;
        println!("replica {id}: done, parameters {values:?}");
        return Ok(());
    }
    let lighthouse = Lighthouse::new(QuorumConfig::new(3))?;
    let progress = Arc::new(progress);
    let start = |id: usize, fail_at: Option<u64>| {
        let (lighthouse, progress) = (lighthouse.clone(), progress.clone());
        std::thread::spawn(move || {
            let group = lighthouse.replica::<Flex>(id, &Default::default())?;
            replica(group, id, fail_at, &progress, Duration::from_millis(20))
        })
    };
    let live = [start(0, None), start(1, None)];
    let failed = start(2, Some(8)).join().expect("no panic");
    assert!(failed.is_err());
    while progress.load(Ordering::SeqCst) < 15 {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("replica 2: restarts");
    let restarted = start(2, None);
    let mut finals = Vec::new();
    for handle in live.into_iter().chain([restarted]) {
        finals.push(handle.join().expect("no panic")?);
    }
    let same = finals.windows(2).all(|w| w[0] == w[1]);
    println!("all 3 replicas end on the same parameters: {same}");
    Ok(())
}
