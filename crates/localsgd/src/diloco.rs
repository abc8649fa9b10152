//! [`DiLoCo`]: Local SGD whose sync is an outer optimizer step on a global copy of the
//! parameters along the averaged pseudo-gradient `global - local`; with `fragments`, `delay`
//! and `mixing`, Streaming DiLoCo.

use std::sync::{Mutex, PoisonError};

use afterburner_parallel::{
    ParallelError, ParallelStrategy, ProcessGroup, ReduceOp, StateLayout, StateSaving,
    StrategyState, broadcast_from_rank0, donate_live_state, flat_params, receive_live_state,
    with_flat_params,
};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::fragments::Fragments;
use crate::local_sgd::any_rank;
use crate::overlap::Overlapped;
use crate::{DiLoCoConfig, OuterSgd};

mod state;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// DiLoCo over a process group (Douillard et al. 2023): rank 0's parameters at setup, kept
/// as the global copy; every rank takes `sync_every` inner steps alone; then the
/// pseudo-gradients `global - local` are averaged, the outer optimizer steps the global copy,
/// and every rank continues from it. The global copy and the outer momentum are saved with the
/// training state; the inner optimizer state stays each rank's own.
///
/// Streaming DiLoCo (Douillard et al. 2025) when `fragments` P > 1, `delay` tau > 0 or
/// `mixing` alpha < 1: the parameters are split into P fragments, and every `sync_every / P`
/// steps the next fragment (round robin) exchanges its outer gradient; the outer step on that
/// fragment lands `delay` steps later, and the new global fragment is merged into the local
/// one as `(1 - alpha) local + alpha global`. A delayed exchange runs on a background thread
/// while the next inner steps compute (any other collective waits for it first). Outer
/// gradients travel as `outer_dtype` (f32, bf16, f16 or int8).
pub struct DiLoCo<B: AutodiffBackend, G: ProcessGroup<Inner<B>>> {
    group: Overlapped<Inner<B>, G>,
    config: DiLoCoConfig,
    /// The global parameters (flat f32), set at setup.
    global: Mutex<Option<Tensor<Inner<B>, 1>>>,
    /// The fragments of the model set up first.
    fragments: Mutex<Option<Fragments>>,
    /// One outer optimizer per fragment (its momentum covers that fragment's values).
    outer: Vec<OuterSgd<Inner<B>>>,
    /// An exchange whose outer step is still to come.
    pending: Option<Pending>,
    syncs: u64,
    /// The step `finish` last synced at (a second call is a no-op).
    finished_at: Option<u64>,
}

/// An exchange started at one step (its result in the group's background slot), applied
/// `delay` steps later.
struct Pending {
    fragment: usize,
    apply_at: u64,
}

impl<B, G> DiLoCo<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + Clone + Send + 'static,
{
    /// DiLoCo over `group` (cloned onto the exchange thread of a delayed exchange); errors on
    /// an invalid config.
    pub fn new(group: G, config: DiLoCoConfig) -> Result<Self, ParallelError> {
        config.validate()?;
        let outer = (0..config.fragments)
            .map(|_| OuterSgd::new(config.outer_lr, config.outer_momentum, config.nesterov))
            .collect();
        Ok(Self {
            group: Overlapped::new(group),
            config,
            global: Mutex::new(None),
            fragments: Mutex::new(None),
            outer,
            pending: None,
            syncs: 0,
            finished_at: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &DiLoCoConfig {
        &self.config
    }

    /// Outer steps so far (one exchange each; a fragment's under Streaming DiLoCo).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    fn global(&self) -> Option<Tensor<Inner<B>, 1>> {
        self.global
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_global(&self, global: Tensor<Inner<B>, 1>) {
        *self.global.lock().unwrap_or_else(PoisonError::into_inner) = Some(global);
    }

    fn fragments(&self) -> Result<Fragments, ParallelError> {
        self.fragments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(not_set_up)
    }

    /// Steps between two exchanges (one fragment each).
    fn interval(&self) -> u64 {
        (self.config.sync_every / self.config.fragments) as u64
    }

    /// This rank's parameters, flat, checked against the global copy.
    fn local(&self, model: &impl AutodiffModule<B>) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
        let local = flat_params::<B, _>(model).ok_or_else(not_set_up)?;
        let global = self.global().ok_or_else(not_set_up)?;
        if global.dims() != local.dims() {
            return Err(ParallelError::Mismatch {
                rank: self.group.rank(),
                reason: format!(
                    "DiLoCo's global copy has {} values, the model {}: DiLoCo trains the one \
                     model set up first",
                    global.dims()[0],
                    local.dims()[0]
                ),
            });
        }
        Ok(local)
    }

    /// Fragment `p`'s outer gradient `global - local` on this rank.
    fn outer_gradient<M: AutodiffModule<B>>(
        &self,
        model: &M,
        p: usize,
    ) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
        let local = self.local(model)?;
        let global = self.global().ok_or_else(not_set_up)?;
        let fragments = self.fragments()?;
        Ok(fragments.gather(&global, p) - fragments.gather(&local, p))
    }

    /// Fragment `p`'s outer gradient averaged over the ranks in the configured format (the
    /// exchange), now.
    fn exchange<M: AutodiffModule<B>>(
        &self,
        model: &M,
        p: usize,
    ) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
        let gradient = self.outer_gradient(model, p)?;
        self.config.outer_dtype.mean(&self.group, gradient)
    }

    /// The outer step on fragment `p` along `gradient`, then the new global fragment merged
    /// into the model with weight `mixing`.
    fn apply<M: AutodiffModule<B>>(
        &mut self,
        model: M,
        p: usize,
        gradient: Tensor<Inner<B>, 1>,
        mixing: f64,
    ) -> Result<M, ParallelError> {
        let fragments = self.fragments()?;
        let global = self.global().ok_or_else(not_set_up)?;
        tracing::debug!(
            fragment = p,
            values = fragments.len(p),
            outer_dtype = %self.config.outer_dtype,
            "DiLoCo outer step"
        );
        let new = self.outer[p].step(fragments.gather(&global, p), gradient);
        self.set_global(fragments.scatter(global, p, new.clone()));
        self.syncs += 1;
        let local = self.local(&model)?;
        let merged = match mixing == 1.0 {
            true => new,
            false => fragments.gather(&local, p).mul_scalar(1.0 - mixing) + new.mul_scalar(mixing),
        };
        Ok(with_flat_params::<B, M>(
            model,
            fragments.scatter(local, p, merged),
        ))
    }

    /// Applies the pending outer step if it is due at `step` (or at any step, with `None`).
    fn apply_pending<M: AutodiffModule<B>>(
        &mut self,
        model: M,
        step: Option<u64>,
    ) -> Result<M, ParallelError> {
        let due = self
            .pending
            .as_ref()
            .is_some_and(|p| step.is_none_or(|s| s == p.apply_at));
        match (due, self.pending.take()) {
            (true, Some(pending)) => {
                let gradient = self
                    .group
                    .take()
                    .ok_or_else(|| ParallelError::Collective {
                        op: "exchange",
                        rank: self.group.rank(),
                        reason: "the delayed exchange has no result".into(),
                    })??;
                let mixing = self.config.mixing();
                self.apply(model, pending.fragment, gradient, mixing)
            }
            (_, pending) => {
                self.pending = pending;
                Ok(model)
            }
        }
    }

    /// The fragments `model` splits into (an error if one would be empty).
    fn fragments_of<M: AutodiffModule<B>>(&self, model: &M) -> Result<Fragments, ParallelError> {
        let fragments =
            Fragments::of_model(model, self.config.fragments, &self.config.fragment_units)?;
        if let Some(empty) = (0..fragments.count()).find(|p| fragments.is_empty(*p)) {
            return Err(ParallelError::InvalidConfig {
                field: "diloco.fragments",
                value: format!(
                    "{} (fragment {empty} would hold no parameter of this model)",
                    self.config.fragments
                ),
                expected: "at most as many fragments as the model has parameter groups".into(),
            });
        }
        Ok(fragments)
    }

    /// Keeps `model`'s parameters as the global copy, unless a model was set up before.
    fn keep_global<M: AutodiffModule<B>>(&self, model: &M, fragments: Fragments) {
        let mut global = self.global.lock().unwrap_or_else(PoisonError::into_inner);
        if global.is_none() {
            *global = flat_params::<B, M>(model);
            *self
                .fragments
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(fragments);
        }
    }

    /// Sends the live state to joining replicas if the group asked (after a sync).
    fn donate<M, O>(&self, model: &M, optimizer: &O, step: u64) -> Result<(), ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        donate_live_state(
            self.group.quorum(),
            model,
            optimizer,
            || self.own_state(),
            step,
        )
    }

    /// Whether this is plain DiLoCo (one fragment, no delay, replace).
    fn is_plain(&self) -> bool {
        self.config.fragments == 1 && self.config.delay == 0 && self.config.mixing() == 1.0
    }
}

fn not_set_up() -> ParallelError {
    ParallelError::InvalidConfig {
        field: "diloco",
        value: "not set up".into(),
        expected: "setup(model) before training or loading a state".into(),
    }
}

impl<B, G> ParallelStrategy<B> for DiLoCo<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + Clone + Send + 'static,
{
    /// Replicas step on their own and sync periodically: one that dies is restarted alone
    /// and healed from a live replica (`join`).
    const HEALS_ALONE: bool = true;

    fn name(&self) -> &'static str {
        "diloco"
    }

    fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
        Some(&self.group)
    }

    /// Rank 0's parameters on every rank; the first model set up is the one DiLoCo keeps a
    /// global copy of.
    fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
        // Checked before any collective: every rank fails alike on a bad unit name.
        let fragments = self.fragments_of(&model)?;
        let model = broadcast_from_rank0(&self.group, model)?;
        self.keep_global(&model, fragments);
        Ok(model)
    }

    /// On a fault-tolerant group, a replica joining a run in progress takes a live replica's
    /// parameters, inner optimizer state and DiLoCo state (global copy, outer momentum, sync
    /// count, a pending exchange), and continues after its step. One that asks after the run
    /// ended gets [`ParallelError::RunEnded`], set up alone on its own model.
    fn join<M, O>(&mut self, model: M, optimizer: &mut O) -> Result<(M, u64), ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let Some(quorum) = self.group.quorum().filter(|q| q.is_joining()) else {
            return Ok((self.setup(model)?, 0));
        };
        let fragments = self.fragments_of(&model)?;
        let device = model.devices().into_iter().next().unwrap_or_default();
        let received = receive_live_state(&*quorum, model.clone(), optimizer, &device);
        let (model, state, step) = match received {
            Err(ended @ ParallelError::RunEnded { .. }) => {
                // The run ended before a live replica could heal this one: it is alone now,
                // set up on its own model (no collective) for the run's final state to load.
                self.keep_global(&model, fragments);
                return Err(ended);
            }
            received => received?,
        };
        self.keep_global(&model, fragments);
        self.check_own_state(&state)?;
        self.load_own_state(state);
        Ok((model, step))
    }

    fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
        any_rank::<B, _>(&self.group, skip, device)
    }

    fn parameter_syncs(&self) -> u64 {
        self.syncs()
    }

    fn after_optimizer_step<M, O>(
        &mut self,
        model: M,
        optimizer: &mut O,
        step: u64,
    ) -> Result<M, ParallelError>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let model = self.apply_pending(model, Some(step))?;
        let interval = self.interval();
        if !step.is_multiple_of(interval) {
            return Ok(model);
        }
        let p = ((step / interval - 1) % self.config.fragments as u64) as usize;
        let model = match self.config.delay {
            0 => {
                let gradient = self.exchange(&model, p)?;
                self.apply(model, p, gradient, self.config.mixing())?
            }
            delay => {
                let (gradient, dtype) = (self.outer_gradient(&model, p)?, self.config.outer_dtype);
                self.group.start(move |group| dtype.mean(group, gradient));
                self.pending = Some(Pending {
                    fragment: p,
                    apply_at: step + delay as u64,
                });
                model
            }
        };
        self.donate(&model, optimizer, step)?;
        Ok(model)
    }

    /// Ends training with every rank on the global parameters: plain DiLoCo takes a last
    /// outer step unless the last step (or an earlier `finish`) just synced; Streaming DiLoCo
    /// applies a pending outer step, then syncs every fragment once more and replaces the
    /// local parameters by the global ones.
    fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
        if self.finished_at == Some(steps) {
            return Ok(model);
        }
        if self.is_plain() && steps.is_multiple_of(self.config.sync_every as u64) {
            return Ok(model);
        }
        self.finished_at = Some(steps);
        let mut model = self.apply_pending(model, None)?;
        for p in 0..self.config.fragments {
            let gradient = self.exchange(&model, p)?;
            model = self.apply(model, p, gradient, 1.0)?;
        }
        Ok(model)
    }
}

/// Each replica writes its own state, DiLoCo's global copy and outer momentum included.
impl<B, G> StateSaving<B> for DiLoCo<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + Clone + Send + 'static,
{
    /// The ranks' mean of a loaded model (their parts may differ, e.g. a Local SGD save in
    /// the middle of a period) is the new global copy, with no momentum and nothing pending,
    /// unless the state carries DiLoCo's own (restored right after, overriding this). One
    /// all-reduce.
    fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
        let global = match flat_params::<B, M>(model) {
            Some(flat) => Some(self.group.all_reduce(flat, ReduceOp::Mean)?),
            None => None,
        };
        *self.global.lock().unwrap_or_else(PoisonError::into_inner) = global;
        self.outer.iter_mut().for_each(|outer| outer.buffer = None);
        let _ = self.group.take(); // an exchange of the run before the load
        self.pending = None;
        self.syncs = 0;
        Ok(())
    }

    fn state_layout(&self) -> StateLayout {
        StateLayout::PerRank
    }

    fn own_state(&self) -> Result<StrategyState, ParallelError> {
        self.state()
    }

    fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        self.check_state(state)
    }

    fn load_own_state(&mut self, state: StrategyState) {
        self.load_state(state)
    }
}
