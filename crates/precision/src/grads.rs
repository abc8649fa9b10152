//! Whole-model gradient operations that Burn 0.21 lacks.
//!
//! `GradientsParams` cannot be iterated in Burn 0.21, so each operation walks the model's
//! parameters (a [`ModuleVisitor`]) and edits the gradient stored under each [`ParamId`].
//! Norms are accumulated on the device and read back once: one host sync per call.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Walks each parameter's gradient once: optionally scales it, optionally adds its squared
/// L2 norm (in f32) to a running device-side sum.
/// What a walk over the gradients measures besides scaling them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    Nothing,
    /// The sum of squares (the norm, and finiteness).
    SquaredNorm,
    /// The plain sum: finite exactly when every gradient is (barring an f32 overflow of the
    /// sum itself), one read per element instead of a square and a read.
    Sum,
}

struct GradWalk<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: Option<f64>,
    /// A factor on the device (`[1]`), applied after `factor`.
    device_factor: Option<Tensor<Inner<B>, 1>>,
    measure: Measure,
    squared_sum: Option<Tensor<Inner<B>, 1>>,
    seen: HashSet<ParamId>,
    count: usize,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradWalk<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.seen.insert(param.id) {
            return; // a parameter shared by two sub-modules is handled once
        }
        let Some(mut grad) = self.grads.remove::<Inner<B>, D>(param.id) else {
            return;
        };
        self.count += 1;
        if let Some(factor) = self.factor {
            grad = grad.mul_scalar(factor);
        }
        if let Some(factor) = &self.device_factor {
            let factor = factor.clone().cast(grad.dtype()).reshape([1; D]);
            grad = grad.mul(factor);
        }
        let as_f32 = |g: &Tensor<Inner<B>, D>| match g.dtype() {
            DType::F32 => g.clone(),
            _ => g.clone().cast(DType::F32),
        };
        let measured = match self.measure {
            Measure::Nothing => None,
            Measure::SquaredNorm => Some(as_f32(&grad).powi_scalar(2).sum()),
            Measure::Sum => Some(as_f32(&grad).sum()),
        };
        if let Some(measured) = measured {
            self.squared_sum = Some(match self.squared_sum.take() {
                Some(sum) => sum + measured,
                None => measured,
            });
        }
        self.grads.register::<Inner<B>, D>(param.id, grad);
    }
}

fn walk<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: Option<f64>,
    measure: Measure,
) -> GradSummary {
    let (sum, tensors) = walk_on_device::<B, M>(model, grads, factor, None, measure);
    let squared_norm = sum.map(|s| s.into_scalar().elem::<f64>()).unwrap_or(0.0);
    GradSummary {
        squared_norm,
        tensors,
    }
}

/// The walk, its measure left on the device (`None` without one or without gradients), and
/// the number of tensors it saw.
fn walk_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: Option<f64>,
    device_factor: Option<Tensor<Inner<B>, 1>>,
    measure: Measure,
) -> (Option<Tensor<Inner<B>, 1>>, usize) {
    let mut walk = GradWalk::<B> {
        grads,
        factor,
        device_factor,
        measure,
        squared_sum: None,
        seen: HashSet::new(),
        count: 0,
    };
    model.visit(&mut walk);
    (walk.squared_sum, walk.count)
}

/// Multiplies every gradient by `factor` (host, skipped when 1) and then by `device_factor`
/// (a one-element tensor), and returns the sum of their squares (after scaling, in f32) on
/// the device: inf or NaN when any entry is. Reads nothing on the host.
pub fn scale_and_squared_norm_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
    device_factor: Option<Tensor<Inner<B>, 1>>,
) -> Option<Tensor<Inner<B>, 1>> {
    let factor = (factor != 1.0).then_some(factor);
    walk_on_device::<B, M>(model, grads, factor, device_factor, Measure::SquaredNorm).0
}

/// The sum of every gradient's entries on the device (finite exactly when every gradient is,
/// barring an f32 overflow of the sum): the non-finite guard's check without a host read.
pub fn sum_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
) -> Option<Tensor<Inner<B>, 1>> {
    let factor = (factor != 1.0).then_some(factor);
    walk_on_device::<B, M>(model, grads, factor, None, Measure::Sum).0
}

/// Multiplies every gradient by a one-element device tensor (a clip factor, say).
pub fn scale_on_device<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: Tensor<Inner<B>, 1>,
) {
    walk_on_device::<B, M>(model, grads, None, Some(factor), Measure::Nothing);
}

/// What a gradient walk saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradSummary {
    /// Sum of squared gradient entries over all parameters (after scaling), in f64.
    /// Infinite or NaN when any gradient entry is.
    pub squared_norm: f64,
    /// How many parameter tensors had a gradient.
    pub tensors: usize,
}

impl GradSummary {
    /// The global L2 norm.
    pub fn norm(&self) -> f64 {
        self.squared_norm.sqrt()
    }

    /// False when any gradient holds an inf or NaN.
    pub fn is_finite(&self) -> bool {
        self.squared_norm.is_finite()
    }
}

/// Multiplies every gradient of `model` by `factor`.
pub fn scale<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
) -> GradSummary {
    walk::<B, M>(model, grads, Some(factor), Measure::Nothing)
}

/// Multiplies every gradient by `factor` (skipped when 1) and returns the global norm after
/// scaling, in one pass and one host sync.
pub fn scale_and_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    factor: f64,
) -> GradSummary {
    let factor = (factor != 1.0).then_some(factor);
    walk::<B, M>(model, grads, factor, Measure::SquaredNorm)
}

/// Whether every gradient of `model` is finite: one sum per tensor and one host sync, about
/// half the work of [`norm`] (a sum beyond f32's range, 3.4e38, also counts as non-finite).
pub fn all_finite<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
) -> bool {
    walk::<B, M>(model, grads, None, Measure::Sum)
        .squared_norm
        .is_finite()
}

/// The global L2 norm over every gradient of `model` (like `torch.nn.utils.clip_grad_norm_`'s
/// total norm), with the inf/NaN check in the same pass.
pub fn norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
) -> GradSummary {
    walk::<B, M>(model, grads, None, Measure::SquaredNorm)
}

/// Scales gradients down so their global norm is at most `max_norm`, given the norm already
/// computed; returns the factor applied (1.0 when no clipping was needed).
///
/// Same formula as PyTorch: `clip = max_norm / (norm + 1e-6)`, applied only when below 1.
pub fn clip_to_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    total_norm: f64,
    max_norm: f64,
) -> f64 {
    let clip = max_norm / (total_norm + 1e-6);
    if clip < 1.0 {
        scale::<B, M>(model, grads, clip);
        clip
    } else {
        1.0
    }
}

/// Global-norm clipping in one call: computes the norm over all of `model`'s gradients, scales
/// them down to `max_norm` if above it, and returns the norm before clipping.
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> f64 {
    let total = norm::<B, M>(model, grads).norm();
    clip_to_norm::<B, M>(model, grads, total, max_norm);
    total
}

/// Adds `other`'s gradients into `sum`, parameter by parameter (for accumulation).
pub fn accumulate<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    sum: &mut GradientsParams,
    mut other: GradientsParams,
) {
    struct Add<'a> {
        sum: &'a mut GradientsParams,
        other: &'a mut GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Add<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(new) = self.other.remove::<Inner<B>, D>(param.id) else {
                return;
            };
            let total = match self.sum.remove::<Inner<B>, D>(param.id) {
                Some(old) => old + new,
                None => new,
            };
            self.sum.register::<Inner<B>, D>(param.id, total);
        }
    }
    model.visit(&mut Add {
        sum,
        other: &mut other,
    });
}

/// Casts each gradient whose dtype differs from its parameter's to the parameter's dtype, as
/// PyTorch's autograd delivers a gradient in its tensor's dtype (an f32 parameter used in a
/// half matmul under op-level autocast gets a half gradient from Burn's Autodiff). Reads
/// dtypes only; a gradient already right is left as is.
pub fn to_param_dtypes<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
) {
    struct Cast<'a>(&'a mut GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Cast<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let dtype = param.val().dtype();
            let Some(grad) = self.0.get::<Inner<B>, D>(param.id) else {
                return;
            };
            if grad.dtype() != dtype {
                self.0.register::<Inner<B>, D>(param.id, grad.cast(dtype));
            }
        }
    }
    model.visit(&mut Cast(grads));
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};

    type AD = Autodiff<Flex>;

    fn grads_of(model: &Linear<AD>, x: Tensor<AD, 2>) -> GradientsParams {
        GradientsParams::from_grads(model.forward(x).sum().backward(), model)
    }

    fn flat(model: &Linear<AD>, grads: &GradientsParams) -> Vec<f32> {
        let w = grads.get::<Flex, 2>(model.weight.id).unwrap();
        let b = grads
            .get::<Flex, 1>(model.bias.as_ref().unwrap().id)
            .unwrap();
        let mut v = w.into_data().to_vec::<f32>().unwrap();
        v.extend(b.into_data().to_vec::<f32>().unwrap());
        v
    }

    #[test]
    fn norm_is_global_over_all_tensors() {
        let device = Default::default();
        let model = LinearConfig::new(3, 2).init::<AD>(&device);
        let mut grads = grads_of(&model, Tensor::ones([4, 3], &device));
        let expected: f64 = flat(&model, &grads)
            .iter()
            .map(|g| f64::from(*g).powi(2))
            .sum::<f64>()
            .sqrt();
        let summary = norm::<AD, _>(&model, &mut grads);
        assert_eq!(summary.tensors, 2);
        assert!((summary.norm() - expected).abs() < 1e-5 * expected);
    }

    #[test]
    fn clipping_scales_to_max_norm_and_returns_old_norm() {
        let device = Default::default();
        let model = LinearConfig::new(3, 2).init::<AD>(&device);
        let mut grads = grads_of(&model, Tensor::ones([4, 3], &device).mul_scalar(10.0));
        let before = clip_grad_norm::<AD, _>(&model, &mut grads, 1.0);
        assert!(before > 1.0);
        let after = norm::<AD, _>(&model, &mut grads).norm();
        assert!((after - 1.0).abs() < 1e-4, "clipped norm {after}");
        // Below the limit nothing changes.
        let again = clip_grad_norm::<AD, _>(&model, &mut grads, 100.0);
        assert!((again - after).abs() < 1e-9);
    }

    #[test]
    fn inf_anywhere_is_detected() {
        let device = Default::default();
        let model = LinearConfig::new(3, 2).init::<AD>(&device);
        let mut grads = grads_of(&model, Tensor::ones([4, 3], &device));
        let bias = model.bias.as_ref().unwrap().id;
        let b = grads.remove::<Flex, 1>(bias).unwrap();
        grads.register::<Flex, 1>(bias, b.mul_scalar(f32::INFINITY));
        assert!(!norm::<AD, _>(&model, &mut grads).is_finite());
    }

    #[test]
    fn accumulate_adds_per_parameter() {
        let device = Default::default();
        let model = LinearConfig::new(3, 2).init::<AD>(&device);
        let one = grads_of(&model, Tensor::ones([1, 3], &device));
        let expected: Vec<f32> = flat(&model, &one).iter().map(|g| g * 3.0).collect();
        let mut sum = GradientsParams::new();
        for _ in 0..3 {
            accumulate::<AD, _>(
                &model,
                &mut sum,
                grads_of(&model, Tensor::ones([1, 3], &device)),
            );
        }
        for (a, b) in flat(&model, &sum).iter().zip(expected) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
