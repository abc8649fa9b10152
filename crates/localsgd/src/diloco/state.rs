//! DiLoCo's own part of a training state: the global copy, the outer momentum per fragment,
//! the sync count and a pending Streaming exchange, as flat tensors and counters (what a save
//! writes and a live replica sends a joining one).

use afterburner_parallel::{ParallelError, ProcessGroup, StrategyState};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::{DiLoCo, Inner, Pending, not_set_up};

impl<B, G> DiLoCo<B, G>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + Clone + Send + 'static,
{
    /// The global copy, the outer momentum per fragment, the sync count and a pending
    /// exchange, as a training state part (saved, or sent to a joining replica).
    pub(super) fn state(&self) -> Result<StrategyState, ParallelError> {
        let mut tensors = Vec::new();
        if let Some(global) = self.global() {
            tensors.push(("global".to_string(), values(&global)?));
        }
        for (p, outer) in self.outer.iter().enumerate() {
            if let Some(buffer) = &outer.buffer {
                tensors.push((momentum_name(p, self.outer.len()), values(buffer)?));
            }
        }
        let mut counters = vec![("syncs".to_string(), self.syncs)];
        if let Some(pending) = &self.pending {
            let gradient = self
                .group
                .peek()
                .ok_or_else(|| ParallelError::Collective {
                    op: "exchange",
                    rank: self.group.rank(),
                    reason: "the delayed exchange has no result".into(),
                })??;
            tensors.push(("pending_gradient".to_string(), values(&gradient)?));
            counters.push(("pending_fragment".to_string(), pending.fragment as u64));
            counters.push(("pending_apply_at".to_string(), pending.apply_at));
        }
        Ok(StrategyState { tensors, counters })
    }

    /// Errors unless `state` fits this DiLoCo (names and sizes of its tensors).
    pub(super) fn check_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
        let expected = self.global().ok_or_else(not_set_up)?.dims()[0];
        let fragments = self.fragments()?;
        let count = fragments.count();
        let pending_fragment = state
            .counters
            .iter()
            .find(|(n, _)| n == "pending_fragment")
            .map(|(_, p)| *p as usize);
        for (name, values) in &state.tensors {
            let want = match name.as_str() {
                "global" => Some(expected),
                "pending_gradient" => pending_fragment
                    .filter(|p| *p < count)
                    .map(|p| fragments.len(p)),
                _ => (0..count)
                    .find(|p| momentum_name(*p, count) == *name)
                    .map(|p| fragments.len(p)),
            };
            match want {
                None => {
                    return Err(ParallelError::Record(format!(
                        "DiLoCo state: unexpected tensor '{name}' for {count} fragment(s)"
                    )));
                }
                Some(want) if want != values.len() => {
                    return Err(ParallelError::Record(format!(
                        "DiLoCo state: '{name}' holds {} values, expected {want}",
                        values.len()
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Continues from `state` (checked by [`check_state`](Self::check_state)).
    pub(super) fn load_state(&mut self, state: StrategyState) {
        let Some(device) = self.global().map(|g| g.device()) else {
            return; // not set up: nothing to continue from
        };
        let tensor = |values: &[f32]| Tensor::<Inner<B>, 1>::from_floats(values, &device);
        if let Some(global) = state.tensor("global") {
            self.set_global(tensor(global));
        }
        let count = self.outer.len();
        for (p, outer) in self.outer.iter_mut().enumerate() {
            outer.buffer = state.tensor(&momentum_name(p, count)).map(tensor);
        }
        let counter = |name: &str| {
            state
                .counters
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
        };
        if let Some(syncs) = counter("syncs") {
            self.syncs = syncs;
        }
        let _ = self.group.take(); // an exchange of the run before the load
        self.pending = match (
            state.tensor("pending_gradient"),
            counter("pending_fragment"),
            counter("pending_apply_at"),
        ) {
            (Some(gradient), Some(fragment), Some(apply_at)) => {
                self.group.set_done(Some(Ok(tensor(gradient))));
                Some(Pending {
                    fragment: fragment as usize,
                    apply_at,
                })
            }
            _ => None,
        };
    }
}

fn values<B: burn::tensor::backend::Backend>(t: &Tensor<B, 1>) -> Result<Vec<f32>, ParallelError> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("DiLoCo state tensor: {e:?}")))
}

/// The state name of fragment `p`'s outer momentum (`outer_momentum` with one fragment, as
/// DiLoCo has always saved it).
fn momentum_name(p: usize, fragments: usize) -> String {
    match fragments {
        1 => "outer_momentum".to_string(),
        _ => format!("outer_momentum.{p}"),
    }
}
