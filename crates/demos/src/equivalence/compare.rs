//! Judging a case: its parameters against the one-device run of the same data at the same
//! precision, relative to the size of that run's update, within a bound built from the
//! case's own reordering floor; refusals checked against the named errors the matrix expects.

use std::collections::HashMap;

use afterburner::Precision;
use afterburner::parallel::ShardingStrategy;

use super::case::{Case, Entry, LossShape, Norm, Step, Strategy};
use super::run::{B, run_case, run_one_device};
use crate::models::Transformer;

/// The least bound of a precision: 32-true 1e-6 (of the update), the half precisions 1e-4.
fn least_bound(precision: Precision) -> f64 {
    match precision.to_string().as_str() {
        "32-true" => 1e-6,
        _ => 1e-4,
    }
}

/// The rounding of averaged parameters, relative to the model's scale.
pub const PARAMETER_ROUNDING: f64 = 1e-6;

/// How many times a half precision's own error (against 32-true) a case at it may differ.
pub const HALF_ERRORS: f64 = 2.0;

/// How far above its reordering floor a case may be.
pub const FLOOR_FACTOR: f64 = 10.0;

/// What a case did.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Within its bound of one device.
    Equal,
    /// Past its bound where the matrix expects it to differ (the reason is the outcome's
    /// note, from [`by_design`]).
    ByDesign,
    /// Past its bound.
    Differs,
    /// Refused with the named error the matrix expects for it.
    Refused,
    /// Failed otherwise: an error it should not give, a refusal that did not come, a panic.
    Broken,
}

/// A case's verdict and figures.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case.
    pub case: Case,
    /// What it did.
    pub verdict: Verdict,
    /// `|params - one device's| / |one device's update|`, where it trained.
    pub error: Option<f64>,
    /// The bound it was held to.
    pub bound: Option<f64>,
    /// The one-device run at this precision against the same at 32-true (the precision's
    /// own error), same measure.
    pub precision_error: Option<f64>,
    /// The error, the expected refusal or a remark.
    pub note: String,
}

impl Outcome {
    /// Whether the case passes: equal, or refused by name as expected.
    pub fn passed(&self) -> bool {
        matches!(
            self.verdict,
            Verdict::Equal | Verdict::Refused | Verdict::ByDesign
        )
    }
}

/// The named error a case must be refused with, where the matrix expects a refusal: a text
/// the error's message contains.
pub fn expected_refusal(case: &Case) -> Option<&'static str> {
    let decided_on_host = case.strategy.tp_size() > 1;
    let sharded = matches!(
        case.strategy,
        Strategy::Fsdp(ShardingStrategy::Full | ShardingStrategy::GradOp) | Strategy::Dp2Tp2Fsdp
    );
    match (case.loss, case.step, case.entry) {
        // Outside `acc.forward` each rank's parameters are its shards (refused at backward).
        (LossShape::Aux | LossShape::SecondForward, _, _) if sharded => {
            Some("of the model outside acc.forward")
        }
        // Tensor parallelism's norm counts the replicated parameters once, on the host.
        (_, Step::Device, Entry::Loop) if decided_on_host => {
            Some("step_on_device() under strategy")
        }
        _ => None,
    }
}

/// Why a case is expected to differ from one device, where it is.
pub fn by_design(case: &Case) -> Option<&'static str> {
    match (case.strategy, case.norm, case.entry) {
        (Strategy::LocalSgd, Norm::PerItem, Entry::Trainer) => Some(
            "Local SGD's ranks step alone: the Trainer normalises each rank's loss by its own \
             items (no collective per step)",
        ),
        _ => None,
    }
}

/// What is expected of a case besides equality (shown in the table).
pub fn remark(case: &Case) -> Option<&'static str> {
    match (case.step, case.entry) {
        (Step::Device, Entry::Trainer) if case.strategy.tp_size() > 1 => {
            Some("the Trainer decides tensor parallelism's steps on the host")
        }
        _ => None,
    }
}

/// What tells the one-device runs apart: normalisation, loss, step, precision, micro-batches
/// per step and how many parts each step is split into.
type RunKey = (Norm, LossShape, Step, String, usize, usize);

/// The one-device runs the cases are compared with, each trained once.
pub struct References {
    initial: Transformer<B>,
    start: Vec<f32>,
    runs: HashMap<RunKey, Vec<f32>>,
}

impl References {
    /// No run yet; every run starts from `initial`.
    pub fn new(initial: Transformer<B>) -> Self {
        let start = crate::testing::flat_params::<B, _>(&initial);
        Self {
            initial,
            start,
            runs: HashMap::new(),
        }
    }

    /// The one-device run (see [`run_one_device`]).
    fn get(
        &mut self,
        case: &Case,
        precision: Precision,
        split: usize,
    ) -> Result<&Vec<f32>, String> {
        let key = (
            case.norm,
            case.loss,
            case.step,
            precision.to_string(),
            case.micro_batches,
            split,
        );
        if !self.runs.contains_key(&key) {
            let run = run_one_device(
                case.norm,
                case.loss,
                case.step,
                precision,
                case.micro_batches,
                split,
                &self.initial,
            )
            .map_err(|e| format!("the one-device reference failed: {e}"))?;
            self.runs.insert(key.clone(), run);
        }
        Ok(&self.runs[&key])
    }

    /// `|a - b| / |b - start|`.
    fn relative(&self, a: &[f32], b: &[f32]) -> f64 {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        diff.sqrt() / self.update_norm(b)
    }

    /// `|params| / |params - start|`: the model's scale on the update's.
    fn model_scale(&self, params: &[f32]) -> f64 {
        let norm: f64 = params.iter().map(|x| f64::from(*x).powi(2)).sum();
        norm.sqrt() / self.update_norm(params)
    }

    /// `|params - start|`.
    fn update_norm(&self, params: &[f32]) -> f64 {
        let update: f64 = params
            .iter()
            .zip(&self.start)
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum();
        update.sqrt().max(1e-30)
    }

    /// Runs `case` and judges it.
    pub fn judge(&mut self, case: &Case) -> Outcome {
        let mut outcome = Outcome {
            case: *case,
            verdict: Verdict::Broken,
            error: None,
            bound: None,
            precision_error: None,
            note: remark(case).unwrap_or_default().to_string(),
        };
        let initial = self.initial.clone();
        let ran =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(case, &initial)));
        let params = match (ran, expected_refusal(case)) {
            (Err(panic), _) => {
                outcome.note = format!("panicked: {}", panic_text(&panic));
                return outcome;
            }
            (Ok(Err(error)), Some(expected)) if error.to_string().contains(expected) => {
                outcome.verdict = Verdict::Refused;
                outcome.note = error.to_string();
                return outcome;
            }
            (Ok(Err(error)), _) => {
                outcome.note = format!("failed: {error}");
                return outcome;
            }
            (Ok(Ok(_)), Some(expected)) => {
                outcome.note = format!("trained where a refusal naming {expected:?} was expected");
                return outcome;
            }
            (Ok(Ok(params)), None) => params,
        };
        match self.measure(case, &params) {
            Ok((error, bound, precision_error)) => {
                outcome.error = Some(error);
                outcome.bound = Some(bound);
                outcome.precision_error = precision_error;
                outcome.verdict = match (error <= bound, by_design(case)) {
                    (true, _) => Verdict::Equal,
                    (false, Some(reason)) => {
                        outcome.note = reason.to_string();
                        Verdict::ByDesign
                    }
                    (false, None) => Verdict::Differs,
                };
            }
            Err(error) => outcome.note = error,
        }
        outcome
    }

    /// The case's error, its bound and its precision's own error.
    fn measure(&mut self, case: &Case, params: &[f32]) -> Result<(f64, f64, Option<f64>), String> {
        let reference = self.get(case, case.precision, 1)?.clone();
        let error = self.relative(params, &reference);
        // The floor: the same data split as the case splits it (data-parallel ranks times
        // micro-batches; in two at least: a case that splits nothing still sums in another
        // order, the tensor-parallel halves or the per-item division after backward), on one
        // device.
        let split = (case.strategy.dp_size() * case.micro_batches).max(2);
        let reordered = self.get(case, case.precision, split)?.clone();
        let floor = self.relative(&reordered, &reference);
        let mut bound = least_bound(case.precision).max(FLOOR_FACTOR * floor);
        let full: Precision = "32-true".parse().expect("a precision");
        let precision_error = match case.precision == full {
            true => None,
            false => {
                let exact = self.get(case, full, 1)?.clone();
                Some(self.relative(&reference, &exact))
            }
        };
        // A half precision rounds where the case splits the work (tensor parallelism's
        // partial sums, the ranks' shards, a loss divided before backward rather than after):
        // within twice its own error against 32-true.
        if let Some(own) = precision_error {
            bound = bound.max(HALF_ERRORS * own);
        }
        // Local SGD averages parameters, not gradients: it rounds at the parameters' scale,
        // 1e-6 of the model's (on the update's scale here).
        if case.strategy == Strategy::LocalSgd {
            bound = bound.max(PARAMETER_ROUNDING * self.model_scale(&reference));
        }
        Ok((error, bound, precision_error))
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}
