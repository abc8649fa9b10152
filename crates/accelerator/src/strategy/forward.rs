//! [`AnyStrategy`] forwards every phase of [`ParallelStrategy`], and every method of
//! `StateSaving`, to the strategy it holds.
//! `tests::every_trait_method_is_forwarded` fails when the trait gains a method that is not
//! forwarded here (it would otherwise silently run the single-device default).

/// The forwarding impl; expanded by `built_in_strategies!` next to its `dispatch!`.
macro_rules! forward_impl {
    () => {
        // In its own scope, so its imports do not leak into the module that expands it.
        const _: () = {
        use afterburner_parallel::{
            ForwardView, OptimizerRecord, ParallelError, ParallelStrategy, ParamPositions,
            ProcessGroup, StateLayout, StateSaving, StrategyState,
        };
        use afterburner_parallel::tp::TensorParallelPlan;
        use burn::module::{AutodiffModule, Module};
        use burn::optim::{GradientsParams, Optimizer};
        use burn::tensor::{DType, Tensor};
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

            fn data_parallel_rank(&self) -> usize {
                dispatch!(self, s => ParallelStrategy::<B>::data_parallel_rank(s))
            }

            fn data_parallel_size(&self) -> usize {
                dispatch!(self, s => ParallelStrategy::<B>::data_parallel_size(s))
            }

            fn parallelize<M: TensorParallelPlan<B>>(&self, model: M) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::parallelize(s, model))
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

            fn after_backward<M: AutodiffModule<B>>(
                &self,
                model: &M,
                grads: &mut GradientsParams,
            ) -> Result<(), ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::after_backward(s, model, grads))
            }

            fn reduces_in_backward(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::reduces_in_backward(s))
            }

            fn reduce_gradients<M: AutodiffModule<B>>(
                &mut self,
                model: &M,
                grads: &mut GradientsParams,
            ) -> Result<(), ParallelError> {
                dispatch!(self, s => s.reduce_gradients(model, grads))
            }

            fn decides_on_device(&self) -> bool {
                dispatch!(self, s => ParallelStrategy::<B>::decides_on_device(s))
            }

            fn sum_over_parts_on_device(
                &self,
                local: Tensor<Inner<B>, 1>,
            ) -> Result<Tensor<Inner<B>, 1>, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::sum_over_parts_on_device(s, local))
            }

            fn global_squared_norm(&self, local: f64, device: &B::Device) -> Result<f64, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::global_squared_norm(s, local, device))
            }

            fn model_squared_norm<M: AutodiffModule<B>>(
                &self,
                model: &M,
                grads: &GradientsParams,
                local: f64,
                device: &B::Device,
            ) -> Result<f64, ParallelError> {
                dispatch!(self, s => s.model_squared_norm(model, grads, local, device))
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

            fn finish<M: AutodiffModule<B>>(&mut self, model: M, steps: u64) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::finish(s, model, steps))
            }

            fn full_model<M: AutodiffModule<B>>(&self, model: &M) -> Result<M, ParallelError> {
                dispatch!(self, s => ParallelStrategy::<B>::full_model(s, model))
            }
        }

        impl<B: AutodiffBackend, U: NamedStrategy<B>> StateSaving<B> for AnyStrategy<B, U> {
            fn state_layout(&self) -> StateLayout {
                dispatch!(self, s => StateSaving::<B>::state_layout(s))
            }

            fn join_saved_models<M, E>(
                &self,
                saved_ranks: usize,
                load: impl FnMut(usize) -> Result<M, E>,
            ) -> Result<M, E>
            where
                M: AutodiffModule<B>,
                E: From<ParallelError>,
            {
                dispatch!(self, s => s.join_saved_models(saved_ranks, load))
            }

            fn join_saved_optimizer_records(
                &self,
                records: Vec<(OptimizerRecord, ParamPositions)>,
                ids: &[String],
            ) -> Result<OptimizerRecord, ParallelError> {
                dispatch!(self, s => StateSaving::<B>::join_saved_optimizer_records(s, records, ids))
            }

            fn gather_optimizer_record<M: AutodiffModule<B>>(
                &self,
                model: &M,
                record: OptimizerRecord,
                device: &B::Device,
            ) -> Result<OptimizerRecord, ParallelError> {
                dispatch!(self, s => s.gather_optimizer_record(model, record, device))
            }

            fn shard_optimizer_record<M: AutodiffModule<B>>(
                &self,
                full: &M,
                record: OptimizerRecord,
            ) -> Result<OptimizerRecord, ParallelError> {
                dispatch!(self, s => s.shard_optimizer_record(full, record))
            }

            fn shard_full_state<M: AutodiffModule<B>>(&self, full: M) -> Result<M, ParallelError> {
                dispatch!(self, s => s.shard_full_state(full))
            }

            fn own_state(&self) -> Result<StrategyState, ParallelError> {
                dispatch!(self, s => StateSaving::<B>::own_state(s))
            }

            fn check_own_state(&self, state: &StrategyState) -> Result<(), ParallelError> {
                dispatch!(self, s => StateSaving::<B>::check_own_state(s, state))
            }

            fn load_own_state(&mut self, state: StrategyState) {
                dispatch!(self, s => StateSaving::<B>::load_own_state(s, state))
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

    /// Both traits: the phases and what a strategy saves.
    #[test]
    fn every_trait_method_is_forwarded() {
        let traits = [
            (
                include_str!("../../../parallel/src/strategy.rs"),
                "pub trait ParallelStrategy<B: AutodiffBackend>: StateSaving<B> {",
                "impl<B: AutodiffBackend, U: NamedStrategy<B>> ParallelStrategy<B>",
            ),
            (
                include_str!("../../../parallel/src/saving.rs"),
                "pub trait StateSaving<B: AutodiffBackend> {",
                "impl<B: AutodiffBackend, U: NamedStrategy<B>> StateSaving<B>",
            ),
        ];
        for (source, trait_start, impl_start) in traits {
            let missing =
                not_forwarded(source, trait_start, include_str!("forward.rs"), impl_start);
            assert!(
                missing.is_empty(),
                "AnyStrategy (strategy/forward.rs) does not forward {trait_start:?}: {missing:?}"
            );
        }
    }
}
