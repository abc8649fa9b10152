//! Moving parameters between their full form and their shards, and the lazy per-forward view.

use std::sync::{Arc, Mutex, PoisonError};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};

use afterburner_checkpoint::DerivedParams;

use super::gather::{self, Exchange};
use super::layout::{ParamSlot, ShardLayout};
use crate::{ParallelError, ProcessGroup};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A parameter flattened and zero-padded to `world * chunk` values.
fn padded<I: Backend, const D: usize>(
    value: Tensor<I, D>,
    slot: &ParamSlot,
    world: usize,
) -> Tensor<I, 1> {
    let flat = value.reshape([slot.numel]);
    let len = world * slot.chunk;
    if len == slot.numel {
        return flat;
    }
    let zeros = Tensor::<I, 1>::zeros([len - slot.numel], &flat.device()).cast(flat.dtype());
    Tensor::cat(vec![flat, zeros], 0)
}

/// The shape a shard is kept in: `[1, .., 1, chunk]`.
fn shard_dims<const D: usize>(chunk: usize) -> [usize; D] {
    let mut dims = [1; D];
    dims[D - 1] = chunk;
    dims
}

/// A parameter's values (flat, row-major) out of its unit's rank-major full buffer.
fn unpack<I: Backend>(full: Tensor<I, 1>, slot: &ParamSlot, layout: &ShardLayout) -> Tensor<I, 1> {
    let world = layout.world;
    let local_len = layout.units[slot.unit].local_len;
    full.reshape([world, local_len])
        .narrow(1, slot.offset, slot.chunk)
        .reshape([world * slot.chunk])
        .narrow(0, 0, slot.numel)
}

/// Walks parameters in visit order against the layout, keeping the first mismatch.
struct Cursor<'a> {
    layout: &'a ShardLayout,
    next: usize,
    error: Option<ParallelError>,
}

impl<'a> Cursor<'a> {
    fn new(layout: &'a ShardLayout) -> Self {
        Self {
            layout,
            next: 0,
            error: None,
        }
    }

    /// The next slot when `param` (`id` for messages) has its shape (full or shard form).
    fn advance(
        &mut self,
        id: burn::module::ParamId,
        dims: &[usize],
        sharded: bool,
    ) -> Option<&'a ParamSlot> {
        let index = self.next;
        self.next += 1;
        if self.error.is_some() {
            return None;
        }
        let layout = self.layout;
        let expected = layout.slots.get(index).map(|slot| {
            let dims: Vec<usize> = if sharded {
                shard_dims_vec(dims.len(), slot.chunk)
            } else {
                slot.shape.clone()
            };
            (slot, dims)
        });
        match expected {
            // Shapes, not `ParamId`s: loading a record gives parameters the saved ids.
            Some((slot, want)) if want == dims => Some(slot),
            _ => {
                self.error = Some(ParallelError::Mismatch {
                    rank: layout.rank,
                    reason: format!(
                        "parameter {index} ({id}, shape {dims:?}) is not the one FSDP sharded \
                         at setup: pass the model returned by setup/step"
                    ),
                });
                None
            }
        }
    }

    fn finish(self) -> Result<(), ParallelError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.next != self.layout.slots.len() {
            return Err(ParallelError::Mismatch {
                rank: self.layout.rank,
                reason: format!(
                    "the model has {} float parameters; FSDP sharded {} at setup",
                    self.next,
                    self.layout.slots.len()
                ),
            });
        }
        Ok(())
    }
}

fn shard_dims_vec(rank: usize, chunk: usize) -> Vec<usize> {
    let mut dims = vec![1; rank];
    if let Some(last) = dims.last_mut() {
        *last = chunk;
    }
    dims
}

/// Every float parameter of a full `model` replaced by this rank's chunk (a new leaf).
pub(crate) fn to_shards<B: AutodiffBackend, M: Module<B>>(
    model: M,
    layout: &ShardLayout,
) -> Result<M, ParallelError> {
    struct ToShards<'a>(Cursor<'a>);
    impl<B: AutodiffBackend> ModuleMapper<B> for ToShards<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            let Some(slot) = self.0.advance(id, &value.dims(), false) else {
                return Param::from_mapped_value(id, value, mapper);
            };
            let layout = self.0.layout;
            let require_grad = value.is_require_grad();
            let chunk = padded(value.inner(), slot, layout.world)
                .narrow(0, layout.rank * slot.chunk, slot.chunk)
                .reshape(shard_dims::<D>(slot.chunk));
            let leaf = Tensor::from_inner(chunk).set_require_grad(require_grad);
            Param::from_mapped_value(id, leaf, mapper)
        }
    }
    let mut mapper = ToShards(Cursor::new(layout));
    let model = model.map(&mut mapper);
    mapper.0.finish()?;
    Ok(model)
}

/// Each unit's rank-major full buffer (f32) from a full model, without communication.
pub(crate) fn replicated_buffers<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    layout: &ShardLayout,
) -> Vec<Tensor<Inner<B>, 1>> {
    struct Rows<'a, B: AutodiffBackend> {
        layout: &'a ShardLayout,
        next: usize,
        rows: Vec<Vec<Tensor<Inner<B>, 2>>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Rows<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(slot) = self.layout.slots.get(self.next) else {
                return;
            };
            self.next += 1;
            let world = self.layout.world;
            let value = param.val().inner().cast(DType::F32);
            let rows = padded(value, slot, world).reshape([world, slot.chunk]);
            self.rows[slot.unit].push(rows);
        }
    }
    let mut rows = Rows::<B> {
        layout,
        next: 0,
        rows: vec![Vec::new(); layout.units.len()],
    };
    model.visit(&mut rows);
    rows.rows
        .into_iter()
        .zip(&layout.units)
        .map(|(parts, unit)| Tensor::cat(parts, 1).reshape([layout.world * unit.local_len]))
        .collect()
}

/// Each unit's local buffer (this rank's chunks, in unit order) from a sharded model.
pub(crate) fn local_buffers<B: AutodiffBackend, M: Module<B>>(
    sharded: &M,
    layout: &ShardLayout,
) -> Result<Vec<Tensor<Inner<B>, 1>>, ParallelError> {
    struct Parts<'a, B: AutodiffBackend> {
        cursor: Cursor<'a>,
        parts: Vec<Vec<Tensor<Inner<B>, 1>>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Parts<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if let Some(slot) = self.cursor.advance(param.id, &value.dims(), true) {
                self.parts[slot.unit].push(value.inner().reshape([slot.chunk]));
            }
        }
    }
    let mut parts = Parts::<B> {
        cursor: Cursor::new(layout),
        parts: vec![Vec::new(); layout.units.len()],
    };
    sharded.visit(&mut parts);
    parts.cursor.finish()?;
    Ok(parts.parts.into_iter().map(|p| Tensor::cat(p, 0)).collect())
}

/// The sharded model with full parameters taken from each unit's full buffer (new leaves).
pub(crate) fn from_buffers<B: AutodiffBackend, M: Module<B>>(
    sharded: M,
    layout: &ShardLayout,
    buffers: Vec<Tensor<Inner<B>, 1>>,
) -> Result<M, ParallelError> {
    struct Fill<'a, B: AutodiffBackend> {
        cursor: Cursor<'a>,
        buffers: Vec<Tensor<Inner<B>, 1>>,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Fill<'_, B> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            let Some(slot) = self.cursor.advance(id, &value.dims(), true) else {
                return Param::from_mapped_value(id, value, mapper);
            };
            let full = unpack(self.buffers[slot.unit].clone(), slot, self.cursor.layout)
                .reshape(Shape::from(slot.shape.clone()))
                .cast(slot.dtype);
            let leaf = Tensor::from_inner(full).set_require_grad(value.is_require_grad());
            Param::from_mapped_value(id, leaf, mapper)
        }
    }
    let mut fill = Fill::<B> {
        cursor: Cursor::new(layout),
        buffers,
    };
    let model = sharded.map(&mut fill);
    fill.cursor.finish()?;
    Ok(model)
}

/// One unit of a view: its shard tensors, collected while the view is built, and its full
/// buffer once the forward pass first needs it.
struct UnitCell<B: AutodiffBackend, G> {
    unit: usize,
    layout: Arc<ShardLayout>,
    parts: Mutex<Vec<Tensor<B, 1>>>,
    replicated: Mutex<Option<Tensor<Inner<B>, 1>>>,
    /// The unit's full parameters once built (the gathered buffer itself is not kept).
    built: Mutex<Option<Vec<FloatTensor<B>>>>,
    exchange: Exchange<G>,
    compute: Option<DType>,
}

impl<B: AutodiffBackend, G: ProcessGroup<Inner<B>> + 'static> UnitCell<B, G> {
    /// The unit's parameter at `position`, gathering the whole unit on the first call.
    fn param(&self, position: usize) -> FloatTensor<B> {
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        let params = built.get_or_insert_with(|| {
            let parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
            let parts = parts.iter().map(|p| p.clone().into_primitive().tensor());
            let replicated = self
                .replicated
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            build_unit::<B, G>(
                parts.collect(),
                self.unit,
                &self.layout,
                &self.exchange,
                replicated,
                self.compute,
            )
        });
        params[position].clone()
    }
}

/// The unit `unit`'s full parameters from its shard tensors (the unit's [`DerivedParams`]).
fn build_unit<B, G>(
    parts: Vec<FloatTensor<B>>,
    unit: usize,
    layout: &ShardLayout,
    exchange: &Exchange<G>,
    replicated: Option<Tensor<Inner<B>, 1>>,
    compute: Option<DType>,
) -> Vec<FloatTensor<B>>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
{
    let parts = parts
        .into_iter()
        .map(|p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p)))
        .collect();
    let full = gather::gather(Tensor::cat(parts, 0), unit, replicated, exchange);
    layout.units[unit]
        .slots
        .iter()
        .map(|&index| {
            let slot = &layout.slots[index];
            let flat = unpack(full.clone(), slot, layout);
            let flat = match compute {
                Some(dtype) => flat.cast(dtype),
                None => flat,
            };
            B::float_reshape(
                flat.into_primitive().tensor(),
                Shape::from(slot.shape.clone()),
            )
        })
        .collect()
}

/// The sharded model with lazy full parameters (see [`Fsdp::view`](super::Fsdp::view)), and
/// each unit as [`DerivedParams`] (its shards and how to gather them).
pub(crate) fn lazy_view<B, G, M>(
    sharded: &M,
    layout: &Arc<ShardLayout>,
    exchange: &Exchange<G>,
    replicated: Option<Vec<Tensor<Inner<B>, 1>>>,
    compute: Option<DType>,
) -> Result<(M, Vec<DerivedParams<B>>), ParallelError>
where
    B: AutodiffBackend,
    G: ProcessGroup<Inner<B>> + 'static,
    M: Module<B>,
{
    struct Lazy<'a, B: AutodiffBackend, G> {
        cursor: Cursor<'a>,
        cells: Vec<Arc<UnitCell<B, G>>>,
        ids: Vec<Vec<ParamId>>,
    }
    impl<B, G> ModuleMapper<B> for Lazy<'_, B, G>
    where
        B: AutodiffBackend,
        G: ProcessGroup<Inner<B>> + 'static,
    {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            let Some(slot) = self.cursor.advance(id, &value.dims(), true) else {
                return Param::from_mapped_value(id, value, mapper);
            };
            let require_grad = value.is_require_grad();
            let device = value.device();
            let cell = self.cells[slot.unit].clone();
            // A leaf of its own (the same values), not the parameter: the unit's gradient
            // reaches the shard parameters after backward (`add_view_grads`), so that any
            // gradient a parameter gets in the graph is the loss reading it outside the view.
            let part = value.clone().inner().reshape([slot.chunk]);
            let tracked = value.is_require_grad();
            cell.parts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Tensor::from_inner(part).set_require_grad(tracked));
            let position = self.ids[slot.unit].len();
            self.ids[slot.unit].push(id);
            let shape = Shape::from(slot.shape.clone());
            Param::uninitialized(
                id,
                move |_, _| Tensor::from_primitive(TensorPrimitive::Float(cell.param(position))),
                device,
                require_grad,
                shape,
            )
        }
    }
    let cells = (0..layout.units.len())
        .map(|unit| {
            Arc::new(UnitCell {
                unit,
                layout: layout.clone(),
                parts: Mutex::new(Vec::new()),
                replicated: Mutex::new(replicated.as_ref().and_then(|r| r.get(unit).cloned())),
                built: Mutex::new(None),
                exchange: exchange.clone(),
                compute,
            })
        })
        .collect();
    let mut lazy = Lazy {
        cursor: Cursor::new(layout),
        cells,
        ids: vec![Vec::new(); layout.units.len()],
    };
    let view = sharded.clone().map(&mut lazy);
    lazy.cursor.finish()?;
    let units = lazy
        .ids
        .into_iter()
        .enumerate()
        .map(|(unit, ids)| {
            let sources = lazy.cells[unit]
                .parts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .map(|t| t.clone().into_primitive().tensor())
                .collect();
            let (layout, exchange) = (layout.clone(), exchange.clone());
            let replicated = replicated.as_ref().and_then(|r| r.get(unit).cloned());
            let replicated = Mutex::new(replicated);
            let build = move |parts: Vec<FloatTensor<B>>| {
                let replicated = replicated
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                build_unit::<B, G>(parts, unit, &layout, &exchange, replicated, compute)
            };
            DerivedParams {
                ids,
                sources,
                build: Arc::new(build),
            }
        })
        .collect();
    Ok((view, units))
}

/// The first float parameter of a sharded `model` that has a gradient in `grads` (before
/// [`add_view_grads`]: one the loss reached outside the view).
pub(crate) fn reached_outside_view<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Option<ParamId> {
    struct Find<'a>(&'a GradientsParams, Option<ParamId>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Find<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.1.is_none() && self.0.get::<Inner<B>, D>(param.id).is_some() {
                self.1 = Some(param.id);
            }
        }
    }
    let mut find = Find(grads, None);
    model.visit(&mut find);
    find.1
}

/// Gives every shard parameter of `model` its piece of its unit's gradient (`units`, as the
/// gather nodes kept them), registered in `grads` under the parameter's id.
pub(crate) fn add_view_grads<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    layout: &ShardLayout,
    units: Vec<Option<Tensor<Inner<B>, 1>>>,
    grads: &mut GradientsParams,
) -> Result<(), ParallelError> {
    struct Give<'a, B: AutodiffBackend> {
        cursor: Cursor<'a>,
        units: Vec<Option<Tensor<Inner<B>, 1>>>,
        grads: &'a mut GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Give<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let Some(slot) = self.cursor.advance(param.id, &value.dims(), true) else {
                return;
            };
            if !value.is_require_grad() {
                return;
            }
            let Some(Some(unit)) = self.units.get(slot.unit) else {
                return;
            };
            let grad = unit
                .clone()
                .narrow(0, slot.offset, slot.chunk)
                .reshape(shard_dims::<D>(slot.chunk));
            self.grads.register::<Inner<B>, D>(param.id, grad);
        }
    }
    let mut give = Give::<B> {
        cursor: Cursor::new(layout),
        units,
        grads,
    };
    model.visit(&mut give);
    give.cursor.finish()
}
