//! Which parameters a plan split and how, and the full state from the ranks' parts and back:
//! what saving a tensor-parallel state (gathered, loadable at any tp size or on one device),
//! loading one, and the gradient norm counted once need.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};

use super::{Inner, TensorParallel};
use crate::{OptimizerRecord, ParallelError, ProcessGroup, param_ids};

/// How one parameter is split over the ranks: along `dim`, in `chunks` blocks side by side,
/// each block split evenly (rank `r` holds the `r`-th slice of every block, side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParamSplit {
    pub(crate) dim: usize,
    pub(crate) chunks: usize,
}

impl ParamSplit {
    /// This rank's part of `full` (of any rank: the split dimension shrinks by `size`).
    pub(crate) fn part_of<I: Backend, const D: usize>(
        self,
        full: Tensor<I, D>,
        rank: usize,
        size: usize,
    ) -> Tensor<I, D> {
        let mut dims = full.dims();
        let part = self.part(full.reshape(self.view(&dims)), rank, size);
        dims[self.dim] /= size;
        part.reshape(dims)
    }

    /// This rank's part of `full` (viewed `[outer, dims[dim], inner]`).
    fn part<I: Backend>(self, full: Tensor<I, 3>, rank: usize, size: usize) -> Tensor<I, 3> {
        let width = full.dims()[1] / self.chunks;
        let part = width / size;
        let blocks = (0..self.chunks)
            .map(|c| full.clone().narrow(1, c * width + rank * part, part))
            .collect();
        Tensor::cat(blocks, 1)
    }

    /// The full tensor from every rank's part, in rank order (each viewed `[outer, n, inner]`).
    fn join<I: Backend>(self, parts: Vec<Tensor<I, 3>>) -> Tensor<I, 3> {
        let part = parts[0].dims()[1] / self.chunks;
        let blocks = (0..self.chunks)
            .flat_map(|c| {
                parts
                    .iter()
                    .map(move |p| p.clone().narrow(1, c * part, part))
            })
            .collect();
        Tensor::cat(blocks, 1)
    }

    /// `shape` as `[outer, shape[dim], inner]`.
    fn view(self, shape: &[usize]) -> [usize; 3] {
        let outer = shape[..self.dim].iter().product();
        let inner = shape[self.dim + 1..].iter().product();
        [outer, shape[self.dim], inner]
    }
}

impl<G> TensorParallel<G> {
    /// Remembers that the parameter `id` is split as `split` (for saving and the norm).
    pub(crate) fn register(&self, id: String, split: ParamSplit) {
        self.splits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, split);
    }

    /// `values` combined over the group, outside the counted layer collectives (a norm).
    pub(crate) fn group_all_reduce<I: Backend>(
        &self,
        values: Tensor<I, 1>,
        op: crate::ReduceOp,
    ) -> Result<Tensor<I, 1>, ParallelError>
    where
        G: ProcessGroup<I>,
    {
        self.exchange.group.all_reduce(values, op)
    }

    /// Whether a plan split any layer with this handle.
    pub fn has_split(&self) -> bool {
        !self
            .splits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    fn splits_by_id(&self) -> HashMap<String, ParamSplit> {
        self.splits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Each parameter of `model` (visit order): its split, `None` when replicated. Found by
    /// id the first time (the ids the plan split); by position after that, so a model whose
    /// ids changed (a loaded state takes the saved ids) still maps.
    pub(crate) fn splits_of<B: Backend, M: burn::module::Module<B>>(
        &self,
        model: &M,
    ) -> Vec<Option<ParamSplit>> {
        let ids = param_ids(model);
        let by_id = self.splits_by_id();
        let found: Vec<_> = ids.iter().map(|id| by_id.get(id).copied()).collect();
        let mut cached = self
            .positions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if found.iter().any(Option::is_some) {
            *cached = Some(found.clone());
            return found;
        }
        match cached.as_ref() {
            Some(positions) if positions.len() == ids.len() => positions.clone(),
            _ => found,
        }
    }

    /// The full values and shape of a split tensor from this rank's part (`values`, `shape`):
    /// one all-gather over the tp ranks; every rank calls it, in the same order.
    fn gather_values<I: Backend>(
        &self,
        split: ParamSplit,
        values: Tensor<I, 1>,
        shape: &[usize],
    ) -> Result<(Tensor<I, 1>, Vec<usize>), ParallelError>
    where
        G: ProcessGroup<I>,
    {
        let view = split.view(shape);
        let len = values.dims()[0];
        let all = self.exchange.all_gather(values);
        self.check()?;
        let parts = (0..self.size)
            .map(|r| all.clone().narrow(0, r * len, len).reshape(view))
            .collect();
        let full = split.join(parts);
        let mut full_shape = shape.to_vec();
        full_shape[split.dim] *= self.size;
        Ok((full.reshape([len * self.size]), full_shape))
    }

    /// This rank's part of a full tensor (`values`, `shape`).
    fn part_values<I: Backend>(
        &self,
        split: ParamSplit,
        values: Tensor<I, 1>,
        shape: &[usize],
    ) -> Result<(Tensor<I, 1>, Vec<usize>), ParallelError> {
        if !shape[split.dim].is_multiple_of(split.chunks * self.size) {
            return Err(ParallelError::Record(format!(
                "a tensor of shape {shape:?} does not split over {} tp ranks in {} blocks along \
                 dimension {}",
                self.size, split.chunks, split.dim
            )));
        }
        let part = split.part(values.reshape(split.view(shape)), self.rank, self.size);
        let mut part_shape = shape.to_vec();
        part_shape[split.dim] /= self.size;
        let len = part_shape.iter().product::<usize>();
        Ok((part.reshape([len]), part_shape))
    }

    /// The whole model from this rank's split one: every split parameter gathered from the tp
    /// ranks (ids kept; split layers run whole again). Every tp rank calls it.
    pub fn full_model<B, M>(&self, model: &M) -> Result<M, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        G: ProcessGroup<Inner<B>>,
    {
        let splits = self.splits_of(model);
        self.map_split(model.clone(), splits, |split, values, shape| {
            self.gather_values(split, values, shape)
        })
    }

    /// This rank's split model from a whole one holding the same parameter ids (a loaded full
    /// state): local slicing, no communication.
    pub fn shard_model<B, M>(&self, full: M) -> Result<M, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        let splits = self.splits_of(&full);
        self.map_split(full, splits, |split, values, shape| {
            self.part_values(split, values, shape)
        })
    }

    /// `model` with every split parameter replaced by `f(split, values, shape)`.
    fn map_split<B, M>(
        &self,
        model: M,
        splits: Vec<Option<ParamSplit>>,
        f: impl FnMut(
            ParamSplit,
            Tensor<Inner<B>, 1>,
            &[usize],
        ) -> Result<(Tensor<Inner<B>, 1>, Vec<usize>), ParallelError>,
    ) -> Result<M, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        struct Mapper<F> {
            splits: std::vec::IntoIter<Option<ParamSplit>>,
            f: F,
            error: Option<ParallelError>,
        }
        impl<B, F> ModuleMapper<B> for Mapper<F>
        where
            B: AutodiffBackend,
            F: FnMut(
                ParamSplit,
                Tensor<Inner<B>, 1>,
                &[usize],
            ) -> Result<(Tensor<Inner<B>, 1>, Vec<usize>), ParallelError>,
        {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<B, D>>,
            ) -> Param<Tensor<B, D>> {
                let (id, value, mapper) = param.consume();
                let Some(Some(split)) = self.splits.next() else {
                    return Param::from_mapped_value(id, value, mapper);
                };
                let (dtype, shape, device) = (value.dtype(), value.dims(), value.device());
                let require_grad = value.is_require_grad();
                let flat = value.inner().reshape([shape.iter().product::<usize>()]);
                match (self.f)(split, flat, &shape) {
                    Ok((values, new_shape)) => {
                        let dims: [usize; D] = std::array::from_fn(|i| new_shape[i]);
                        let leaf = Tensor::from_inner(values.reshape(dims).cast(dtype))
                            .set_require_grad(require_grad);
                        Param::from_mapped_value(id, leaf, mapper)
                    }
                    Err(e) => {
                        self.error.get_or_insert(e);
                        let leaf = Tensor::zeros(shape, &device);
                        Param::from_mapped_value(id, leaf, mapper)
                    }
                }
            }
        }
        let mut mapper = Mapper {
            splits: splits.into_iter(),
            f,
            error: None,
        };
        let model = model.map(&mut mapper);
        match mapper.error {
            Some(e) => Err(e),
            None => Ok(model),
        }
    }

    /// `record` (this rank's optimizer state for `model`'s parameters) with the state of
    /// every split parameter gathered to its full shape. Every tp rank calls it.
    pub fn gather_optimizer_record<B, M>(
        &self,
        model: &M,
        record: OptimizerRecord,
        device: &B::Device,
    ) -> Result<OptimizerRecord, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        G: ProcessGroup<Inner<B>>,
    {
        let (splits, positions) = (self.splits_of(model), crate::param_positions(model));
        record.check_params(&positions)?;
        record.map_tensors(&positions, |position, values, shape| {
            match splits[position] {
                Some(split) if shape.len() > split.dim => {
                    let local = Tensor::<Inner<B>, 1>::from_floats(values.as_slice(), device);
                    let (full, shape) = self.gather_values(split, local, &shape)?;
                    Ok((to_vec(full)?, shape))
                }
                _ => Ok((values, shape)),
            }
        })
    }

    /// This rank's optimizer record from a full one, for `full` (the whole model holding the
    /// record's parameter ids).
    pub fn shard_optimizer_record<B, M>(
        &self,
        full: &M,
        record: OptimizerRecord,
    ) -> Result<OptimizerRecord, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        let splits = self.splits_of(full);
        let device = Default::default();
        record.map_tensors(
            &crate::param_positions(full),
            |position, values, shape| match splits[position] {
                Some(split) if shape.len() > split.dim => {
                    let full = Tensor::<Inner<B>, 1>::from_floats(values.as_slice(), &device);
                    let (part, shape) = self.part_values(split, full, &shape)?;
                    Ok((to_vec(part)?, shape))
                }
                _ => Ok((values, shape)),
            },
        )
    }

    /// The squared L2 norm of the split parameters' gradients in `grads` (this rank's parts):
    /// what the tp ranks sum, while the replicated parameters, whose gradients every tp rank
    /// holds alike, count once.
    pub fn split_squared_norm<B, M>(&self, model: &M, grads: &GradientsParams) -> f64
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        struct Norm<'a> {
            splits: std::vec::IntoIter<Option<ParamSplit>>,
            grads: &'a GradientsParams,
            sum: f64,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Norm<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if let Some(Some(_)) = self.splits.next()
                    && let Some(grad) = self.grads.get::<Inner<B>, D>(param.id)
                {
                    let grad = grad.cast(DType::F32);
                    let squares = (grad.clone() * grad).sum().into_scalar();
                    self.sum += burn::tensor::ElementConversion::elem::<f64>(squares);
                }
            }
        }
        let mut norm = Norm {
            splits: self.splits_of(model).into_iter(),
            grads,
            sum: 0.0,
        };
        model.visit(&mut norm);
        norm.sum
    }
}

/// A tensor's values as f32.
fn to_vec<I: Backend>(tensor: Tensor<I, 1>) -> Result<Vec<f32>, ParallelError> {
    let data: TensorData = tensor.cast(DType::F32).into_data();
    data.into_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("reading values: {e:?}")))
}
