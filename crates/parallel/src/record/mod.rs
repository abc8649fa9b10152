//! [`OptimizerRecord`]: an optimizer's saved state without the optimizer's type, so a strategy
//! can rewrite it: how a sharded FSDP optimizer state becomes a full one and back, how
//! ZeRO-1's per-rank states merge into one and split again, how Local SGD averages them.
//!
//! An optimizer record is a map from `ParamId` to that parameter's state; each tensor in it is
//! a `TensorData` map (`bytes`, `shape`, `dtype`). Element-wise optimizers (SGD, Adam, AdamW,
//! RMSprop, AdaGrad) keep state tensors shaped like their parameter, so each can be gathered
//! or sharded like the parameter itself.

mod merge;
mod tensors;

use std::collections::HashMap;

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use rmpv::Value;

pub use merge::{join_param_shards, mean_param_states, merge_param_states};
use tensors::{field_mut, visit_tensors};

use crate::ParallelError;

/// A model's parameters by id (as optimizer records name them) with their position in the
/// model's visit order: how records of ranks whose ids differ are paired
/// ([`param_positions`](crate::param_positions)).
pub type ParamPositions = HashMap<String, usize>;

/// The codec of optimizer records: Burn's named MessagePack at full precision (what state
/// files hold).
type Codec = NamedMpkBytesRecorder<FullPrecisionSettings>;

fn bad(what: &str) -> ParallelError {
    ParallelError::Record(format!("optimizer record: {what}"))
}

/// An optimizer's state, whatever the optimizer: for each parameter (by id) its state tensors,
/// in the optimizer record's own structure. Built from an optimizer ([`of`](Self::of)) or a
/// state file's bytes ([`from_bytes`](Self::from_bytes)), rewritten tensor by tensor, and loaded
/// back ([`load_into`](Self::load_into)).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerRecord {
    value: Value,
}

impl OptimizerRecord {
    /// `optimizer`'s state.
    pub fn of<B, M, O>(optimizer: &O) -> Result<Self, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let bytes = Recorder::<B>::record(&Codec::default(), optimizer.to_record(), ())
            .map_err(|e| bad(&format!("encoding: {e}")))?;
        Self::from_bytes(&bytes)
    }

    /// `optimizer` with this state loaded (on `device`).
    pub fn load_into<B, M, O>(&self, optimizer: O, device: &B::Device) -> Result<O, ParallelError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let record = Recorder::<B>::load(&Codec::default(), self.to_bytes()?, device)
            .map_err(|e| bad(&format!("decoding: {e}")))?;
        Ok(optimizer.load_record(record))
    }

    /// The record a state file holds (Burn's named MessagePack at full precision). Errors on
    /// bytes that are not an optimizer record.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ParallelError> {
        let mut value =
            rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| bad(&e.to_string()))?;
        param_map(&mut value)?;
        Ok(Self { value })
    }

    /// The bytes a state file holds.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ParallelError> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &self.value).map_err(|e| bad(&e.to_string()))?;
        Ok(out)
    }

    /// How many parameters the record holds state for.
    pub fn param_count(&self) -> usize {
        match self
            .value
            .as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("item")))
        {
            Some((_, Value::Map(params))) => params.len(),
            _ => 0,
        }
    }

    /// The ids of the parameters the record holds state for, sorted (the record's own order
    /// is a hash map's).
    pub fn param_ids(&self) -> Vec<String> {
        let mut value = self.value.clone();
        let mut ids: Vec<String> = param_map(&mut value)
            .map(|params| {
                params
                    .iter()
                    .filter_map(|(key, _)| key.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// Errors unless every parameter the record holds state for is in `index` (to check
    /// before starting collectives that [`map_tensors`](Self::map_tensors) would leave half
    /// done).
    pub fn check_params(&self, index: &ParamPositions) -> Result<(), ParallelError> {
        let mut value = self.value.clone();
        positions(param_map(&mut value)?, index).map(|_| ())
    }

    /// Calls `f(position, values, shape)` for every state tensor, `position` being its
    /// parameter's place in the model as `index` gives it, parameters in that order (the same
    /// on every rank, whose `ParamId`s may differ), and puts back the values and shape `f`
    /// returns (in the tensor's own dtype). Errors on ids `index` lacks (check with
    /// [`check_params`](Self::check_params) first where an error must not leave a collective
    /// half done).
    pub fn map_tensors(
        mut self,
        index: &ParamPositions,
        mut f: impl FnMut(usize, Vec<f32>, Vec<usize>) -> Result<(Vec<f32>, Vec<usize>), ParallelError>,
    ) -> Result<Self, ParallelError> {
        let params = param_map(&mut self.value)?;
        for (position, i) in positions(params, index)? {
            visit_tensors(&mut params[i].1, &mut |values, shape| {
                f(position, values, shape)
            })?;
        }
        Ok(self)
    }

    /// The record keeping only the states of parameters whose position (by `index`) `keep`
    /// accepts.
    pub fn retain(
        mut self,
        index: &ParamPositions,
        keep: impl Fn(usize) -> bool,
    ) -> Result<Self, ParallelError> {
        let params = param_map(&mut self.value)?;
        let kept: Vec<usize> = positions(params, index)?
            .into_iter()
            .filter(|(position, _)| keep(*position))
            .map(|(_, entry)| entry)
            .collect();
        let mut entries: Vec<Option<(Value, Value)>> = params.drain(..).map(Some).collect();
        *params = kept.into_iter().filter_map(|i| entries[i].take()).collect();
        Ok(self)
    }

    /// Every state tensor's values, parameters in position order (tests and checks).
    pub fn values(self, index: &ParamPositions) -> Result<Vec<f32>, ParallelError> {
        let mut all = Vec::new();
        self.map_tensors(index, |_, values, shape| {
            all.extend_from_slice(&values);
            Ok((values, shape))
        })?;
        Ok(all)
    }

    /// The record with its parameter map replaced by `params` (id, state).
    fn with_params(mut self, params: Vec<(Value, Value)>) -> Self {
        if let Some(item) = field_mut(&mut self.value, "item") {
            *item = Value::Map(params);
        }
        self
    }
}

/// `(position in the model, entry)` for every entry of the record's parameter map, sorted.
fn positions(
    params: &[(Value, Value)],
    index: &ParamPositions,
) -> Result<Vec<(usize, usize)>, ParallelError> {
    let mut order = Vec::with_capacity(params.len());
    for (entry, (key, _)) in params.iter().enumerate() {
        let id = key
            .as_str()
            .ok_or_else(|| bad("a parameter id is not a string"))?;
        let position = index.get(id).ok_or_else(|| {
            bad(&format!(
                "state for parameter {id}, which the model does not have"
            ))
        })?;
        order.push((*position, entry));
    }
    order.sort_unstable();
    Ok(order)
}

/// A record's map from parameter id to state.
fn param_map(record: &mut Value) -> Result<&mut Vec<(Value, Value)>, ParallelError> {
    match field_mut(record, "item") {
        Some(Value::Map(params)) => Ok(params),
        _ => Err(bad("the item is not a map from parameter id to state")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record in Burn's named MessagePack form holding, for each (id, values), one state
    /// tensor.
    pub(crate) fn record(params: &[(&str, &[f32])]) -> OptimizerRecord {
        let tensor = |values: &[f32]| {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            Value::Map(vec![
                (Value::from("bytes"), Value::Binary(bytes)),
                (
                    Value::from("shape"),
                    Value::Array(vec![Value::from(values.len() as u64)]),
                ),
                (Value::from("dtype"), Value::from("F32")),
            ])
        };
        let item = params
            .iter()
            .map(|(id, values)| {
                let state = Value::Map(vec![(Value::from("moment"), tensor(values))]);
                (Value::from(*id), state)
            })
            .collect();
        OptimizerRecord {
            value: Value::Map(vec![(Value::from("item"), Value::Map(item))]),
        }
    }

    /// `ids` by position.
    pub(crate) fn index(ids: &[&str]) -> ParamPositions {
        ids.iter()
            .enumerate()
            .map(|(i, id)| (id.to_string(), i))
            .collect()
    }

    #[test]
    fn a_record_round_trips_through_bytes_and_refuses_what_is_not_one() {
        let rec = record(&[("a", &[1.0, 2.0]), ("b", &[3.0])]);
        let back = OptimizerRecord::from_bytes(&rec.to_bytes().unwrap()).unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.param_count(), 2);
        let not_a_record = rmpv::Value::from("hello");
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &not_a_record).unwrap();
        let err = OptimizerRecord::from_bytes(&bytes).unwrap_err().to_string();
        assert!(err.contains("not a map from parameter id"), "{err}");
        assert!(OptimizerRecord::from_bytes(&[0xc1]).is_err());
    }

    #[test]
    fn retain_keeps_the_chosen_positions_and_map_orders_by_position() {
        let rec = record(&[("b", &[3.0]), ("a", &[1.0, 2.0])]);
        let index = index(&["a", "b"]);
        assert_eq!(rec.clone().values(&index).unwrap(), vec![1.0, 2.0, 3.0]);
        let kept = rec.clone().retain(&index, |p| p == 1).unwrap();
        assert_eq!(kept.values(&index).unwrap(), vec![3.0]);
        let err = rec.check_params(&super::tests::index(&["a"])).unwrap_err();
        assert!(err.to_string().contains("parameter b"), "{err}");
    }
}
