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

use afterburner::data::DataLoader;
use afterburner::demos::models::{Vit, VitConfig};
use afterburner::demos::{ImageBatcher, ImageDataset, ImageItem, digits};
use afterburner::{AccelerateError, Accelerator, AcceleratorConfig};
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

fn main() {
    backend::show_warnings();
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
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
    let loader = DataLoader::new(train, BATCHER, args.batch_size, backend::device())?
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

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: AcceleratorConfig::default(),
        epochs: 30,
        batch_size: 32,
        lr: 2e-3,
        plain: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<f64>().map_err(|e| format!("{flag}: '{v}': {e}"));
        match flag.as_str() {
            "--precision" => {
                args.config.precision = value()?.parse().map_err(|e| format!("{e}"))?
            }
            "--epochs" => args.epochs = number(value()?)? as usize,
            "--batch-size" => args.batch_size = number(value()?)? as usize,
            "--accumulation" => {
                args.config.gradient_accumulation_steps = number(value()?)? as usize
            }
            "--max-grad-norm" => args.config.max_grad_norm = Some(number(value()?)?),
            "--lr" => args.lr = number(value()?)?,
            "--seed" => args.config.seed = number(value()?)? as u64,
            "--gradient-checkpointing" => {
                args.config.gradient_checkpointing = value()?.parse().map_err(|e| format!("{e}"))?
            }
            "--autocast" => args.config.autocast = value()?.parse().map_err(|e| format!("{e}"))?,
            "--plain" => args.plain = true,
            other => return Err(format!("unknown option '{other}' (see the file's header)")),
        }
    }
    Ok(args)
}
