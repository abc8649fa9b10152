//! Pretrained weights in and out: a model's parameters from a safetensors file or a PyTorch
//! file (through burn-store), with key remapping and an error that lists every missing and
//! unexpected key; and the trained model saved as safetensors that PyTorch loads.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn_store::{
    ApplyResult, BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, PytorchStore,
    SafetensorsStore,
};

use crate::AccelerateError;
use crate::finite::has_nonfinite;

/// Where a weights file comes from: it decides the layout of `Linear` weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Written by Burn (`Linear` weights `[in, out]`).
    Burn,
    /// Written by PyTorch (`Linear` weights `[out, in]`, LayerNorm `weight`/`bias`): converted
    /// on load, and written so on save.
    PyTorch,
}

/// How to read a weights file: the layout, key renames (`(regex, replacement)`, applied in
/// order to the file's keys) and whether missing model parameters are allowed.
#[derive(Debug, Clone)]
pub struct LoadWeights {
    path: PathBuf,
    layout: Layout,
    renames: Vec<(String, String)>,
    allow_missing: bool,
}

impl LoadWeights {
    /// Weights from `path`: a `.safetensors` file, or a PyTorch file (`.pt`, `.pth`, `.bin`,
    /// always of PyTorch layout). By default a `.safetensors` file is of Burn layout, every
    /// model parameter must be in the file and every tensor of the file must be used.
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let layout = match is_safetensors(&path) {
            true => Layout::Burn,
            false => Layout::PyTorch,
        };
        Self {
            path,
            layout,
            renames: Vec::new(),
            allow_missing: false,
        }
    }

    /// Sets the file's layout (a safetensors file written by PyTorch: [`Layout::PyTorch`]).
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Renames the file's keys matching the regex `pattern` to `replacement` (`$1` for
    /// groups), e.g. `("^encoder\\.", "blocks.")`.
    pub fn rename(mut self, pattern: &str, replacement: &str) -> Self {
        self.renames.push((pattern.into(), replacement.into()));
        self
    }

    /// Lets model parameters absent from the file keep their values (a new head on a
    /// pretrained body); unexpected tensors in the file are still an error.
    pub fn allow_missing(mut self, allow: bool) -> Self {
        self.allow_missing = allow;
        self
    }

    /// `model` with the file's values; an error names the file and lists every missing and
    /// unexpected key (nothing is returned half-loaded).
    pub fn into_model<B: Backend, M: Module<B>>(&self, model: M) -> Result<M, AccelerateError> {
        let mut loaded = model.clone();
        let result = match is_safetensors(&self.path) {
            true => {
                let mut store = SafetensorsStore::from_file(&self.path).allow_partial(true);
                for (pattern, replacement) in &self.renames {
                    store = store.with_key_remapping(pattern, replacement);
                }
                if self.layout == Layout::PyTorch {
                    store = store.with_from_adapter(PyTorchToBurnAdapter);
                }
                loaded.load_from(&mut store).map_err(|e| self.error(e))?
            }
            false => {
                let mut store = PytorchStore::from_file(&self.path).allow_partial(true);
                for (pattern, replacement) in &self.renames {
                    store = store.with_key_remapping(pattern, replacement);
                }
                loaded.load_from(&mut store).map_err(|e| self.error(e))?
            }
        };
        self.check(&result)?;
        Ok(loaded)
    }

    fn check(&self, result: &ApplyResult) -> Result<(), AccelerateError> {
        let missing: Vec<String> = match self.allow_missing {
            true => Vec::new(),
            false => result.missing.iter().map(|(key, _)| key.clone()).collect(),
        };
        // burn-store reports PyTorch's LayerNorm `weight`/`bias` as unused under their file
        // names even when its adapter applied them as `gamma`/`beta`.
        let applied_as = |key: &str| {
            let renamed = match key.rsplit_once('.') {
                Some((module, "weight")) => format!("{module}.gamma"),
                Some((module, "bias")) => format!("{module}.beta"),
                _ => return false,
            };
            self.layout == Layout::PyTorch && result.applied.contains(&renamed)
        };
        let unexpected: Vec<String> = result
            .unused
            .iter()
            .filter(|key| !applied_as(key))
            .cloned()
            .collect();
        let errors: Vec<String> = result.errors.iter().map(|e| e.to_string()).collect();
        if missing.is_empty() && unexpected.is_empty() && errors.is_empty() {
            return Ok(());
        }
        Err(AccelerateError::Weights {
            path: self.path.clone(),
            missing,
            unexpected,
            errors,
        })
    }

    fn error(&self, e: impl std::fmt::Display) -> AccelerateError {
        AccelerateError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }
}

/// Saves `model`'s parameters to a safetensors file at `path`, in `layout` (PyTorch: loads
/// with `safetensors.torch.load_file` into the matching PyTorch module). A model with an
/// inf/NaN parameter is refused ([`AccelerateError::NonFinite`]) and a file already at `path`
/// is kept: a poisoned model never replaces a good one. The file is written beside `path`
/// and renamed into place, so a crash mid-write never leaves half a file there.
pub fn save_safetensors<B: Backend, M: Module<B>>(
    model: &M,
    path: impl AsRef<Path>,
    layout: Layout,
) -> Result<(), AccelerateError> {
    let path = path.as_ref();
    if has_nonfinite(model) {
        return Err(AccelerateError::NonFinite(format!(
            "save_model to {}: the model's parameters hold inf/NaN; nothing was written{}",
            path.display(),
            match path.exists() {
                true => " and the file there is kept",
                false => "",
            }
        )));
    }
    let name = path.file_name().map_or_else(
        || "model.safetensors".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let temporary = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let mut store = SafetensorsStore::from_file(&temporary).overwrite(true);
    if layout == Layout::PyTorch {
        store = store.with_to_adapter(BurnToPyTorchAdapter);
    }
    let written = model
        .save_into(&mut store)
        .map_err(|e| AccelerateError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("writing safetensors: {e}"),
        })
        .and_then(|()| {
            std::fs::rename(&temporary, path)
                .map_err(|e| AccelerateError::io("renaming into place", path, e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn is_safetensors(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}
