//! A plain Burn training loop and the same loop on afterburner, side by side.
//!
//! Trains a small ViT on the built-in 8x8 digits and prints the test accuracy.
//!
//! ```text
//! cargo run --release --example minimal -- --precision bf16-mixed
//! cargo run --release --example minimal -- --plain            # the plain Burn loop
//! ```
//! Options: --precision P (32-true, bf16-mixed, 16-mixed, bf16-true, 16-true), --epochs N,
//! --batch-size N, --accumulation N, --max-grad-norm X, --lr X, --seed N,
//! --gradient-checkpointing P (none, all, every-<k>), --autocast M (auto, op, view: how the
//! mixed precisions run), --plain.

mod backend;

use afterburner::data::DataLoaderShard;
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig};
use afterburner_demos::models::{Vit, VitConfig};
use afterburner_demos::{ImageBatcher, ImageDataset, ImageItem, digits};
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};

use backend::{B, device};

const BATCHER: ImageBatcher = ImageBatcher {
    channels: 1,
    height: 8,
    width: 8,
};

struct Args {
    config: AcceleratorConfig,
    epochs: usize,
    batch_size: usize,
    lr: f64,
    plain: bool,
}

fn main() -> std::process::ExitCode {
    backend::main_with(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let (train, test) = digits::load()?.split(0.2, 0);
    println!(
        "digits: {} train / {} test images, {} epochs, batch {}",
        train.len(),
        test.len(),
        args.epochs,
        args.batch_size
    );
    let accuracy = if args.plain {
        train_plain(&args, train, test.items())?
    } else {
        train_accelerated(&args, train, test.items())?
    };
    println!("test accuracy: {:.2}%", accuracy * 100.0);
    Ok(())
}

/// The ordinary Burn loop (f32, no accumulation, no clipping).
fn train_plain(
    args: &Args,
    train: ImageDataset,
    test: &[ImageItem],
) -> Result<f64, Box<dyn std::error::Error>> {
    let device = device();
    B::seed(&device, args.config.seed);
    let mut model = VitConfig::new().init::<B>(&device);
    let mut optim = AdamWConfig::new().init();
    let loader = DataLoaderShard::new(train, BATCHER, args.batch_size, backend::device())?
        .shuffle(args.config.seed);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for epoch in 0..args.epochs {
        let mut total = 0.0;
        for batch in loader.epoch(epoch) {
            let logits = model.forward(batch.images);
            let loss = loss_fn.forward(logits, batch.labels);
            total += loss.clone().into_scalar().elem::<f64>();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(args.lr, model, grads);
        }
        println!(
            "epoch {epoch}: mean loss {:.4}",
            total / loader.num_batches() as f64
        );
    }
    Ok(accuracy(test, |x| Ok(model.forward(x)))?)
}

/// The same loop on afterburner: the six changed lines are marked.
fn train_accelerated(
    args: &Args,
    train: ImageDataset,
    test: &[ImageItem],
) -> Result<f64, Box<dyn std::error::Error>> {
    let device = device();
    let mut acc = Accelerator::<B>::new(args.config.clone(), backend::device())?; // (1)
    let model = VitConfig::new().init::<B>(&device);
    let (mut model, mut optim) = acc.setup(model, AdamWConfig::new().init())?; // (2)
    let loader = acc.dataloader(train, BATCHER, args.batch_size)?; // (3)
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut lr = args.lr;
    for epoch in 0..args.epochs {
        let mut total = 0.0;
        for batch in loader.epoch(epoch) {
            let logits = acc.forward(&model, batch.images, |m, x| m.forward(x))?; // (4)
            let loss = loss_fn.forward(logits, batch.labels);
            total += loss.clone().into_scalar().elem::<f64>();
            acc.backward(loss, &model)?; // (5)
            model = acc.step(model, &mut optim, &mut lr)?; // (6)
        }
        println!(
            "epoch {epoch}: mean loss {:.4} ({} optimizer steps, {} skipped)",
            total / loader.num_batches() as f64,
            acc.counters().optimizer_steps,
            acc.counters().skipped_steps
        );
    }
    Ok(accuracy(test, |x| {
        acc.forward(&model, x, |m: &Vit<B>, x| m.forward(x))
    })?)
}

/// Share of `items` whose arg-max logit is the label.
fn accuracy(
    items: &[ImageItem],
    forward: impl Fn(Tensor<B, 4>) -> Result<Tensor<B, 2>, AccelerateError>,
) -> Result<f64, AccelerateError> {
    let device = device();
    let pixels: Vec<f32> = items
        .iter()
        .flat_map(|i| i.pixels.iter().copied())
        .collect();
    let images =
        Tensor::<B, 4>::from_data(TensorData::new(pixels, [items.len(), 1, 8, 8]), &device);
    let predicted = forward(images)?.argmax(1).into_data();
    let predicted: Vec<i64> = predicted.convert::<i64>().to_vec().unwrap_or_default();
    let correct = items
        .iter()
        .zip(&predicted)
        .filter(|(item, p)| item.label as i64 == **p)
        .count();
    Ok(correct as f64 / items.len() as f64)
}

/// `--help`: every option, what it sets, its values and default.
const HELP: &str = "\
options:
  --precision P               32-true (default), bf16-mixed, 16-mixed, bf16-true, 16-true
  --autocast M                how the mixed precisions run: auto (default), op, view
  --epochs N                  epochs to train, at least 1 (default 30)
  --batch-size N              items per batch, at least 1 (default 32)
  --accumulation N            micro-batches per optimizer step (default 1)
  --max-grad-norm X           clip the global gradient norm to X (default: no clipping)
  --lr X                      AdamW's learning rate (default 2e-3)
  --seed N                    seed of the model and the data order (default 42)
  --gradient-checkpointing P  none (default), all, every-<k>, selective, balanced
  --plain                     the plain Burn loop instead (f32, no afterburner)
  --help                      this text";

fn parse_args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut args = Args {
        config: AcceleratorConfig::default(),
        epochs: 30,
        batch_size: 32,
        lr: 2e-3,
        plain: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" {
            return Err(AccelerateError::Help(HELP.into()).into());
        }
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value (see --help)"))
        };
        let number = |v: String| v.parse::<f64>().map_err(|e| format!("{flag}: '{v}': {e}"));
        let count = |v: String| match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("{flag}: '{v}': expected a whole number >= 1")),
        };
        match flag.as_str() {
            "--precision" => args.config.precision = value()?.parse()?,
            "--epochs" => args.epochs = count(value()?)?,
            "--batch-size" => args.batch_size = count(value()?)?,
            "--accumulation" => {
                args.config.gradient_accumulation_steps = number(value()?)? as usize
            }
            "--max-grad-norm" => args.config.max_grad_norm = Some(number(value()?)?),
            "--lr" => args.lr = number(value()?)?,
            "--seed" => args.config.seed = number(value()?)? as u64,
            "--gradient-checkpointing" => args.config.gradient_checkpointing = value()?.parse()?,
            "--autocast" => args.config.autocast = value()?.parse()?,
            "--plain" => args.plain = true,
            other => return Err(format!("unknown option '{other}' (see --help)").into()),
        }
    }
    Ok(args)
}
