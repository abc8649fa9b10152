//! [`AnyStrategy`] forwards every phase of [`ParallelStrategy`] to the strategy it holds.
//! `tests::every_trait_method_is_forwarded` fails when the trait gains a method that is not
//! forwarded here (it would otherwise silently run the single-device default).

/// The forwarding impl; expanded by `built_in_strategies!` next to its `dispatch!`.
macro_rules! forward_impl {
    () => {
        // In its own scope, so its imports do not leak into the module that expands it.
        const _: () = {
        use afterburner_parallel::{
            ForwardView, ParallelError, ParallelStrategy, ProcessGroup, StateLayout, StrategyState,
        };
        use burn::module::{AutodiffModule, Module};
        use burn::optim::{GradientsParams, Optimizer};
        use burn::tensor::DType;
        use burn::tensor::backend::AutodiffBackend;

        use crate::strategy::{AnyStrategy, NamedStrategy};

        type Inner<B> = <B as AutodiffBackend>::InnerBackend;

        impl<B: AutodiffBackend, U: NamedStrategy<B>> ParallelStrategy<B> for AnyStrategy<B, U> {
            fn name(&self) -> &'static str {
                dispatch!(self, s => ParallelStrategy::<B>::name(s))
            }

            fn group(&self) -> Option<&dyn ProcessGroup<Inner<B>>> {
                dispatch!(self, s => ParallelStrategy::<B>::group(s))
            }

            fn rank(&self) -> usize {
                dispatch!(self, s => ParallelStrategy::<B>::rank(s))
            }

            fn world_size(&self) -> usize {
                dispatch!(self, s => ParallelStrategy::<B>::world_size(s))
            }

            fn agree_on_skip(&self, skip: bool, device: &B::Device) -> Result<bool, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::agree_on_skip(s, skip, device))
            }

            fn setup<M: AutodiffModule<B>>(&self, model: M) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::setup(s, model))
            }

            fn join<M, O>(&mut self, model: M, optimizer: &mut O) -> Result<(M, u64), ParallelError>
            where
                M: AutodiffModule<B>,
                O: Optimizer<M, B>,
            {
                dispatch!(self, s => ParallelStrategy::<B>::join(s, model, optimizer))
            }

            fn forward_view<M: Module<B>>(
                &self,
                model: &M,
                compute: Option<DType>,
            ) -> Result<Option<ForwardView<B, M>>, ParallelError> {
                dispatch!(self, s => s.forward_view(model, compute))
            }

            fn after_backward(&self) -> Result<(), ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::after_backward(s))
            }

            fn reduce_gradients<M: AutodiffModule<B>>(
                &mut self,
                model: &M,
                grads: &mut GradientsParams,
            ) -> Result<(), ParallelError> {
                dispatch!(self, s => s.reduce_gradients(model, grads))
            }

            fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::global_squared_norm(s, local, device))
            }

            fn before_optimizer_step<M: AutodiffModule<B>>(
                &mut self,
                model: &M,
                grads: &mut GradientsParams,
            ) {
                dispatch!(self, s => s.before_optimizer_step(model, grads))
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
                dispatch!(self, s => s.after_optimizer_step(model, optimizer, step))
            }

            fn gradient_all_reduces(&self) -> u64 {
                dispatch!(self, s => ParallelStrategy::<B>::gradient_all_reduces(s))
            }

            fn parameter_syncs(&self) -> u64 {
                dispatch!(self, s => ParallelStrategy::<B>::parameter_syncs(s))
            }

            fn averages_gradients(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::averages_gradients(s))
            }

            fn own_state(&self) -> Result<StrategyState, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::own_state(s))
            }

            fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::check_own_state(s, state))
            }

            fn load_own_state(&mut self, state: StrategyState) {
                dispatch!(self, s => ParallelStrategy::<B>::load_own_state(s, state))
            }

            fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::finish(s, model, steps))
            }

            fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::full_model(s, model))
            }

            fn state_layout(&self) -> StateLayout {
                dispatch!(self, s => ParallelStrategy::<B>::state_layout(s))
            }

            fn loads_full_state(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::loads_full_state(s))
            }

            fn merges_rank_states(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::merges_rank_states(s))
            }

            fn saved_models_are_shards(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::saved_models_are_shards(s))
            }

            fn join_saved_models<M: AutodiffModule<B>>(&self, saved: Vec<M>) -> Result<M, ParallelError> {
                dispatch!(self, s => s.join_saved_models(saved))
            }

            fn join_saved_optimizer_records(
                &self,
                records: &[(Vec<u8>, std::collections::HashMap<String, usize>)],
                ids: &[String],
            ) -> Result<Vec<u8>, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::join_saved_optimizer_records(s, records, ids))
            }

            fn gather_optimizer_record<M: AutodiffModule<B>>(
                &self,
                model: &M,
                record: Vec<u8>,
                device: &B::Device,
            ) -> Result<Vec<u8>, ParallelError> {
                dispatch!(self, s => s.gather_optimizer_record(model, record, device))
            }

            fn shard_optimizer_record<M: AutodiffModule<B>>(
                &self,
                full: &M,
                record: Vec<u8>,
            ) -> Result<Vec<u8>, ParallelError> {
                dispatch!(self, s => s.shard_optimizer_record(full, record))
            }

            fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
                dispatch!(self, s => s.shard_full_state(full))
            }

            fn after_load<M: AutodiffModule<B>>(&mut self, model: &M) -> Result<(), ParallelError> {
                dispatch!(self, s => s.after_load(model))
            }
        }
        };
    };
}

#[cfg(test)]
mod tests {
    use afterburner_parallel::forwarding::not_forwarded;

    #[test]
    fn every_trait_method_is_forwarded() {
        let missing = not_forwarded(
            include_str!("../../../parallel/src/strategy.rs"),
            "pub trait ParallelStrategy<B: AutodiffBackend> {",
            include_str!("forward.rs"),
            "impl<B: AutodiffBackend, U",
        );
        assert!(
            missing.is_empty(),
            "AnyStrategy (strategy/forward.rs) does not forward ParallelStrategy::{missing:?}"
        );
    }
}
