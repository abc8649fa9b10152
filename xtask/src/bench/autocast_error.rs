//! The autocast suite's accuracy half: output and gradient errors against f32 of op-level
//! autocast and of the half view on the same weights, and of PyTorch's `torch.autocast` on
//! those weights too (`xtask/torch/autocast_error.py`, when PyTorch imports).

use std::path::Path;
use std::process::Command;

use afterburner::precision::materialize_params;
use afterburner::{Accelerator, AcceleratorConfig, AutocastMode};
use afterburner_demos::digits;
use afterburner_demos::models::VitConfig;
use burn::data::dataloader::batcher::Batcher;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderInput};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Distribution, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use xtask::suite::helpers::{flat_grads, rel_l2};

/// The models whose errors the suite measures.
#[derive(Debug, Clone, Copy)]
pub(super) enum Net {
    /// Burn's `TransformerEncoder`: 2 post-norm blocks, d_model 64, 4 heads, MLP 128, on a
    /// [8, 16, 64] normal input; loss sum(out * r) with a fixed normal r.
    Encoder,
    /// The demo ViT (6 pre-norm blocks of Burn's `TransformerEncoderLayer`, d_model 128, MLP
    /// 256) on 32 digits; cross-entropy loss.
    Vit,
}

impl Net {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Net::Encoder => "TransformerEncoder (2 blocks, d 64), [8, 16, 64] input",
            Net::Vit => "ViT (6 blocks, d 128) on 32 digits",
        }
    }
}

/// Errors against f32 (relative L2; gradients as one global vector).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Errors {
    pub(super) model: String,
    pub(super) precision: String,
    pub(super) op_output: f64,
    pub(super) op_grads: f64,
    pub(super) view_output: f64,
    pub(super) view_grads: f64,
    /// torch.autocast on the same weights; `None` without PyTorch.
    pub(super) pytorch: Option<TorchErrors>,
}

/// What autocast_error.py prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TorchErrors {
    pub(super) torch: String,
    /// Its f32 output against ours: checks the two models are the same.
    pub(super) f32_vs_burn: f64,
    pub(super) output_error: f64,
    pub(super) grad_error: f64,
}

/// One forward and backward: the output and every parameter's gradient, flattened.
struct Probe {
    output: Vec<f32>,
    grads: Vec<f32>,
}

/// Measures `net` under `precision` ("bf16-mixed" or "16-mixed") on `Autodiff<Autocast<I>>`
/// (`B`); `python` runs the PyTorch side when given.
pub(super) fn errors<B: AutodiffBackend>(
    net: Net,
    precision: &str,
    python: Option<&str>,
) -> Result<Errors, String> {
    let device = B::Device::default();
    // One forward and backward of the net built from seed 7; with `export`, also the spec the
    // PyTorch script reads (weights, input, targets, this run's output).
    let run = |precision: &str, mode, export_spec: bool| -> Result<(Probe, Value), String> {
        match net {
            Net::Encoder => {
                B::seed(&device, 7);
                let model = TransformerEncoderConfig::new(64, 128, 4, 2)
                    .with_dropout(0.0)
                    .init::<B>(&device);
                materialize_params(&model);
                let normal = Distribution::Normal(0.0, 1.0);
                let x = Tensor::<B, 3>::random([8, 16, 64], normal, &device);
                let r = Tensor::<B, 3>::random([8, 16, 64], normal, &device);
                let probe = probe(
                    precision,
                    mode,
                    &model,
                    x.clone(),
                    |m, x| m.forward(TransformerEncoderInput::new(x)),
                    |out| (out * r.clone()).sum(),
                )?;
                if !export_spec {
                    return Ok((probe, Value::Null));
                }
                let spec = json!({
                    "model": "encoder", "heads": 4, "layers": 2, "norm_first": false,
                    "params": export(&model), "input": data(x), "r": data(r),
                    "f32_output": probe.output,
                });
                Ok((probe, spec))
            }
            Net::Vit => {
                B::seed(&device, 7);
                let model = VitConfig::new()
                    .with_d_model(128)
                    .with_d_ff(256)
                    .with_n_layers(6)
                    .init::<B>(&device);
                materialize_params(&model);
                let set = digits::load().map_err(|e| e.to_string())?;
                let batch = set.batcher().batch(set.items()[..32].to_vec(), &device);
                let labels: Vec<i64> = batch.labels.clone().into_data().iter::<i64>().collect();
                let loss = CrossEntropyLossConfig::new().init(&device);
                let images = batch.images.clone();
                let probe = probe(
                    precision,
                    mode,
                    &model,
                    images.clone(),
                    |m, x| m.forward(x),
                    |out| loss.forward(out, batch.labels.clone()),
                )?;
                if !export_spec {
                    return Ok((probe, Value::Null));
                }
                let spec = json!({
                    "model": "vit", "heads": 4, "layers": 6,
                    "params": export(&model), "input": data(images), "labels": labels,
                    "f32_output": probe.output,
                });
                Ok((probe, spec))
            }
        }
    };
    let (reference, spec) = run("32-true", AutocastMode::Auto, python.is_some())?;
    let (op, _) = run(precision, AutocastMode::Op, false)?;
    let (view, _) = run(precision, AutocastMode::View, false)?;
    let pytorch = match python {
        Some(python) => Some(pytorch_errors(python, net, precision, &spec)?),
        None => None,
    };
    Ok(Errors {
        model: net.describe().into(),
        precision: precision.into(),
        op_output: rel_l2(&op.output, &reference.output),
        op_grads: rel_l2(&op.grads, &reference.grads),
        view_output: rel_l2(&view.output, &reference.output),
        view_grads: rel_l2(&view.grads, &reference.grads),
        pytorch,
    })
}

/// One forward through the Accelerator in `precision` / `mode` (on a copy of `model` set up
/// as `Accelerator::setup_model` does), then the loss's backward.
fn probe<B, M, const DI: usize, const DO: usize>(
    precision: &str,
    mode: AutocastMode,
    model: &M,
    input: Tensor<B, DI>,
    forward: impl FnOnce(&M, Tensor<B, DI>) -> Tensor<B, DO>,
    loss: impl FnOnce(Tensor<B, DO>) -> Tensor<B, 1>,
) -> Result<Probe, String>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let config = AcceleratorConfig {
        precision: precision.parse().map_err(|e| format!("{e}"))?,
        autocast: mode,
        ..Default::default()
    };
    let acc = Accelerator::<B>::new(config, Default::default()).map_err(|e| e.to_string())?;
    let model = acc.setup_model(model.clone()).map_err(|e| e.to_string())?;
    let out = acc
        .forward(&model, input, forward)
        .map_err(|e| e.to_string())?;
    let output = values(out.clone());
    let gradients = GradientsParams::from_grads(acc.raw_backward(loss(out)), &model);
    Ok(Probe {
        output,
        grads: flat_grads(&model, &gradients),
    })
}

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().to_vec().unwrap_or_default()
}

/// `{shape, data}` of a tensor, as autocast_error.py reads it.
fn data<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Value {
    json!({"shape": t.dims().to_vec(), "data": values(t)})
}

/// `[[path, {shape, data}], ...]` of every float parameter, in visiting order (the order of
/// `flat_grads`), with Burn's module paths ("layers.0.mha.query.weight").
fn export<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> Value {
    struct Export {
        path: Vec<String>,
        params: Vec<Value>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Export {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.into());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.params
                .push(json!([self.path.join("."), data(param.val())]));
        }
    }
    let mut export = Export {
        path: Vec::new(),
        params: Vec::new(),
    };
    model.visit(&mut export);
    Value::Array(export.params)
}

/// Writes `spec` to a scratch file and runs autocast_error.py on it.
fn pytorch_errors(
    python: &str,
    net: Net,
    precision: &str,
    spec: &Value,
) -> Result<TorchErrors, String> {
    let file = std::env::temp_dir().join(format!(
        "afterburner-autocast-{net:?}-{}.json",
        std::process::id()
    ));
    std::fs::write(&file, spec.to_string()).map_err(|e| format!("writing {file:?}: {e}"))?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("torch/autocast_error.py");
    let dtype = if precision.starts_with("bf16") {
        "bfloat16"
    } else {
        "float16"
    };
    let out = Command::new(python)
        .arg(&script)
        .args(["--weights", &file.to_string_lossy(), "--dtype", dtype])
        .output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| format!("running autocast_error.py: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "autocast_error.py failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("autocast_error.py printed {line:?}: {e}"))
}
