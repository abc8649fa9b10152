//! Pretrained weights: safetensors written by Burn and in PyTorch's layout load back with the
//! expected values; files written by PyTorch itself (`tests/fixtures/make_torch_weights.py`)
//! load and give PyTorch's output; a file that does not match names every missing and
//! unexpected key.

mod common;

use std::path::{Path, PathBuf};

use afterburner_accelerator::weights::{Layout, LoadWeights, save_safetensors};
use burn::backend::Flex;
use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use common::{flatten, params, rng_lock, vit};

fn temp_file(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| common::scratch_dir("weights"));
    std::fs::create_dir_all(dir).unwrap();
    dir.join(name)
}

#[test]
fn a_saved_model_loads_into_another() {
    let _rng = rng_lock();
    let trained = vit(1);
    let path = temp_file("vit.safetensors");
    save_safetensors(&trained, &path, Layout::Burn).unwrap();
    let fresh = vit(2);
    assert_ne!(flatten(&params(&fresh)), flatten(&params(&trained)));
    let loaded = LoadWeights::from_file(&path).into_model(fresh).unwrap();
    assert_eq!(flatten(&params(&loaded)), flatten(&params(&trained)));
    // Written in PyTorch's layout, read back as PyTorch's.
    let torch = temp_file("vit-torch.safetensors");
    save_safetensors(&trained, &torch, Layout::PyTorch).unwrap();
    let loaded = LoadWeights::from_file(&torch)
        .layout(Layout::PyTorch)
        .into_model(vit(3))
        .unwrap();
    assert_eq!(flatten(&params(&loaded)), flatten(&params(&trained)));
}

#[test]
fn a_mismatch_lists_missing_and_unexpected_keys() {
    let _rng = rng_lock();
    let path = temp_file("renamed.safetensors");
    save_safetensors(&vit(1), &path, Layout::Burn).unwrap();
    let err = LoadWeights::from_file(&path)
        .rename(r"^head\.", "classifier.")
        .into_model(vit(2))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("head.weight") && err.contains("classifier.weight"),
        "{err}"
    );
    // Allowing missing parameters still refuses unexpected tensors.
    let err = LoadWeights::from_file(&path)
        .rename(r"^head\.", "classifier.")
        .allow_missing(true)
        .into_model(vit(2))
        .unwrap_err()
        .to_string();
    assert!(err.contains("classifier.bias"), "{err}");
    // A renamed file loads once renamed back.
    let back = temp_file("renamed-back.safetensors");
    let renamed = LoadWeights::from_file(&path).into_model(vit(1)).unwrap();
    save_safetensors(&renamed, &back, Layout::Burn).unwrap();
    let err = LoadWeights::from_file(temp_file("absent.safetensors")).into_model(vit(1));
    assert!(err.is_err());
}

/// A safetensors file written the way `safetensors.torch.save_file` writes a PyTorch
/// `nn.Linear(3, 2)`: `weight` `[out, in]` = `[[1, 2, 3], [4, 5, 6]]`, `bias` `[7, 8]`.
fn torch_linear_file() -> PathBuf {
    let weight: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let bias: [f32; 2] = [7.0, 8.0];
    let header = r#"{"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}"#;
    let mut header = header.as_bytes().to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    for v in bias.iter().chain(&weight) {
        bytes.extend(v.to_le_bytes());
    }
    let path = temp_file("torch-linear.safetensors");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_pytorch_layout_file_loads_transposed() {
    let device = Default::default();
    let linear: Linear<Flex> = LinearConfig::new(3, 2).init(&device);
    let loaded = LoadWeights::from_file(torch_linear_file())
        .layout(Layout::PyTorch)
        .into_model(linear)
        .unwrap();
    // Burn keeps `[in, out]`: the transpose of PyTorch's.
    let weight: Tensor<Flex, 2> = loaded.weight.val();
    assert_eq!(weight.dims(), [3, 2]);
    assert_eq!(
        weight.into_data().to_vec::<f32>().unwrap(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    let bias = loaded
        .bias
        .unwrap()
        .val()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(bias, vec![7.0, 8.0]);
    // Read as Burn's layout, the shapes do not fit: an error, not a silent transpose.
    let linear: Linear<Flex> = LinearConfig::new(3, 2).init(&device);
    assert!(
        LoadWeights::from_file(torch_linear_file())
            .into_model(linear)
            .is_err()
    );
}

/// The Burn twin of the PyTorch module in `tests/fixtures/make_torch_weights.py`.
#[derive(Module, Debug)]
struct Tiny<B: Backend> {
    fc: Linear<B>,
    norm: LayerNorm<B>,
}

impl<B: Backend> Tiny<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            fc: LinearConfig::new(3, 4).init(device),
            norm: LayerNormConfig::new(4).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.norm.forward(self.fc.forward(x))
    }
}

#[test]
fn files_written_by_pytorch_load_and_give_pytorchs_output() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let text = std::fs::read_to_string(fixtures.join("tiny_torch_output.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = |key: &str| -> Vec<f32> {
        expected[key]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
            })
            .collect()
    };
    let device = Default::default();
    let input = Tensor::<Flex, 2>::from_data(TensorData::new(rows("input"), [2, 3]), &device);
    let want = rows("output");
    for file in ["tiny_torch.safetensors", "tiny_torch.pt"] {
        let model = LoadWeights::from_file(fixtures.join(file))
            .layout(Layout::PyTorch)
            .into_model(Tiny::<Flex>::new(&device))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let got = model
            .forward(input.clone())
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-5,
                "{file}: {got:?} vs PyTorch's {want:?}"
            );
        }
    }
}
