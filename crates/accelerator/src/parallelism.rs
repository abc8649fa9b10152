//! [`ParallelismConfig`]: how training is spread over devices, as one value (Accelerate's
//! `ParallelismConfig`, torchtitan's `ParallelDims`), flattened into
//! [`AcceleratorConfig`](crate::AcceleratorConfig) and the Trainer's arguments so that the
//! keys a user writes (`strategy`, `devices`, `tp_size`) stay where they were.

use serde::{Deserialize, Serialize};

use crate::{AccelerateError, StrategyConfig};

/// How training is spread over devices: the strategy with its options, the number of
/// devices, and the degree of tensor parallelism (room for later dimensions). Validated once
/// ([`validate`](Self::validate): the degrees multiply to the devices); it answers "tensor
/// parallel?" and "data-parallel size" for everyone who asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, documented::DocumentedFields)]
#[serde(default)]
pub struct ParallelismConfig {
    /// How training is spread over devices, with the strategy's options: a name (default
    /// "single-device"; see [`StrategyConfig`], or a registered strategy's name) or a table
    /// of options under the name (`[strategy.diloco]` with `sync_every = 50` in TOML;
    /// `--strategy diloco --diloco.sync-every 50` on the command line).
    pub strategy: StrategyConfig,
    /// Devices (ranks) to train on, like Lightning's `devices=N`: worker threads on the first
    /// N devices of the backend's default kind (on the CPU they share it). Default 1. Under
    /// `afterburner launch`, the launch's workers. More than 1 needs a multi-device strategy.
    pub devices: usize,
    /// Tensor parallelism (Accelerate's `tp_size`): each layer of the model's plan split over
    /// this many devices, with `strategy = "ddp"` or `"fsdp"` across the groups (`devices =
    /// dp x tp_size`, the data sharded over the dp groups only). Default 1 (no split).
    pub tp_size: usize,
}

impl Default for ParallelismConfig {
    fn default() -> Self {
        Self {
            strategy: StrategyConfig::SingleDevice,
            devices: 1,
            tp_size: 1,
        }
    }
}

impl ParallelismConfig {
    /// `strategy` over `devices` devices, no tensor parallelism.
    pub fn new(strategy: StrategyConfig, devices: usize) -> Self {
        Self {
            strategy,
            devices,
            tp_size: 1,
        }
    }

    /// This value on `devices` devices (what a launch or a list of devices says).
    pub fn with_devices(self, devices: usize) -> Self {
        Self { devices, ..self }
    }

    /// Whether each layer is split over several devices (`tp_size > 1`).
    pub fn is_tensor_parallel(&self) -> bool {
        self.tp_size > 1
    }

    /// The number of data-parallel replicas, each seeing its own shard of the data:
    /// `devices / tp_size`.
    pub fn data_parallel_size(&self) -> usize {
        self.devices / self.tp_size.max(1)
    }

    /// Checks the degrees and the strategy, naming the first bad key: at least one device, a
    /// multi-device strategy on several, `tp_size` at least 1 and a divisor of `devices`
    /// (`devices = dp x tp_size`) under `"ddp"` or `"fsdp"`, and the strategy's options.
    pub fn validate(&self) -> Result<(), AccelerateError> {
        if self.devices == 0 {
            return Err(AccelerateError::invalid("devices", 0, "at least 1"));
        }
        self.validate_tp_size()?;
        if self.devices > 1 && !self.strategy.is_distributed() {
            return Err(AccelerateError::invalid(
                "devices",
                self.devices,
                "1 under strategy single-device (set a multi-device strategy, see StrategyConfig)",
            ));
        }
        self.strategy.validate()
    }

    /// `tp_size`: at least 1; above 1, a divisor of `devices` under `"ddp"` or `"fsdp"`.
    fn validate_tp_size(&self) -> Result<(), AccelerateError> {
        match self.tp_size {
            0 => Err(AccelerateError::invalid("tp_size", 0, "at least 1")),
            1 => Ok(()),
            tp if !self.devices.is_multiple_of(tp) => Err(AccelerateError::invalid(
                "tp_size",
                tp,
                format!(
                    "a divisor of devices ({}): devices = dp x tp_size",
                    self.devices
                ),
            )),
            tp if !matches!(
                self.strategy,
                StrategyConfig::Ddp(_) | StrategyConfig::Fsdp(_)
            ) =>
            {
                Err(AccelerateError::invalid(
                    "tp_size",
                    tp,
                    format!(
                        "1 under strategy {} (tensor parallelism runs with strategy \"ddp\" or \
                         \"fsdp\" across its groups; zero-1, local-sgd and diloco with tp_size > \
                         1 are not supported yet)",
                        self.strategy.name()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_degrees_multiply_to_the_devices() {
        let mesh = ParallelismConfig {
            tp_size: 2,
            ..ParallelismConfig::new(StrategyConfig::Ddp(Default::default()), 6)
        };
        mesh.validate().unwrap();
        assert!(mesh.is_tensor_parallel());
        assert_eq!(mesh.data_parallel_size(), 3);
        let uneven = mesh.clone().with_devices(5).validate().unwrap_err();
        assert!(
            uneven.to_string().contains("devices = dp x tp_size"),
            "{uneven}"
        );
        let zero = ParallelismConfig {
            tp_size: 0,
            ..mesh.clone()
        };
        assert!(zero.validate().unwrap_err().to_string().contains("tp_size"));
        let alone = ParallelismConfig::new(StrategyConfig::SingleDevice, 2);
        assert!(
            alone
                .validate()
                .unwrap_err()
                .to_string()
                .contains("devices")
        );
        assert!(!ParallelismConfig::default().is_tensor_parallel());
        assert_eq!(ParallelismConfig::default().data_parallel_size(), 1);
    }
}
