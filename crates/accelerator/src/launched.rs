//! The Accelerator of a process started by `afterburner launch`, and of any rank built from
//! the config's strategy (a built-in one, or the user's registered `U`).

use afterburner_parallel::{Declaration, Launched, LaunchedGroup, RestartPolicy, Traffic};
use burn::tensor::backend::AutodiffBackend;

use crate::group::{Group, counted};
use crate::{AccelerateError, Accelerator, AcceleratorConfig, AnyStrategy, NamedStrategy};

impl<B: AutodiffBackend, U: NamedStrategy<B>> Accelerator<B, AnyStrategy<B, U>> {
    /// This process's Accelerator in a run started by `afterburner launch`: its rank's
    /// device and the launch's process group (see [`run`](Accelerator::run)). The worker
    /// declares its strategy at the rendezvous with the restart policy it needs (`replica`
    /// when its replicas heal alone, [`ParallelStrategy::HEALS_ALONE`], else `all`): the
    /// launcher restarts by it, and refuses with a named error a worker whose strategy does
    /// not fit the policy it was given or the one the first worker settled. `U` is a strategy
    /// of the user's that the config may choose by its registered name.
    ///
    /// [`ParallelStrategy::HEALS_ALONE`]: afterburner_parallel::ParallelStrategy::HEALS_ALONE
    pub fn launched(
        config: AcceleratorConfig,
        launched: &Launched,
    ) -> Result<Self, AccelerateError> {
        let devices =
            afterburner_parallel::local_devices::<B::InnerBackend>(launched.local_world_size)?;
        let device = devices
            .get(launched.local_rank)
            .cloned()
            .unwrap_or_default();
        if launched.world_size == 1 && !config.parallelism.strategy.is_distributed() {
            return Self::build(config, device, None);
        }
        if !config.parallelism.strategy.is_distributed() {
            return Err(AccelerateError::invalid(
                "strategy",
                &config.parallelism.strategy,
                format!(
                    "a multi-device strategy (ddp, zero-1, fsdp, local-sgd, diloco) for the {} \
                     workers `afterburner launch` started",
                    launched.world_size
                ),
            ));
        }
        // The launch's workers are the devices (what `tp_size` divides).
        let config = AcceleratorConfig {
            parallelism: config.parallelism.with_devices(launched.world_size),
            ..config
        };
        config.validate()?;
        let declaration = Declaration {
            strategy: config.parallelism.strategy.name().to_string(),
            policy: match config.parallelism.strategy.heals_alone::<B, U>() {
                true => RestartPolicy::Replica,
                false => RestartPolicy::All,
            },
        };
        let group = launched.connect::<B::InnerBackend>(&device, &declaration)?;
        if launched.restart_count > 0 {
            tracing::warn!(
                rank = launched.rank,
                restarts = launched.restart_count,
                "this worker was started again by `afterburner launch`"
            );
        }
        Self::build(config, device, Some(group))
    }

    /// One rank of the strategy the config names, over `group` (`None` on a single device).
    pub(crate) fn build(
        config: AcceleratorConfig,
        device: B::Device,
        group: Option<Group<B>>,
    ) -> Result<Self, AccelerateError> {
        config.validate()?;
        let traffic = Traffic::default();
        let group = group.map(|g| counted::<B>(g, &traffic));
        let strategy = AnyStrategy::from_config(&config, group, &device)?;
        Accelerator::assemble(config, device, strategy, traffic)
    }
}
