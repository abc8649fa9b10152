//! The types one [`Trainer`](super::Trainer) works with, bundled (as burn-train's
//! `LearningComponentsTypes`): the Trainer has one type parameter and every impl one bound.

use std::marker::PhantomData;

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::AutodiffBackend;
use burn::train::InferenceStep;
use burn::train::metric::{Adaptor, LossInput};

use super::{HfOptimizer, HfSchedule, Inner, TrainLoss};
use crate::AnyStrategy;
use crate::parallel::ParallelStrategy;

/// What a Trainer trains and how: the backend, the model (and its evaluation form), the data
/// types, the optimizer, the LR scheduler and the strategy. [`Components`] is the one
/// implementation; a Trainer's type is written `Trainer<Components<B, M, I, TB, EB, EO>>`.
pub trait TrainerTypes {
    /// The training backend (with autodiff).
    type Backend: AutodiffBackend;
    /// The model: how a training batch becomes a loss ([`TrainLoss`]).
    type Model: TrainLoss<Self::Backend, Self::TrainBatch, Self::Strategy>
        + AutodiffModule<Self::Backend, InnerModule = Self::EvalModel>
        + 'static;
    /// The model without autodiff, which evaluates: an evaluation batch becomes an output for
    /// the metrics (burn-train's `InferenceStep`).
    type EvalModel: InferenceStep<Input = Self::EvalBatch, Output = Self::EvalOutput>;
    /// One item of the datasets.
    type Item: Send + Sync + 'static;
    /// A training batch, on the training backend.
    type TrainBatch: Send + 'static;
    /// An evaluation batch, on the inner backend.
    type EvalBatch: Send + 'static;
    /// What the evaluation model outputs for the metrics (a loss among them).
    type EvalOutput: Adaptor<LossInput<Inner<Self::Backend>>> + 'static;
    /// The optimizer ([`HfOptimizer`] by default: the one the arguments name).
    type Optimizer: Optimizer<Self::Model, Self::Backend>;
    /// The learning-rate scheduler ([`HfSchedule`] by default).
    type Scheduler: LrScheduler;
    /// How training is spread over devices ([`AnyStrategy`] by default).
    type Strategy: ParallelStrategy<Self::Backend>;
}

/// The Trainer's types for a model `M` on backend `B`, trained on batches `TB` made of items
/// `I`, evaluated on batches `EB` whose outputs `EO` feed the metrics; the optimizer `O`, the
/// LR scheduler `L` and the strategy `S` default to the ones the arguments name.
#[allow(clippy::type_complexity)] // a marker: the types are only named, never held
pub struct Components<
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    I,
    TB,
    EB,
    EO,
    O = HfOptimizer<M, B>,
    L = HfSchedule,
    S = AnyStrategy<B>,
>(PhantomData<fn() -> (B, M, I, TB, EB, EO, O, L, S)>);

impl<B, M, I, TB, EB, EO, O, L, S> TrainerTypes for Components<B, M, I, TB, EB, EO, O, L, S>
where
    B: AutodiffBackend,
    M: TrainLoss<B, TB, S> + 'static,
    M::InnerModule: InferenceStep<Input = EB, Output = EO>,
    I: Send + Sync + 'static,
    TB: Send + 'static,
    EB: Send + 'static,
    EO: Adaptor<LossInput<Inner<B>>> + 'static,
    O: Optimizer<M, B>,
    L: LrScheduler,
    S: ParallelStrategy<B>,
{
    type Backend = B;
    type Model = M;
    type EvalModel = M::InnerModule;
    type Item = I;
    type TrainBatch = TB;
    type EvalBatch = EB;
    type EvalOutput = EO;
    type Optimizer = O;
    type Scheduler = L;
    type Strategy = S;
}

/// `T`'s types with the optimizer `O` and the LR scheduler `L` in place of its own: what
/// [`Trainer::with_optimizers`](super::Trainer::with_optimizers) returns a Trainer of.
pub type WithOptimizers<T, O, L> = Components<
    <T as TrainerTypes>::Backend,
    <T as TrainerTypes>::Model,
    <T as TrainerTypes>::Item,
    <T as TrainerTypes>::TrainBatch,
    <T as TrainerTypes>::EvalBatch,
    <T as TrainerTypes>::EvalOutput,
    O,
    L,
    <T as TrainerTypes>::Strategy,
>;

/// The Accelerator a Trainer of types `T` steps through.
pub type TrainerAccelerator<T> =
    crate::Accelerator<<T as TrainerTypes>::Backend, <T as TrainerTypes>::Strategy>;
