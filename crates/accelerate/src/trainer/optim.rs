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
use super::gated::{DeviceMoments, GateCell, GatedAdamW};
use crate::precision::Precision;

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
    gated_optimizer_from_args(args, GateCell::default())
}

/// [`optimizer_from_args`] whose AdamW reads the gate `gate` holds when one is set (the
/// Trainer's step decided on the device, [`gated`](super::gated)).
pub(super) fn gated_optimizer_from_args<B, M>(
    args: &TrainingArguments,
    gate: GateCell<B::InnerBackend>,
) -> HfOptimizer<M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let decay = args.weight_decay as f32;
    let epsilon = adam_epsilon(args);
    let optim = match args.optim {
        OptimizerType::AdamW => ArgsOptimizer::AdamW(
            AdamWConfig::new()
                .with_beta_1(args.adam_beta1 as f32)
                .with_beta_2(args.adam_beta2 as f32)
                .with_epsilon(epsilon)
                .with_weight_decay(decay)
                .build(),
            GatedAdamW {
                beta_1: args.adam_beta1 as f32,
                beta_2: args.adam_beta2 as f32,
                epsilon,
                weight_decay: decay,
                gate,
            },
        ),
        // torch.optim.Adam's weight_decay is an L2 penalty added to the gradient, as Burn's.
        OptimizerType::Adam => ArgsOptimizer::Adam(
            AdamConfig::new()
                .with_beta_1(args.adam_beta1 as f32)
                .with_beta_2(args.adam_beta2 as f32)
                .with_epsilon(epsilon)
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

/// The smallest normal f16 number, 2^-14: below it an f16 epsilon loses precision, and below
/// half the smallest subnormal (2^-25) it is 0.
pub const F16_MIN_EPSILON: f64 = 6.103_515_625e-5;

/// Adam's epsilon for the run: `adam_epsilon`, raised to [`F16_MIN_EPSILON`] (with a warning)
/// under `16-true`, where the optimizer's state is f16 and HF's default 1e-8 would be 0: Adam
/// would then divide 0 by 0 wherever a gradient is 0, and the first step would fill the model
/// with NaN. Other precisions keep it (bf16 has f32's range; mixed ones keep f32 state).
pub fn adam_epsilon(args: &TrainingArguments) -> f32 {
    let wanted = args.adam_epsilon;
    let uses_epsilon = matches!(args.optim, OptimizerType::AdamW | OptimizerType::Adam);
    if uses_epsilon && args.effective_precision() == Precision::F16True && wanted < F16_MIN_EPSILON
    {
        tracing::warn!(
            "adam_epsilon = {wanted:e} is below what f16 holds under 16-true (it would round to \
             {}); raised to {F16_MIN_EPSILON:e}, the smallest normal f16",
            burn::tensor::f16::from_f64(wanted)
        );
        return F16_MIN_EPSILON as f32;
    }
    wanted as f32
}

/// One of Burn's element-wise optimizers, picked at run time.
#[derive(Clone)]
pub enum ArgsOptimizer<B: Backend> {
    /// `optim = "adamw"` (HF's default, `adamw_torch`): Burn's AdamW, and the same settings
    /// for the step the Trainer gates on the device.
    AdamW(AdamW, GatedAdamW<B>),
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
    /// AdamW's moments with the step count on the device (the gated step's).
    DeviceMoments(DeviceMoments<B, D>),
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
            // Saved as Burn's AdamW state (the step count read once, at the save).
            Self::DeviceMoments(state) => ArgsStateItem::Moments(state.into_host().into_item()),
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
            Self::AdamW(optim, gated) => match gated.current() {
                Some(gate) => {
                    let state = state.and_then(ArgsState::into_device_moments);
                    let (tensor, state) = gated.step(&gate, tensor, grad, state);
                    (tensor, Some(ArgsState::DeviceMoments(state)))
                }
                None => {
                    let state = state.and_then(ArgsState::into_moments);
                    let (tensor, state) = optim.step(lr, tensor, grad, state);
                    (tensor, state.map(ArgsState::Moments))
                }
            },
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
            ArgsState::DeviceMoments(state) => ArgsState::DeviceMoments(DeviceMoments {
                time: state.time.to_device(device),
                moment_1: state.moment_1.to_device(device),
                moment_2: state.moment_2.to_device(device),
            }),
            ArgsState::Sgd(state) => ArgsState::Sgd(Sgd::<B>::to_device(state, device)),
        }
    }
}

impl<B: Backend, const D: usize> ArgsState<B, D> {
    /// The moments, for Adam and AdamW (a gated state's step count read on the host).
    fn into_moments(self) -> Option<AdamWState<B, D>> {
        match self {
            Self::Moments(state) => Some(state),
            Self::DeviceMoments(state) => Some(state.into_host()),
            Self::Sgd(_) => None,
        }
    }

    /// The moments with the step count on the device, for the gated AdamW step.
    fn into_device_moments(self) -> Option<DeviceMoments<B, D>> {
        match self {
            Self::Moments(state) => Some(DeviceMoments::from_host(state)),
            Self::DeviceMoments(state) => Some(state),
            Self::Sgd(_) => None,
        }
    }
}
