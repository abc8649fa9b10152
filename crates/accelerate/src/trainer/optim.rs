//! [`HfOptimizer`]: the optimizer the arguments' `optim` names (AdamW, Adam or SGD), chosen at
//! run time behind one type, so `Trainer::new` trains with any of them. Its saved state has
//! the layout of the Burn optimizer it runs (an AdamW run's checkpoint holds exactly what
//! `AdamWConfig::init()`'s would).

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{
    Adam, AdamConfig, AdamState, AdamW, AdamWConfig, AdamWState, LearningRate, Sgd, SgdConfig,
    SgdState, SimpleOptimizer,
};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::TrainingArguments;
use super::choices::OptimizerType;

/// The Trainer's default optimizer: [`OptimizerAdaptor`] over [`ArgsOptimizer`], built from
/// the arguments by [`HfOptimizer::from_args`] (`optim`, `weight_decay`, the Adam betas and
/// epsilon).
pub type HfOptimizer<M, B> =
    OptimizerAdaptor<ArgsOptimizer<<B as AutodiffBackend>::InnerBackend>, M, B>;

/// Builds the optimizer `args.optim` names.
pub fn optimizer_from_args<B, M>(args: &TrainingArguments) -> HfOptimizer<M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let decay = args.weight_decay as f32;
    let optim = match args.optim {
        OptimizerType::AdamW => ArgsOptimizer::AdamW(
            AdamWConfig::new()
                .with_beta_1(args.adam_beta1 as f32)
                .with_beta_2(args.adam_beta2 as f32)
                .with_epsilon(args.adam_epsilon as f32)
                .with_weight_decay(decay)
                .build(),
        ),
        // torch.optim.Adam's weight_decay is an L2 penalty added to the gradient, as Burn's.
        OptimizerType::Adam => ArgsOptimizer::Adam(
            AdamConfig::new()
                .with_beta_1(args.adam_beta1 as f32)
                .with_beta_2(args.adam_beta2 as f32)
                .with_epsilon(args.adam_epsilon as f32)
                .with_weight_decay(
                    (decay > 0.0).then(|| burn::optim::decay::WeightDecayConfig::new(decay)),
                )
                .build(),
        ),
        OptimizerType::Sgd => ArgsOptimizer::Sgd(
            SgdConfig::new()
                .with_weight_decay(
                    (decay > 0.0).then(|| burn::optim::decay::WeightDecayConfig::new(decay)),
                )
                .build(),
        ),
    };
    OptimizerAdaptor::from(optim)
}

/// One of Burn's element-wise optimizers, picked at run time.
#[derive(Clone)]
pub enum ArgsOptimizer<B: Backend> {
    /// `optim = "adamw"` (HF's default, `adamw_torch`).
    AdamW(AdamW),
    /// `optim = "adam"`.
    Adam(Adam),
    /// `optim = "sgd"`.
    Sgd(Sgd<B>),
}

/// A parameter's state under [`ArgsOptimizer`]: Adam's and AdamW's moments (the same record),
/// or SGD's momentum.
#[derive(Clone)]
pub enum ArgsState<B: Backend, const D: usize> {
    /// Adam's or AdamW's first and second moments.
    Moments(AdamWState<B, D>),
    /// SGD's momentum buffer (none without momentum).
    Sgd(SgdState<B, D>),
}

/// The saved form of [`ArgsState`]: the inner optimizer's own item, untagged, so a checkpoint
/// holds what the plain Burn optimizer's would.
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ArgsStateItem<M, S> {
    /// Adam's or AdamW's item.
    Moments(M),
    /// SGD's item.
    Sgd(S),
}

impl<B: Backend, const D: usize> Record<B> for ArgsState<B, D> {
    type Item<P: PrecisionSettings> = ArgsStateItem<
        <AdamWState<B, D> as Record<B>>::Item<P>,
        <SgdState<B, D> as Record<B>>::Item<P>,
    >;

    fn into_item<P: PrecisionSettings>(self) -> Self::Item<P> {
        match self {
            Self::Moments(state) => ArgsStateItem::Moments(state.into_item()),
            Self::Sgd(state) => ArgsStateItem::Sgd(state.into_item()),
        }
    }

    fn from_item<P: PrecisionSettings>(item: Self::Item<P>, device: &B::Device) -> Self {
        match item {
            ArgsStateItem::Moments(item) => Self::Moments(AdamWState::from_item(item, device)),
            ArgsStateItem::Sgd(item) => Self::Sgd(SgdState::from_item(item, device)),
        }
    }
}

impl<B: Backend> SimpleOptimizer<B> for ArgsOptimizer<B> {
    type State<const D: usize> = ArgsState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        // A state of the other kind (a checkpoint of another optimizer) starts afresh.
        match self {
            Self::AdamW(optim) => {
                let state = state.and_then(ArgsState::into_moments);
                let (tensor, state) = optim.step(lr, tensor, grad, state);
                (tensor, state.map(ArgsState::Moments))
            }
            Self::Adam(optim) => {
                let state = state
                    .and_then(ArgsState::into_moments)
                    .map(|s| AdamState::new(s.momentum));
                let (tensor, state) = optim.step(lr, tensor, grad, state);
                (
                    tensor,
                    state.map(|s| ArgsState::Moments(AdamWState::new(s.momentum))),
                )
            }
            Self::Sgd(optim) => {
                let state = match state {
                    Some(ArgsState::Sgd(state)) => Some(state),
                    _ => None,
                };
                let (tensor, state) = optim.step(lr, tensor, grad, state);
                (tensor, state.map(ArgsState::Sgd))
            }
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device<B>) -> Self::State<D> {
        match state {
            ArgsState::Moments(state) => {
                ArgsState::Moments(<AdamW as SimpleOptimizer<B>>::to_device(state, device))
            }
            ArgsState::Sgd(state) => ArgsState::Sgd(Sgd::<B>::to_device(state, device)),
        }
    }
}

impl<B: Backend, const D: usize> ArgsState<B, D> {
    /// The moments, for Adam and AdamW.
    fn into_moments(self) -> Option<AdamWState<B, D>> {
        match self {
            Self::Moments(state) => Some(state),
            Self::Sgd(_) => None,
        }
    }
}
