//! Parameters that became inf/NaN: found where the cost is already paid (a step skipped for
//! non-finite gradients, a save, the end of training), never by an extra host read on the
//! step path of a healthy run.

use afterburner_parallel::ParallelStrategy;
use afterburner_precision::Precision;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Tensor};

use crate::{AccelerateError, Accelerator, NonFinitePolicy};

/// Whether any float parameter of `model` holds inf or NaN (one reduction and one host read
/// for the whole model).
pub(crate) fn has_nonfinite<B: Backend, M: Module<B>>(model: &M) -> bool {
    struct AbsSum<B: Backend>(Option<Tensor<B, 1>>);
    impl<B: Backend> ModuleVisitor<B> for AbsSum<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let sum = param.val().detach().cast(DType::F32).abs().sum();
            self.0 = Some(match self.0.take() {
                Some(total) => total + sum,
                None => sum,
            });
        }
    }
    let mut total = AbsSum::<B>(None);
    model.visit(&mut total);
    total
        .0
        .is_some_and(|t| !t.into_scalar().elem::<f64>().is_finite())
}

impl<B: AutodiffBackend, S: ParallelStrategy<B>> Accelerator<B, S> {
    /// Errors with [`AccelerateError::NonFinite`] when `model`'s parameters hold inf/NaN on
    /// any rank (under the `nonfinite_gradients` policies `"skip"` and `"error"`; `"apply"`
    /// checks nothing). One reduction and one host read; every rank calls it. The Trainer
    /// calls it at the end of training; [`step`](Self::step) calls it itself when a step is
    /// skipped for non-finite gradients (what a poisoned model gives at every step after).
    pub fn check_parameters_finite<M: AutodiffModule<B>>(
        &self,
        model: &M,
    ) -> Result<(), AccelerateError> {
        if self.config.nonfinite_gradients == NonFinitePolicy::Apply {
            return Ok(());
        }
        let local = match has_nonfinite(model) {
            true => f64::NAN,
            false => 0.0,
        };
        // Summed over the ranks that hold different parts (FSDP, TP), then agreed on by
        // the ranks that step alone (Local SGD, DiLoCo).
        let global = !self
            .strategy
            .global_squared_norm(local, &self.device)?
            .is_finite();
        if !self.strategy.agree_on_skip(global, &self.device)? {
            return Ok(());
        }
        Err(AccelerateError::NonFinite(format!(
            "after optimizer step {} the model's parameters hold inf/NaN: an update made them \
             so although its gradients were finite (a learning rate too large, or an \
             optimizer epsilon that {} cannot hold: {}); every later step would be skipped, \
             so training stops here, and a poisoned model is never saved (the newest \
             checkpoint is the last good state)",
            self.counters.optimizer_steps,
            self.precision().as_str(),
            epsilon_hint(self.precision()),
        )))
    }
}

/// What to do about an optimizer epsilon under `precision`.
fn epsilon_hint(precision: Precision) -> &'static str {
    match precision {
        Precision::F16True => {
            "f16 parameters and optimizer state round an epsilon below 6.1e-5 to 0, and Adam \
             then divides 0 by 0: use an epsilon of at least 6.1e-5 (AdamWConfig::with_epsilon, \
             the Trainer's adam_epsilon) or 16-mixed"
        }
        _ => "Adam's epsilon must be a normal number of the parameters' dtype",
    }
}
