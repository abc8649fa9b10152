//! The minimal example's training loop on several devices with DDP: `Accelerator::launch` runs
//! it once per device, each rank on its shard of the data; the test accuracy is gathered from
//! every rank's shard with `gather_for_metrics`.
//!
//! ```text
//! cargo run --release --example ddp -- --workers 2 --epochs 10
//! ```
//! Options: --workers N (default 2; on the CPU each worker is a thread), --epochs N,
//! --batch-size N (per worker), --strategy ddp|zero-1|fsdp|local-sgd|diloco (fsdp: one unit
//! per transformer block, parameters, gradients and optimizer state sharded across the
//! workers; local-sgd: parameters averaged every --local-sgd-steps N optimizer steps, default
//! 8; diloco: an outer Nesterov step every --sync-every N steps, default 50; Streaming DiLoCo
//! with --fragments P, --fragment-units TransformerEncoderLayer (whole blocks per fragment),
//! --delay TAU, --mixing ALPHA and --outer-dtype f32|bf16|f16|int8).
//!
//! ```text
//! cargo run --release --example ddp -- --strategy local-sgd --local-sgd-steps 8
//! cargo run --release --example ddp -- --strategy diloco --sync-every 50
//! cargo run --release --example ddp -- --strategy diloco --sync-every 50 --fragments 5 --delay 5
//! ```
//!
//! With `--mpi` (build with `--features mpi`) each process started by `mpirun` is one rank
//! instead (`--workers` is then `mpirun -np`):
//!
//! ```text
//! cargo build --release --example ddp --features mpi
//! mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,tcp \
//!     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
//!     target/release/examples/ddp --mpi --epochs 10
//! ```

#[path = "../minimal/backend.rs"]
mod backend;

use afterburner::localsgd::{DiLoCoConfig, LocalSgdConfig};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig, FsdpConfig, StrategyConfig};
use afterburner_demos::models::VitConfig;
use afterburner_demos::{ImageBatcher, ImageDataset, digits};
use backend::{B, device};
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::{ElementConversion, Tensor};

const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

/// `--help`: every option, what it sets, its values and default.
const HELP: &str = "\
options:
  --workers N            ranks (threads on the CPU) to train on, at least 1 (default 2)
  --epochs N             epochs to train, at least 1 (default 10)
  --batch-size N         items per batch on each rank, at least 1 (default 32)
  --strategy S           ddp (default), zero-1, fsdp, local-sgd, diloco
  --local-sgd-steps N    local-sgd: optimizer steps between averages (default 8)
  --sync-every N         diloco: inner steps per outer step (default 50)
  --fragments P          diloco: Streaming DiLoCo with P fragments (default 1)
  --fragment-units NAME  diloco: whole modules of this type per fragment
  --delay TAU            diloco: inner steps an outer step overlaps (default 0)
  --mixing ALPHA         diloco: mix of the global and local parameters on arrival
  --outer-dtype D        diloco: f32 (default), bf16, f16, int8 for the outer gradients
  --mpi                  one rank per process started by mpirun (build with --features mpi)
  --help                 this text";

/// `value` as the option `flag` wants it; an error names the option.
fn parsed<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| format!("{flag} {value}: {e}"))
}

fn main() -> std::process::ExitCode {
    backend::main_with(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (mut workers, mut epochs, mut batch_size) = (2, 10, 32);
    let mut strategy = StrategyConfig::Ddp(Default::default());
    let mut mpi = false;
    let (mut local_sgd_steps, mut diloco) = (
        8,
        DiLoCoConfig {
            sync_every: 50,
            ..Default::default()
        },
    );
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--mpi" => {
                mpi = true;
                continue;
            }
            "--help" => return Err(AccelerateError::Help(HELP.into()).into()),
            _ => {}
        }
        let value = args
            .next()
            .ok_or(format!("{flag} needs a value (see --help)"))?;
        match flag.as_str() {
            "--workers" => workers = parsed(&flag, &value)?,
            "--epochs" => epochs = parsed(&flag, &value)?,
            "--batch-size" => batch_size = parsed(&flag, &value)?,
            "--strategy" => strategy = parsed(&flag, &value)?,
            "--local-sgd-steps" => local_sgd_steps = parsed(&flag, &value)?,
            "--sync-every" => diloco.sync_every = parsed(&flag, &value)?,
            "--fragments" => diloco.fragments = parsed(&flag, &value)?,
            "--fragment-units" => diloco.fragment_units = parsed(&flag, &value)?,
            "--delay" => diloco.delay = parsed(&flag, &value)?,
            "--mixing" => diloco.mixing = Some(parsed(&flag, &value)?),
            "--outer-dtype" => diloco.outer_dtype = parsed(&flag, &value)?,
            other => return Err(format!("unknown option '{other}' (see --help)").into()),
        }
    }
    if epochs == 0 || batch_size == 0 {
        return Err("--epochs and --batch-size: expected a whole number >= 1".into());
    }
    let (train, test) = digits::load()?.split(0.2, 0);
    let strategy = match strategy {
        StrategyConfig::Fsdp(_) => StrategyConfig::Fsdp(FsdpConfig {
            auto_wrap_policy: "TransformerEncoderLayer".parse()?,
            ..Default::default()
        }),
        StrategyConfig::LocalSgd(_) => StrategyConfig::LocalSgd(LocalSgdConfig {
            local_sgd_steps,
            ..Default::default()
        }),
        StrategyConfig::DiLoCo(_) => StrategyConfig::DiLoCo(diloco),
        other => other,
    };
    let config = AcceleratorConfig {
        parallelism: afterburner::ParallelismConfig {
            strategy,
            devices: workers,
            ..Default::default()
        },
        ..Default::default()
    };
    // Flex keeps one RNG per process: build the model once, before the workers start.
    <B as burn::tensor::backend::Backend>::seed(&device(), config.seed);
    let model = VitConfig::new().init::<B>(&device());
    if mpi {
        return run_mpi(config, model, train, test, epochs, batch_size);
    }
    let accuracies = Accelerator::<B>::run(config, move |acc| {
        train_and_evaluate(
            acc,
            model.clone(),
            train.clone(),
            test.clone(),
            epochs,
            batch_size,
        )
    })?;
    println!(
        "test accuracy (every rank agrees): {:.2}%",
        accuracies[0] * 100.0
    );
    Ok(())
}

/// This process as one rank of an MPI job.
#[cfg(feature = "mpi")]
fn run_mpi(
    config: AcceleratorConfig,
    model: afterburner_demos::models::Vit<B>,
    train: ImageDataset,
    test: ImageDataset,
    epochs: usize,
    batch_size: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (rank, accuracy) = Accelerator::<B>::launch_mpi(config, device(), move |acc| {
        let rank = acc.rank();
        let accuracy = train_and_evaluate(acc, model, train, test, epochs, batch_size)?;
        Ok((rank, accuracy))
    })?;
    println!(
        "rank {rank}: test accuracy (every rank agrees): {:.2}%",
        accuracy * 100.0
    );
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(
    _: AcceleratorConfig,
    _: afterburner_demos::models::Vit<B>,
    _: ImageDataset,
    _: ImageDataset,
    _: usize,
    _: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--mpi needs the example built with --features mpi (and Open MPI installed)".into())
}

/// One rank: the single-device loop, then its shard of the test set, gathered.
fn train_and_evaluate(
    mut acc: Accelerator<B>,
    model: afterburner_demos::models::Vit<B>,
    train: ImageDataset,
    test: ImageDataset,
    epochs: usize,
    batch_size: usize,
) -> Result<f64, AccelerateError> {
    let device = device();
    let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init())?;
    let loader = acc.dataloader(train, BATCHER, batch_size)?;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut lr = 2e-3;
    for epoch in 0..epochs {
        let mut total = 0.0;
        for batch in loader.epoch(epoch) {
            let logits = acc.forward(&model, batch.images, |m, x| m.forward(x))?;
            let loss = loss_fn.forward(logits, batch.labels);
            total += loss.clone().into_scalar().elem::<f64>();
            acc.backward(loss, &model)?;
            model = acc.step(model, &mut optim, &mut lr)?;
        }
        if acc.is_main_process() {
            println!(
                "epoch {epoch}: rank 0 mean loss {:.4} ({} optimizer steps, {} gradient all-reduces, {} parameter syncs)",
                total / loader.num_batches() as f64,
                acc.counters().optimizer_steps,
                acc.gradient_all_reduces(),
                acc.parameter_syncs()
            );
        }
    }
    // Local SGD / DiLoCo: a last sync if the last period was cut short (a no-op otherwise).
    let model = acc.finish(model)?;
    // Each rank scores its shard; gather_for_metrics puts them back in test-set order.
    let n_test = test.len();
    let mut correct = Vec::new();
    for batch in acc.eval_dataloader(test, BATCHER, 256)?.epoch(0) {
        let logits = acc.forward(&model, batch.images, |m, x| m.forward(x))?;
        let hits = logits.argmax(1).reshape([-1]).equal(batch.labels).float();
        correct.extend(
            hits.into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .unwrap_or_default(),
        );
    }
    let mine = Tensor::<B, 1>::from_floats(correct.as_slice(), &device);
    let all = acc.gather_for_metrics(mine, n_test)?;
    Ok(all.mean().into_scalar().elem::<f64>())
}
