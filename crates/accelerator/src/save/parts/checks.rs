//! Checks on a model part before it is saved or loaded: no inf/NaN parameter is saved, and a
//! loaded record has the model's structure and every parameter's shape.

use std::path::Path;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use afterburner_parallel::ParallelStrategy;

pub(super) use crate::finite::has_nonfinite;
use crate::quiet::quietly;

use super::StateParts;
use crate::AccelerateError;

/// An error naming every model part of `parts` that holds an inf/NaN parameter on this rank:
/// saving it would replace the last good state with a poisoned one.
pub(crate) fn refuse_nonfinite_models<B: AutodiffBackend, S: ParallelStrategy<B>>(
    dir: &Path,
    parts: &StateParts<'_, B, S>,
) -> Result<(), AccelerateError> {
    let poisoned: Vec<&str> = parts
        .parts
        .iter()
        .filter(|(_, slot)| slot.has_nonfinite())
        .map(|(name, _)| name.as_str())
        .collect();
    match poisoned.is_empty() {
        true => Ok(()),
        false => Err(AccelerateError::NonFinite(format!(
            "save_state to {}: model part(s) {} hold inf/NaN parameters; nothing was written \
             and the state there is kept (nonfinite_gradients = \"apply\" saves anyway)",
            dir.display(),
            poisoned.join(", ")
        ))),
    }
}

/// Every float parameter's dotted path and shape, in visit order.
fn shapes<B: Backend, M: Module<B>>(model: &M) -> Vec<(String, Vec<usize>)> {
    struct Shapes {
        path: Vec<String>,
        found: Vec<(String, Vec<usize>)>,
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let shape = param.val().dims().to_vec();
            self.found.push((self.path.join("."), shape));
        }
    }
    let mut visitor = Shapes {
        path: Vec::new(),
        found: Vec::new(),
    };
    model.visit(&mut visitor);
    visitor.found
}

/// `template` with `record` loaded, checking only that the record has its structure (the
/// parameters keep the record's shapes: for a saved rank's shards, whose shapes depend on the
/// world size that saved them).
pub(super) fn load_structure<B: AutodiffBackend, M: AutodiffModule<B>>(
    template: &M,
    record: M::Record,
) -> Result<M, AccelerateError> {
    // Burn asserts (panics) when a list of layers has another length.
    quietly(|| template.clone().load_record(record)).map_err(|_| AccelerateError::InvalidPart {
        part: String::new(),
        reason: "the saved model has another structure than this one (a list of layers of \
                 another length?); nothing was loaded"
            .into(),
    })
}

/// `template` with `record` loaded, after checking the record has its structure and every
/// parameter its shape; an error lists each mismatch (path, saved shape, model shape) and
/// leaves `template` as it was.
pub(super) fn load_checked<B: AutodiffBackend, M: AutodiffModule<B>>(
    template: &M,
    record: M::Record,
) -> Result<M, AccelerateError> {
    let loaded = load_structure(template, record)?;
    let (want, got) = (shapes(template), shapes(&loaded));
    let mut mismatches: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w.1 != g.1)
        .map(|(w, g)| format!("{}: saved {:?}, model {:?}", w.0, g.1, w.1))
        .collect();
    if want.len() != got.len() {
        mismatches.push(format!(
            "{} parameters saved, {} in the model",
            got.len(),
            want.len()
        ));
    }
    const SHOWN: usize = 8;
    if mismatches.len() > SHOWN {
        let more = mismatches.len() - SHOWN;
        mismatches.truncate(SHOWN);
        mismatches.push(format!("and {more} more"));
    }
    match mismatches.is_empty() {
        true => Ok(loaded),
        false => Err(AccelerateError::InvalidPart {
            part: String::new(),
            reason: format!(
                "the saved parameters do not fit this model; nothing was loaded: {}",
                mismatches.join("; ")
            ),
        }),
    }
}
