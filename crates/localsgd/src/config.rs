//! Settings of [`LocalSgd`](crate::LocalSgd) (`[local_sgd]`) and [`DiLoCo`](crate::DiLoCo)
//! (`[diloco]`), as config-file tables: unknown keys are errors, missing ones take the defaults.

use afterburner_parallel::{AutoWrapPolicy, ParallelError};

use crate::OuterDtype;
use serde::{Deserialize, Serialize};

/// Local SGD settings: the `[local_sgd]` table (each field's doc comment is the description
/// `--help` shows for the option).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, documented::DocumentedFields)]
#[serde(default, deny_unknown_fields)]
pub struct LocalSgdConfig {
    /// Optimizer steps between two parameter averages (Accelerate's `local_sgd_steps`; counts
    /// optimizer steps, not micro-batches). Default 8.
    pub local_sgd_steps: usize,
    /// Also average the optimizer state (e.g. Adam's moments) at every parameter average, so
    /// the replicas restart from the same optimizer too; one more all-reduce of the state's
    /// size. Default false (each rank keeps its own, as in Accelerate).
    pub average_optimizer_state: bool,
}

impl Default for LocalSgdConfig {
    fn default() -> Self {
        Self {
            local_sgd_steps: 8,
            average_optimizer_state: false,
        }
    }
}

impl LocalSgdConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), ParallelError> {
        if self.local_sgd_steps == 0 {
            return Err(ParallelError::InvalidConfig {
                field: "local_sgd.local_sgd_steps",
                value: "0".into(),
                expected: "at least 1".into(),
            });
        }
        Ok(())
    }
}

/// DiLoCo settings: the `[diloco]` table. The outer optimizer's defaults are the paper's:
/// SGD, lr 0.7, momentum 0.9, Nesterov (PyTorch's formula, dampening 0). Each field's doc
/// comment is the description `--help` shows for the option.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, documented::DocumentedFields)]
#[serde(default, deny_unknown_fields)]
pub struct DiLoCoConfig {
    /// Inner optimizer steps between two outer steps (H). Default 500.
    pub sync_every: usize,
    /// Outer learning rate. Default 0.7.
    pub outer_lr: f64,
    /// Outer momentum. Default 0.9 (0 for plain SGD).
    pub outer_momentum: f64,
    /// Nesterov momentum. Default true.
    pub nesterov: bool,
    /// Streaming DiLoCo: the parameters are split into this many fragments (P, parameters
    /// strided in visit order), and every `sync_every / fragments` steps the next one syncs,
    /// so each fragment syncs every `sync_every` steps and the peak bytes of an exchange drop
    /// P times. Default 1 (DiLoCo). Must divide `sync_every`.
    pub fragments: usize,
    /// Streaming DiLoCo: how parameters are grouped before the groups are strided over the
    /// fragments, as FSDP's `auto_wrap_policy` groups them: module type names (e.g.
    /// "TransformerEncoderLayer": block `b` goes to fragment `b % fragments`, the paper's
    /// strided layers; parameters outside every block form one more group), `size:<n>`, or
    /// "none" (default: each parameter its own group, strided).
    pub fragment_units: AutoWrapPolicy,
    /// Streaming DiLoCo: inner steps between a fragment's exchange and its outer step (tau):
    /// the outer gradient is exchanged at one step and applied `delay` steps later, merged
    /// into parameters that kept training. Default 0; below `sync_every / fragments`.
    pub delay: usize,
    /// Weight of the new global fragment merged into the local one after an outer step:
    /// `local = (1 - mixing) * local + mixing * global`. Default: 1 (replace, as DiLoCo) with
    /// one fragment and no delay, else 0.5 (the paper's alpha).
    pub mixing: Option<f64>,
    /// Format of the outer gradients on the wire: "f32" (default, one all-reduce), "bf16",
    /// "f16" (2 bytes a value) or "int8" (about 1.35 bytes a value, one scale per 256 values);
    /// the low-precision ones are all-gathered and summed in f32.
    pub outer_dtype: OuterDtype,
}

impl Default for DiLoCoConfig {
    fn default() -> Self {
        Self {
            sync_every: 500,
            outer_lr: 0.7,
            outer_momentum: 0.9,
            nesterov: true,
            fragments: 1,
            fragment_units: AutoWrapPolicy::None,
            delay: 0,
            mixing: None,
            outer_dtype: OuterDtype::F32,
        }
    }
}

impl DiLoCoConfig {
    /// The mixing weight in effect (see [`mixing`](Self::mixing)).
    pub fn mixing(&self) -> f64 {
        self.mixing
            .unwrap_or(match self.fragments == 1 && self.delay == 0 {
                true => 1.0,
                false => 0.5,
            })
    }

    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), ParallelError> {
        let invalid = |field, value: String, expected: &str| {
            Err(ParallelError::InvalidConfig {
                field,
                value,
                expected: expected.into(),
            })
        };
        if self.sync_every == 0 {
            return invalid("diloco.sync_every", "0".into(), "at least 1");
        }
        if !(self.outer_lr.is_finite() && self.outer_lr > 0.0) {
            return invalid(
                "diloco.outer_lr",
                self.outer_lr.to_string(),
                "a finite number > 0",
            );
        }
        if !(0.0..1.0).contains(&self.outer_momentum) {
            return invalid(
                "diloco.outer_momentum",
                self.outer_momentum.to_string(),
                "a number in [0, 1)",
            );
        }
        if self.fragments == 0 || !self.sync_every.is_multiple_of(self.fragments) {
            return invalid(
                "diloco.fragments",
                self.fragments.to_string(),
                "at least 1 and a divisor of sync_every",
            );
        }
        if self.delay >= (self.sync_every / self.fragments).max(1) {
            return invalid(
                "diloco.delay",
                self.delay.to_string(),
                "fewer steps than sync_every / fragments (one exchange in flight at a time)",
            );
        }
        if let Some(mixing) = self.mixing
            && !(0.0..=1.0).contains(&mixing)
        {
            return invalid("diloco.mixing", mixing.to_string(), "a number in [0, 1]");
        }
        if self.nesterov && self.outer_momentum == 0.0 {
            return invalid(
                "diloco.nesterov",
                "true".into(),
                "false when outer_momentum is 0 (Nesterov needs momentum)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_with_defaults_and_name_bad_keys() {
        let c: DiLoCoConfig = serde_json::from_str(r#"{"sync_every": 50}"#).unwrap();
        assert_eq!((c.sync_every, c.outer_lr, c.nesterov), (50, 0.7, true));
        assert!(serde_json::from_str::<DiLoCoConfig>(r#"{"h": 50}"#).is_err());
        let err = DiLoCoConfig {
            outer_momentum: 1.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("diloco.outer_momentum"), "{err}");
        let c: DiLoCoConfig = serde_json::from_str(
            r#"{"sync_every": 8, "fragments": 4, "delay": 1, "outer_dtype": "bf16"}"#,
        )
        .unwrap();
        assert_eq!((c.fragments, c.delay, c.mixing()), (4, 1, 0.5));
        assert_eq!(c.outer_dtype, crate::OuterDtype::Bf16);
        assert_eq!(
            DiLoCoConfig::default().mixing(),
            1.0,
            "plain DiLoCo replaces"
        );
        for (bad, field) in [
            (r#"{"sync_every": 10, "fragments": 4}"#, "diloco.fragments"),
            (
                r#"{"sync_every": 8, "fragments": 4, "delay": 2}"#,
                "diloco.delay",
            ),
            (r#"{"mixing": 1.5}"#, "diloco.mixing"),
        ] {
            let c: DiLoCoConfig = serde_json::from_str(bad).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{bad}: {err}");
        }
        let err = serde_json::from_str::<DiLoCoConfig>(r#"{"outer_dtype": "int4"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("int8"), "{err}");
        let err = LocalSgdConfig {
            local_sgd_steps: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("local_sgd.local_sgd_steps"), "{err}");
    }
}
