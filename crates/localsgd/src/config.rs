//! Settings of [`LocalSgd`](crate::LocalSgd) (`[local_sgd]`) and [`DiLoCo`](crate::DiLoCo)
//! (`[diloco]`), as config-file tables: unknown keys are errors, missing ones take the defaults.

use afterburner_parallel::ParallelError;
use serde::{Deserialize, Serialize};

/// Local SGD settings: the `[local_sgd]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalSgdConfig {
    /// Optimizer steps between two parameter averages (Accelerate's `local_sgd_steps`; counts
    /// optimizer steps, not micro-batches). Default 8.
    pub local_sgd_steps: usize,
}

impl Default for LocalSgdConfig {
    fn default() -> Self {
        Self { local_sgd_steps: 8 }
    }
}

impl LocalSgdConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), ParallelError> {
        if self.local_sgd_steps == 0 {
            return Err(ParallelError::InvalidConfig {
                field: "local_sgd.local_sgd_steps",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        Ok(())
    }
}

/// DiLoCo settings: the `[diloco]` table. The outer optimizer's defaults are the paper's:
/// SGD, lr 0.7, momentum 0.9, Nesterov (PyTorch's formula, dampening 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

impl Default for DiLoCoConfig {
    fn default() -> Self {
        Self {
            sync_every: 500,
            outer_lr: 0.7,
            outer_momentum: 0.9,
            nesterov: true,
        }
    }
}

impl DiLoCoConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), ParallelError> {
        let invalid = |field, value: String, expected| {
            Err(ParallelError::InvalidConfig {
                field,
                value,
                expected,
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
        let err = LocalSgdConfig { local_sgd_steps: 0 }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("local_sgd.local_sgd_steps"), "{err}");
    }
}
