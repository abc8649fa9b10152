//! [`ShardLayout`]: which unit each parameter belongs to and which piece of it each rank keeps.
//!
//! Every float parameter is flattened, padded with zeros to a multiple of the world size and
//! cut into `world_size` equal chunks; rank `r` keeps chunk `r` (PyTorch FSDP2's per-parameter
//! sharding, on the flattened tensor). A unit's local buffer is its parameters' chunks one after
//! the other, so gathering a unit is one all-gather of that buffer.

use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use super::AutoWrapPolicy;

/// One float parameter of the sharded model.
#[derive(Debug, Clone)]
pub(crate) struct ParamSlot {
    /// Full shape.
    pub(crate) shape: Vec<usize>,
    /// Elements of the full parameter.
    pub(crate) numel: usize,
    /// Elements each rank keeps (`ceil(numel / world)`).
    pub(crate) chunk: usize,
    /// The unit it belongs to.
    pub(crate) unit: usize,
    /// Where its chunk starts in the unit's local buffer.
    pub(crate) offset: usize,
    pub(crate) dtype: DType,
}

/// A group of parameters gathered together.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// Module path of the unit ("" for the root unit).
    pub(crate) path: String,
    /// Indices into the layout's slots, in visit order.
    pub(crate) slots: Vec<usize>,
    /// Length of the unit's local buffer on every rank.
    pub(crate) local_len: usize,
}

/// How a model's parameters are split into units and shards (built once, at setup).
#[derive(Debug, Clone)]
pub struct ShardLayout {
    pub(crate) world: usize,
    pub(crate) rank: usize,
    pub(crate) slots: Vec<ParamSlot>,
    pub(crate) units: Vec<Unit>,
}

impl ShardLayout {
    /// The layout of `model` (every parameter initialised, full shapes) for `rank` of `world`.
    pub fn new<B: Backend, M: Module<B>>(
        model: &M,
        policy: &AutoWrapPolicy,
        rank: usize,
        world: usize,
    ) -> Self {
        let mut walk = Walk::default();
        model.visit(&mut walk);
        let keys = unit_keys(&walk.params, policy);

        let mut units: Vec<Unit> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut slots = Vec::with_capacity(walk.params.len());
        for (found, key) in walk.params.into_iter().zip(keys) {
            let unit = *index.entry(key.clone()).or_insert_with(|| {
                units.push(Unit {
                    path: key,
                    slots: Vec::new(),
                    local_len: 0,
                });
                units.len() - 1
            });
            let numel = found.shape.iter().product::<usize>();
            let chunk = numel.div_ceil(world);
            units[unit].slots.push(slots.len());
            slots.push(ParamSlot {
                shape: found.shape,
                numel,
                chunk,
                unit,
                offset: units[unit].local_len,
                dtype: found.dtype,
            });
            units[unit].local_len += chunk;
        }
        Self {
            world,
            rank,
            slots,
            units,
        }
    }

    /// The unit of each float parameter of `model` under `policy` (visit order; units numbered
    /// in the order of their first parameter), for grouping parameters as FSDP would (e.g.
    /// Streaming DiLoCo's fragments). Errors when a module type `policy` names is not in the
    /// model (it would silently group nothing), listing the model's module types.
    pub fn units_of<B: Backend, M: Module<B>>(
        model: &M,
        policy: &AutoWrapPolicy,
        field: &'static str,
    ) -> Result<Vec<usize>, crate::ParallelError> {
        check_module_names(model, policy, field)?;
        let layout = Self::new(model, policy, 0, 1);
        Ok(layout.slots.iter().map(|s| s.unit).collect())
    }

    /// The units' module paths, in the order of their first parameter ("" is the root unit).
    pub fn unit_paths(&self) -> Vec<&str> {
        self.units.iter().map(|u| u.path.as_str()).collect()
    }

    /// Parameter elements of the whole model.
    pub fn full_elements(&self) -> usize {
        self.slots.iter().map(|s| s.numel).sum()
    }

    /// Parameter elements this rank keeps (its chunks, padding included).
    pub fn local_elements(&self) -> usize {
        self.slots.iter().map(|s| s.chunk).sum()
    }

    pub(crate) fn slot(&self, index: usize) -> Result<&ParamSlot, crate::ParallelError> {
        self.slots
            .get(index)
            .ok_or_else(|| crate::ParallelError::Mismatch {
                rank: self.rank,
                reason: format!(
                    "parameter {index} does not exist: FSDP sharded {}",
                    self.slots.len()
                ),
            })
    }

    /// The number of ranks the layout shards over.
    pub fn world_size(&self) -> usize {
        self.world
    }
}

/// A parameter as the walk saw it.
struct Found {
    shape: Vec<usize>,
    dtype: DType,
    /// Module names from the root (the parameter's own field name last).
    path: Vec<String>,
    /// The struct type containing each path element ("Struct:Name", "Vec", ...).
    containers: Vec<String>,
}

/// Collects float parameters with their module paths.
#[derive(Default)]
struct Walk {
    stack: Vec<(String, String)>,
    params: Vec<Found>,
}

impl<B: Backend> ModuleVisitor<B> for Walk {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.stack
            .push((name.to_string(), container_type.to_string()));
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        self.params.push(Found {
            shape: value.dims().to_vec(),
            dtype: value.dtype(),
            path: self.stack.iter().map(|(n, _)| n.clone()).collect(),
            containers: self.stack.iter().map(|(_, c)| c.clone()).collect(),
        });
    }
}

/// Errors (naming `field`) when a module type of a `Modules` policy is no module type of
/// `model`: it would silently wrap nothing.
pub(crate) fn check_module_names<B: Backend, M: Module<B>>(
    model: &M,
    policy: &AutoWrapPolicy,
    field: &'static str,
) -> Result<(), crate::ParallelError> {
    let (unmatched, types) = unmatched_module_names(model, policy);
    if unmatched.is_empty() {
        return Ok(());
    }
    Err(crate::ParallelError::InvalidConfig {
        field,
        value: format!(
            "{} (no module of the model has this type; its module types: {})",
            unmatched.join(","),
            types.join(", ")
        ),
        expected: "module type names of the model, none, or size:<n>".into(),
    })
}

/// The names of an auto-wrap `Modules` policy that are no module type of `model` (each would
/// silently wrap nothing), and the model's module types (sorted) to name in an error.
fn unmatched_module_names<B: Backend, M: Module<B>>(
    model: &M,
    policy: &AutoWrapPolicy,
) -> (Vec<String>, Vec<String>) {
    let AutoWrapPolicy::Modules(names) = policy else {
        return (Vec::new(), Vec::new());
    };
    let mut walk = Walk::default();
    model.visit(&mut walk);
    let mut types: Vec<String> = walk
        .params
        .iter()
        .flat_map(|p| p.containers.iter())
        .filter_map(|c| c.strip_prefix("Struct:").map(str::to_string))
        .collect();
    types.sort();
    types.dedup();
    let unmatched = names
        .iter()
        .filter(|n| !types.contains(n))
        .cloned()
        .collect();
    (unmatched, types)
}

/// The unit (module path) of each parameter under `policy`.
fn unit_keys(params: &[Found], policy: &AutoWrapPolicy) -> Vec<String> {
    match policy {
        AutoWrapPolicy::None => vec![String::new(); params.len()],
        AutoWrapPolicy::Modules(names) => params
            .iter()
            .map(|p| {
                // The innermost enclosing struct of a listed type (nested listed modules are
                // units of their own): its fields are entered with container
                // "Struct:<type>", so the struct itself is the path before that.
                p.containers
                    .iter()
                    .rposition(|c| {
                        c.strip_prefix("Struct:")
                            .is_some_and(|t| names.iter().any(|n| n == t))
                    })
                    .map(|depth| p.path[..depth].join("."))
                    .unwrap_or_default()
            })
            .collect(),
        AutoWrapPolicy::Size(min) => size_based(params, *min),
    }
}

/// Deepest modules first: a module whose still-unassigned parameters reach `min` elements
/// becomes a unit; what is left belongs to the root.
fn size_based(params: &[Found], min: usize) -> Vec<String> {
    let numel = |p: &Found| p.shape.iter().product::<usize>();
    let mut modules: Vec<Vec<String>> = Vec::new();
    for p in params {
        for depth in 1..p.path.len() {
            let prefix = p.path[..depth].to_vec();
            if !modules.contains(&prefix) {
                modules.push(prefix);
            }
        }
    }
    // Stable sort: among modules of the same depth, visit order decides.
    modules.sort_by_key(|m| std::cmp::Reverse(m.len()));
    let mut keys: Vec<Option<String>> = vec![None; params.len()];
    for module in modules {
        let members: Vec<usize> = (0..params.len())
            .filter(|&i| keys[i].is_none() && params[i].path.starts_with(&module))
            .collect();
        let size: usize = members.iter().map(|&i| numel(&params[i])).sum();
        if size >= min {
            for i in members {
                keys[i] = Some(module.join("."));
            }
        }
    }
    keys.into_iter().map(Option::unwrap_or_default).collect()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};

    use super::*;

    #[derive(Module, Debug)]
    struct Mlp<B: Backend> {
        up: Linear<B>,
    }

    #[derive(Module, Debug)]
    struct Block<B: Backend> {
        attn: Linear<B>,
        mlp: Mlp<B>,
    }

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        blocks: Vec<Block<B>>,
        head: Linear<B>,
    }

    #[test]
    fn nested_listed_modules_are_units_of_their_own() {
        let device = Default::default();
        let linear = || LinearConfig::new(2, 2).init::<Flex>(&device);
        let net = Net {
            blocks: (0..2)
                .map(|_| Block {
                    attn: linear(),
                    mlp: Mlp { up: linear() },
                })
                .collect(),
            head: linear(),
        };
        let policy = "Block,Mlp".parse().unwrap();
        let layout = ShardLayout::new(&net, &policy, 0, 2);
        assert_eq!(
            layout.unit_paths(),
            ["blocks.0", "blocks.0.mlp", "blocks.1", "blocks.1.mlp", ""]
        );
        // Shards: every parameter split in 2 (2x2 weights, 2 biases), padded chunks included.
        assert_eq!(layout.full_elements(), 5 * 6);
        assert_eq!(layout.local_elements(), 5 * 3);
    }
}
