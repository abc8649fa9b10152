//! [`PrecisionPlugin`]: a precision policy as one value a training loop holds, like Lightning's
//! `Precision` plugin: the model's dtypes, the forward pass (per op or on a half view), the
//! backward pass, the loss scaler's step gate and the scaler's saved state.

use core::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use burn::module::{AutodiffModule, Module, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::grads::{self, GradSummary};
use crate::{
    AutocastMode, CastFloats, DeviceScaler, GradScaler, GradScalerConfig, GradScalerState,
    Precision, PrecisionError, autocast_ops, autocast_view_except, cast_module, materialize_params,
    promotes_dtypes, shared_float_state,
};

/// A closure that runs another inside this precision's op-level scope (on any thread): what a
/// recomputed checkpointed block needs to replay its forward in the same dtypes
/// (`afterburner_checkpoint::ReplayContext` has this shape).
pub type OpScope = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

/// One precision policy, set up for backend `B`: built from the [`Precision`], the
/// [`AutocastMode`] and the loss scaler's settings, it owns the [`GradScaler`] (16-mixed), the
/// per-op vs half-view decision and the float state the half view leaves alone (BatchNorm's
/// running statistics). A loop calls, in order: [`prepare_model`](Self::prepare_model) once,
/// then per micro-batch [`forward`](Self::forward) and [`backward`](Self::backward), and per
/// optimizer step [`unscale`](Self::unscale), then [`update`](Self::update) with whether the
/// step was skipped. Every decision it makes follows from the policy's dtypes and
/// [`Precision::needs_loss_scaling`], so a new precision is a new [`Precision`] variant.
///
/// ```
/// use afterburner_precision::{AutocastMode, GradScalerConfig, PrecisionPlugin};
/// use burn::backend::{Autodiff, Flex};
/// let plugin = PrecisionPlugin::<Autodiff<Flex>>::new(
///     "16-mixed".parse().unwrap(),
///     AutocastMode::Auto,
///     GradScalerConfig::default(),
///     &Default::default(),
/// )
/// .unwrap();
/// assert_eq!(plugin.loss_scale(), Some(65536.0));
/// assert_eq!(plugin.op_dtype(), None); // plain Autodiff<Flex>: the half view
/// ```
pub struct PrecisionPlugin<B: AutodiffBackend> {
    precision: Precision,
    /// The half dtype when a mixed precision runs per op.
    op_dtype: Option<DType>,
    /// Whether the backend promotes mixed dtypes (`Autodiff<Autocast<B>>`).
    promotes: bool,
    scaler: Option<GradScaler>,
    /// The scaler's state on the device while steps are decided there
    /// ([`scale_on_device`](Self::scale_on_device)); the host scaler is then stale.
    device_scaler: Option<DeviceScaler<B::InnerBackend>>,
    /// Float state shared between clones of the prepared models: the half view keeps it.
    shared_state: Mutex<Vec<ParamId>>,
    backend: PhantomData<fn() -> B>,
}

impl<B: AutodiffBackend> PrecisionPlugin<B> {
    /// Checks that the backend computes in the policy's dtype (and, for `autocast = "op"`,
    /// promotes dtypes), decides per op vs view and builds the loss scaler the policy needs.
    pub fn new(
        precision: Precision,
        autocast: AutocastMode,
        scaler: GradScalerConfig,
        device: &B::Device,
    ) -> Result<Self, PrecisionError> {
        precision.check_backend::<B>(device)?;
        crate::record_autocast_nodes::<B>();
        let promotes = promotes_dtypes::<B>(device);
        if autocast == AutocastMode::Op && !promotes {
            return Err(PrecisionError::InvalidSetting {
                field: "autocast",
                value: autocast.to_string(),
                expected: "\"view\" or \"auto\" on this backend; \"op\" needs it wrapped as \
                           Autodiff<afterburner::Autocast<B>> (or Autocast<Autodiff<B>>)"
                    .into(),
            });
        }
        if precision.is_emulated_on::<B>(device) {
            tracing::warn!(
                precision = %precision,
                backend = B::name(device),
                "this backend emulates half precision (it converts every op to f32 and back): \
                 expect 2-3.5x slower steps than 32-true; the half modes pay off on GPUs"
            );
        }
        let per_op = match autocast {
            AutocastMode::Op => true,
            AutocastMode::View => false,
            AutocastMode::Auto => promotes,
        };
        let scaler = match precision.needs_loss_scaling() {
            true => Some(GradScaler::new(scaler)?),
            false => None,
        };
        Ok(Self {
            precision,
            op_dtype: (precision.is_mixed() && per_op).then(|| precision.compute_dtype()),
            promotes,
            scaler,
            device_scaler: None,
            shared_state: Mutex::new(Vec::new()),
            backend: PhantomData,
        })
    }

    /// The policy.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The half dtype when the forward and backward run per op (inside an `autocast_ops`
    /// scope); `None` for the half view and the precisions that are not mixed.
    pub fn op_dtype(&self) -> Option<DType> {
        self.op_dtype
    }

    /// The dtype of the half view the forward runs on (a strategy that builds its own view,
    /// like FSDP's gathered one, builds it in this dtype); `None` per op and for the
    /// precisions that are not mixed.
    pub fn view_dtype(&self) -> Option<DType> {
        let mixed = self.precision.is_mixed() && self.op_dtype.is_none();
        mixed.then(|| self.precision.compute_dtype())
    }

    /// The op-level scope as a closure any thread can run (see [`OpScope`]); `None` when
    /// nothing runs per op.
    pub fn op_scope(&self) -> Option<OpScope> {
        self.op_dtype
            .map(|half| Arc::new(move |f: &mut dyn FnMut()| autocast_ops(half, f)) as OpScope)
    }

    /// Initialises every lazy parameter and casts the model to the policy's parameter dtype
    /// (half for the `*-true` precisions, f32 otherwise), without the checks of
    /// [`prepare_model`](Self::prepare_model) (for a model loaded into a prepared one).
    pub fn to_param_dtype<M: AutodiffModule<B>>(&self, model: M) -> M {
        materialize_params(&model);
        match self.precision.param_dtype() {
            DType::F32 => model,
            half => cast_module(model, half),
        }
    }

    /// [`to_param_dtype`](Self::to_param_dtype), then records the model's float state shared
    /// between clones (BatchNorm's running statistics), which stays in f32 under the mixed
    /// precisions and meets half activations: only a backend that promotes dtypes runs that,
    /// so any other is an error here rather than a panic in the first forward.
    pub fn prepare_model<M: AutodiffModule<B>>(&self, model: M) -> Result<M, PrecisionError> {
        let model = self.to_param_dtype(model);
        if !self.precision.is_mixed() {
            return Ok(model);
        }
        let shared = shared_float_state(&model, self.precision.compute_dtype());
        if shared.is_empty() {
            return Ok(model);
        }
        if !self.promotes {
            return Err(PrecisionError::InvalidSetting {
                field: "precision",
                value: self.precision.to_string(),
                expected: "32-true or a *-true precision for a model with running statistics \
                           (BatchNorm), or the backend wrapped as \
                           Autodiff<afterburner::Autocast<B>>, which keeps them in f32 and \
                           promotes dtypes"
                    .into(),
            });
        }
        self.shared_state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(shared);
        Ok(model)
    }

    /// Runs `forward(model, input)` under the policy and returns its output's float tensors in
    /// f32 (so the loss is computed in f32): per op, inside the `autocast_ops` scope with the
    /// input as it is (as under `torch.autocast`); otherwise with the input cast to the compute
    /// dtype, on `view` when given (a strategy's own view, built in
    /// [`view_dtype`](Self::view_dtype)) or else on a fresh half view of the model under the
    /// mixed precisions.
    pub fn forward<M, I, O, F>(&self, model: &M, view: Option<M>, input: I, forward: F) -> O
    where
        M: Module<B>,
        I: CastFloats,
        O: CastFloats,
        F: FnOnce(&M, I) -> O,
    {
        if let Some(half) = self.op_dtype {
            let run = || match &view {
                Some(view) => forward(view, input),
                None => forward(model, input),
            };
            return autocast_ops(half, run).cast_floats(DType::F32);
        }
        let input = input.cast_floats(self.precision.compute_dtype());
        let output = match (view, self.view_dtype()) {
            (Some(view), _) => forward(&view, input),
            (None, Some(half)) => {
                let keep = self
                    .shared_state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let view = autocast_view_except(model, half, &keep);
                drop(keep);
                forward(&view, input)
            }
            (None, None) => forward(model, input),
        };
        output.cast_floats(DType::F32)
    }

    /// Multiplies the loss by the loss scale (16-mixed; the loss as it is otherwise).
    pub fn scale_loss(&self, loss: Tensor<B, 1>) -> Tensor<B, 1> {
        match (&self.device_scaler, &self.scaler) {
            (Some(on_device), _) => loss.mul(Tensor::from_inner(on_device.scale())),
            (None, Some(scaler)) => scaler.scale_loss(loss),
            (None, None) => loss,
        }
    }

    /// Moves the loss scaler's state to the device (nothing without a scaler): from here the
    /// scale is applied, unscaled and updated there ([`device_unscale`](Self::device_unscale),
    /// [`update_on_device`](Self::update_on_device)) without a host read, until
    /// [`settle_scaler`](Self::settle_scaler) brings it back.
    pub fn scale_on_device(&mut self, device: &B::Device) {
        if let (None, Some(scaler)) = (&self.device_scaler, &self.scaler) {
            self.device_scaler = Some(DeviceScaler::from_host(scaler, device));
        }
    }

    /// `1 / scale` on the device, the factor that unscales the gradients (`None` unless the
    /// scaler's state is on the device).
    pub fn device_unscale(&self) -> Option<Tensor<B::InnerBackend, 1>> {
        self.device_scaler.as_ref().map(|s| s.scale().recip())
    }

    /// Ends a step decided on the device: `found_inf` is 1 for an overflow, 0 otherwise.
    pub fn update_on_device(&mut self, found_inf: Tensor<B::InnerBackend, 1>) {
        if let Some(scaler) = &mut self.device_scaler {
            scaler.update(found_inf);
        }
    }

    /// Brings the scaler's state back from the device (one host read; nothing when it is on
    /// the host).
    pub fn settle_scaler(&mut self) {
        if let (Some(on_device), Some(scaler)) = (self.device_scaler.take(), &mut self.scaler) {
            let state = on_device.read();
            // A state read from the device is the scaler's own: finite and positive.
            let _ = scaler.load_state(state);
        }
    }

    /// `loss.backward()`, per op under the forward's scope (the backward ops of Linear and
    /// the convolutions in half, their gradients delivered in f32 to f32 operands), as
    /// PyTorch's backward of an autocast region runs. The loss is not scaled here: see
    /// [`scale_loss`](Self::scale_loss).
    pub fn backward(&self, loss: Tensor<B, 1>) -> B::Gradients {
        match self.op_dtype {
            Some(half) => autocast_ops(half, || loss.backward()),
            None => loss.backward(),
        }
    }

    /// Whether a step with inf/NaN gradients is skipped by this precision itself (its loss
    /// scaler backs off and the step is retried at the lower scale).
    pub fn skips_overflow(&self) -> bool {
        self.scaler.is_some()
    }

    /// Unscales `grads` (divides them by the loss scale) times `factor` (e.g. a correction
    /// of the accumulation mean) and returns their global norm and finiteness; without a
    /// scaler, scales by `factor` and returns the summary only when `want_norm`.
    pub fn unscale<M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: &mut GradientsParams,
        factor: f64,
        want_norm: bool,
    ) -> Option<GradSummary> {
        match &self.scaler {
            Some(scaler) => Some(scaler.unscale::<B, M>(model, grads, factor)),
            None if want_norm => Some(grads::scale_and_norm::<B, M>(model, grads, factor)),
            None => {
                if factor != 1.0 {
                    grads::scale::<B, M>(model, grads, factor);
                }
                None
            }
        }
    }

    /// Ends an optimizer step: after a skipped one (`found_inf`) the loss scale backs off,
    /// after enough applied ones it grows. Nothing without a scaler.
    pub fn update(&mut self, found_inf: bool) {
        self.settle_scaler();
        if let Some(scaler) = &mut self.scaler {
            scaler.update(found_inf);
        }
    }

    /// The current loss scale (`None` without a scaler; a host read while its state is on
    /// the device).
    pub fn loss_scale(&self) -> Option<f64> {
        self.scaler_state().map(|s| s.scale)
    }

    /// The loss scaler's state, saved with a training checkpoint (`None` without a scaler; a
    /// host read while it is on the device).
    pub fn scaler_state(&self) -> Option<GradScalerState> {
        match &self.device_scaler {
            Some(on_device) => Some(on_device.read()),
            None => self.scaler.as_ref().map(GradScaler::state),
        }
    }

    /// Checks a saved scaler state without applying it (a state saved without a scaler
    /// leaves this one as it is); apply it with [`load_scaler_state`](Self::load_scaler_state).
    pub fn check_scaler_state(&self, saved: Option<GradScalerState>) -> Result<(), PrecisionError> {
        let mut scaler = self.scaler.clone();
        if let (Some(scaler), Some(saved)) = (&mut scaler, saved) {
            scaler.load_state(saved)?;
        }
        Ok(())
    }

    /// Restores a saved scaler state (checked as in
    /// [`check_scaler_state`](Self::check_scaler_state)).
    pub fn load_scaler_state(
        &mut self,
        saved: Option<GradScalerState>,
    ) -> Result<(), PrecisionError> {
        if let (Some(scaler), Some(saved)) = (&mut self.scaler, saved) {
            scaler.load_state(saved)?;
            if let Some(on_device) = &mut self.device_scaler {
                *on_device = DeviceScaler::from_host(scaler, &on_device.scale().device());
            }
        }
        Ok(())
    }
}
