//! Rewriting an encoded optimizer record (Burn's named MessagePack) without knowing the
//! optimizer's type: how a sharded FSDP optimizer state becomes a full one and back, and how
//! ZeRO-1's per-rank states merge into one and split again.
//!
//! An optimizer record is a map from `ParamId` to that parameter's state; each tensor in it is
//! a `TensorData` map (`bytes`, `shape`, `dtype`). Element-wise optimizers (SGD, Adam, AdamW,
//! RMSprop, AdaGrad) keep state tensors shaped like their parameter, so each can be gathered
//! or sharded like the parameter itself.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor, TensorData};
use rmpv::Value;

use crate::{ParallelError, ProcessGroup, ReduceOp};

fn bad(what: &str) -> ParallelError {
    ParallelError::Record(format!("optimizer record: {what}"))
}

/// Errors unless every parameter the record in `bytes` holds state for is in `index` (to
/// check before starting collectives that [`map_state_tensors`] would leave half done).
pub(crate) fn check_param_ids(
    bytes: &[u8],
    index: &HashMap<String, usize>,
) -> Result<(), ParallelError> {
    let mut record = decode(bytes)?;
    positions(param_map(&mut record)?, index).map(|_| ())
}

/// `(position in the model, entry)` for every entry of the record's parameter map, sorted.
fn positions(
    params: &[(Value, Value)],
    index: &HashMap<String, usize>,
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

/// Calls `f(position, values)` for every tensor of the record in `bytes`, `position` being
/// its parameter's place in the model as `index` gives it, parameters in that order (the same
/// on every rank, whose `ParamId`s may differ), and puts back the values and shape `f` returns
/// (in the tensor's own dtype). Errors on bytes that are not such a record and on ids `index`
/// lacks (check with [`check_param_ids`] first where an error must not leave a collective half
/// done).
pub(crate) fn map_state_tensors(
    bytes: &[u8],
    index: &HashMap<String, usize>,
    mut f: impl FnMut(usize, Vec<f32>) -> Result<(Vec<f32>, Vec<usize>), ParallelError>,
) -> Result<Vec<u8>, ParallelError> {
    map_tensors(bytes, index, |position, values, _| f(position, values))
}

/// Calls `f(position, values, shape)` for every state tensor, parameters in position order,
/// and puts back what it returns.
fn map_tensors(
    bytes: &[u8],
    index: &HashMap<String, usize>,
    mut f: impl FnMut(usize, Vec<f32>, Vec<usize>) -> Result<(Vec<f32>, Vec<usize>), ParallelError>,
) -> Result<Vec<u8>, ParallelError> {
    let mut record = decode(bytes)?;
    let params = param_map(&mut record)?;
    for (position, i) in positions(params, index)? {
        visit_tensors(&mut params[i].1, &mut |values, shape| {
            f(position, values, shape)
        })?;
    }
    encode_value(&record)
}

/// A record's bytes, decoded.
fn decode(bytes: &[u8]) -> Result<Value, ParallelError> {
    rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| bad(&e.to_string()))
}

/// A record's map from parameter id to state.
fn param_map(record: &mut Value) -> Result<&mut Vec<(Value, Value)>, ParallelError> {
    match field_mut(record, "item") {
        Some(Value::Map(params)) => Ok(params),
        _ => Err(bad("the item is not a map from parameter id to state")),
    }
}

/// One record holding every parameter state of `records` (each the encoded record of one
/// rank's optimizer, with the map from its model's parameter ids to their positions), keyed by
/// `ids`, the ids by position of the model it will load into; otherwise in the first record's
/// form. Errors on bytes that are not such records, on an id its model lacks, and on a
/// parameter two records hold state for (parts of different saves).
pub fn merge_param_states(
    records: &[(Vec<u8>, HashMap<String, usize>)],
    ids: &[String],
) -> Result<Vec<u8>, ParallelError> {
    let mut merged: Vec<Option<Value>> = vec![None; ids.len()];
    let mut base = None;
    for (bytes, index) in records {
        let mut record = decode(bytes)?;
        let params = param_map(&mut record)?;
        for (position, entry) in positions(params, index)? {
            let slot = merged
                .get_mut(position)
                .ok_or_else(|| bad(&format!("parameter {position} is beyond the model")))?;
            if slot.is_some() {
                return Err(bad(&format!(
                    "two ranks hold state for parameter {position} (parts of different saves?)"
                )));
            }
            *slot = Some(std::mem::replace(&mut params[entry].1, Value::Nil));
        }
        base.get_or_insert(record);
    }
    let mut record = base.ok_or_else(|| bad("no record to merge"))?;
    let params = merged
        .into_iter()
        .zip(ids)
        .filter_map(|(state, id)| Some((Value::from(id.as_str()), state?)))
        .collect();
    if let Some(item) = field_mut(&mut record, "item") {
        *item = Value::Map(params);
    }
    encode_value(&record)
}

/// One record from the records of ranks that each held a chunk of every parameter's state
/// (FSDP's shards: `records[k]`, rank k's, with its model's id-to-position map): each state
/// tensor is the ranks' chunks joined in rank order, cut to `numels[p]` values and shaped
/// `shapes[p]`, keyed by `ids`; otherwise in the first record's form.
pub(crate) fn join_param_shards(
    records: &[(Vec<u8>, HashMap<String, usize>)],
    ids: &[String],
    numels: &[usize],
    shapes: &[Vec<usize>],
) -> Result<Vec<u8>, ParallelError> {
    // Every rank's state tensors, by parameter position, in the entry's own order.
    let mut chunks: Vec<Vec<Vec<Vec<f32>>>> = vec![Vec::new(); ids.len()];
    let mut entries: Vec<Option<Value>> = vec![None; ids.len()];
    let mut base = None;
    for (bytes, index) in records {
        let mut record = decode(bytes)?;
        let params = param_map(&mut record)?;
        for (position, entry) in positions(params, index)? {
            let mut tensors = Vec::new();
            visit_tensors(&mut params[entry].1, &mut |values, shape| {
                tensors.push(values.clone());
                Ok((values, shape))
            })?;
            let slot = chunks
                .get_mut(position)
                .ok_or_else(|| bad(&format!("parameter {position} is beyond the model")))?;
            slot.push(tensors);
            if entries[position].is_none() {
                entries[position] = Some(params[entry].1.clone());
            }
        }
        base.get_or_insert(record);
    }
    let mut joined = Vec::new();
    for (position, entry) in entries.into_iter().enumerate() {
        let Some(mut entry) = entry else {
            continue;
        };
        let ranks = &chunks[position];
        if ranks.len() != records.len() {
            return Err(bad(&format!(
                "{} of {} ranks hold state for parameter {position}",
                ranks.len(),
                records.len()
            )));
        }
        let mut tensor = 0;
        let chunk = numels[position].div_ceil(records.len());
        visit_tensors(&mut entry, &mut |_, _| {
            let mut values = Vec::with_capacity(chunk * ranks.len());
            for (rank, tensors) in ranks.iter().enumerate() {
                match tensors.get(tensor) {
                    Some(part) if part.len() == chunk => values.extend_from_slice(part),
                    other => {
                        return Err(bad(&format!(
                            "parameter {position}: saved rank {rank}'s state tensor {tensor} \
                             holds {} values, a shard at {} ranks holds {chunk}",
                            other.map_or(0, Vec::len),
                            records.len()
                        )));
                    }
                }
            }
            tensor += 1;
            values.truncate(numels[position]);
            Ok((values, shapes[position].clone()))
        })?;
        joined.push((Value::from(ids[position].as_str()), entry));
    }
    let mut record = base.ok_or_else(|| bad("no record to join"))?;
    if let Some(item) = field_mut(&mut record, "item") {
        *item = Value::Map(joined);
    }
    encode_value(&record)
}

/// The record in `bytes` (this rank's optimizer state; `index` maps its model's parameter ids
/// to positions) with every state tensor replaced by its mean over the ranks: one all-reduce
/// of all of them, in parameter position order. Every rank's record must hold state for the
/// same parameters with the same shapes (an error on every rank otherwise). Every rank calls it.
pub fn mean_param_states<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    bytes: &[u8],
    index: &HashMap<String, usize>,
    device: &B::Device,
) -> Result<Vec<u8>, ParallelError> {
    let mut all = Vec::new();
    let mut lengths = vec![0u64; index.len()];
    map_tensors(bytes, index, |position, values, shape| {
        all.extend_from_slice(&values);
        lengths[position] += values.len() as u64;
        Ok((values, shape))
    })?;
    // Each parameter's state size must be the same on every rank (a parameter without a
    // gradient yet has none): compared exactly, as 16-bit parts, then voted on.
    let mine: Vec<f32> = lengths
        .iter()
        .flat_map(|l| [0, 16, 32].map(|shift| ((l >> shift) & 0xFFFF) as f32))
        .collect();
    // A mean, not a sum against the world size: a fault-tolerant group averages over the
    // replicas present. The parts are whole numbers below 2^16, so the mean is exact.
    let means = group.all_reduce(Tensor::from_floats(mine.as_slice(), device), ReduceOp::Mean)?;
    let means = means.into_data().convert::<f32>().into_vec::<f32>();
    let differs = means.map_or(true, |means| {
        means
            .iter()
            .zip(&mine)
            .any(|(mean, m)| (mean - m).abs() > 1e-3)
    });
    let votes = group.all_reduce(
        Tensor::from_floats([f32::from(u8::from(differs))], device),
        ReduceOp::Sum,
    )?;
    if votes.into_scalar().elem::<f32>() > 0.5 {
        return Err(ParallelError::Mismatch {
            rank: group.rank(),
            reason: "the ranks hold optimizer state for different parameters (one without a \
                     gradient yet has none): it cannot be averaged"
                .into(),
        });
    }
    let mean = group.all_reduce(Tensor::from_floats(all.as_slice(), device), ReduceOp::Mean)?;
    let mean = mean
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| bad(&format!("{e:?}")))?;
    let mut at = 0;
    map_tensors(bytes, index, |_, values, shape| {
        let next = mean[at..at + values.len()].to_vec();
        at += values.len();
        Ok((next, shape))
    })
}

/// The record in `bytes` keeping only the states of parameters whose position (by `index`)
/// `keep` accepts.
pub(crate) fn retain_param_states(
    bytes: &[u8],
    index: &HashMap<String, usize>,
    keep: impl Fn(usize) -> bool,
) -> Result<Vec<u8>, ParallelError> {
    let mut record = decode(bytes)?;
    let params = param_map(&mut record)?;
    let kept: Vec<usize> = positions(params, index)?
        .into_iter()
        .filter(|(position, _)| keep(*position))
        .map(|(_, entry)| entry)
        .collect();
    let mut entries: Vec<Option<(Value, Value)>> = params.drain(..).map(Some).collect();
    *params = kept.into_iter().filter_map(|i| entries[i].take()).collect();
    encode_value(&record)
}

fn encode_value(record: &Value) -> Result<Vec<u8>, ParallelError> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, record).map_err(|e| bad(&e.to_string()))?;
    Ok(out)
}

fn field_mut<'a>(value: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    let Value::Map(entries) = value else {
        return None;
    };
    entries
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// Gets a state tensor's values and shape; returns the new ones.
type TensorFn<'a> =
    dyn FnMut(Vec<f32>, Vec<usize>) -> Result<(Vec<f32>, Vec<usize>), ParallelError> + 'a;

/// Depth-first, in the record's own order (struct fields in declaration order).
fn visit_tensors(value: &mut Value, f: &mut TensorFn<'_>) -> Result<(), ParallelError> {
    if let Some((data, dtype)) = as_tensor(value)? {
        let shape = data.shape.to_vec();
        let values = data
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ParallelError::Record(format!("optimizer state tensor: {e:?}")))?;
        let (values, shape) = f(values, shape)?;
        let data = TensorData::new(values, shape.clone()).convert_dtype(dtype);
        if let Some(bytes) = field_mut(value, "bytes") {
            *bytes = Value::Binary(data.bytes.to_vec());
        }
        if let Some(dims) = field_mut(value, "shape") {
            *dims = Value::Array(shape.into_iter().map(|d| Value::from(d as u64)).collect());
        }
        return Ok(());
    }
    match value {
        Value::Map(entries) => entries
            .iter_mut()
            .try_for_each(|(_, v)| visit_tensors(v, f)),
        Value::Array(items) => items.iter_mut().try_for_each(|v| visit_tensors(v, f)),
        _ => Ok(()),
    }
}

/// The tensor a `{bytes, shape, dtype}` map holds, with its dtype.
fn as_tensor(value: &Value) -> Result<Option<(TensorData, DType)>, ParallelError> {
    let Value::Map(entries) = value else {
        return Ok(None);
    };
    let get = |name: &str| entries.iter().find(|(k, _)| k.as_str() == Some(name));
    let (Some((_, bytes)), Some((_, shape)), Some((_, dtype))) =
        (get("bytes"), get("shape"), get("dtype"))
    else {
        return Ok(None);
    };
    let bad = |what: String| ParallelError::Record(format!("optimizer state tensor: {what}"));
    let dtype = match dtype.as_str() {
        Some("F32") => DType::F32,
        Some("F64") => DType::F64,
        Some("F16") => DType::F16,
        Some("BF16") => DType::BF16,
        other => {
            return Err(bad(format!(
                "dtype {other:?} is not a float dtype FSDP can gather"
            )));
        }
    };
    let bytes = match bytes {
        Value::Binary(b) => b.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|b| b as u8)
            .collect(),
        _ => return Err(bad("bytes are not binary".into())),
    };
    let shape: Vec<usize> = match shape {
        Value::Array(dims) => dims
            .iter()
            .filter_map(Value::as_u64)
            .map(|d| d as usize)
            .collect(),
        _ => return Err(bad("shape is not a list".into())),
    };
    Ok(Some((
        TensorData::from_bytes_vec(bytes, shape, dtype),
        dtype,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LaunchConfig, launch};
    use burn::backend::Flex;

    /// A record in Burn's named MessagePack form holding, for each (id, values), one state
    /// tensor.
    fn record(params: &[(&str, &[f32])]) -> Vec<u8> {
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
        encode_value(&Value::Map(vec![(Value::from("item"), Value::Map(item))])).unwrap()
    }

    fn values(bytes: &[u8], index: &HashMap<String, usize>) -> Vec<f32> {
        let mut all = Vec::new();
        map_tensors(bytes, index, |_, values, shape| {
            all.extend_from_slice(&values);
            Ok((values, shape))
        })
        .unwrap();
        all
    }

    #[test]
    fn states_average_by_position_and_only_when_every_rank_holds_the_same_ones() {
        // Rank 1 names its parameters differently (ids differ between ranks): positions pair.
        let index = |ids: [&str; 2]| -> HashMap<String, usize> {
            ids.iter()
                .enumerate()
                .map(|(i, id)| (id.to_string(), i))
                .collect()
        };
        let averaged = launch::<Flex, _, String, _>(
            vec![Default::default(); 2],
            LaunchConfig::default(),
            move |g| {
                let (ids, bytes) = match g.rank() {
                    0 => (["a", "b"], record(&[("a", &[1.0, 2.0]), ("b", &[10.0])])),
                    _ => (["x", "y"], record(&[("y", &[30.0]), ("x", &[3.0, 4.0])])),
                };
                let index = index(ids);
                let mean =
                    mean_param_states(&g, &bytes, &index, g.device()).map_err(|e| e.to_string())?;
                Ok(values(&mean, &index))
            },
        )
        .unwrap();
        assert_eq!(averaged, vec![vec![2.0, 3.0, 20.0]; 2]);

        // Rank 1 has no state for its second parameter yet (no gradient reached it), and
        // more for the first: the same total, but not the same parameters.
        let refused = launch::<Flex, _, String, _>(
            vec![Default::default(); 2],
            LaunchConfig::default(),
            move |g| {
                let bytes = match g.rank() {
                    0 => record(&[("a", &[1.0, 2.0]), ("b", &[10.0])]),
                    _ => record(&[("a", &[1.0, 2.0, 3.0])]),
                };
                Ok(
                    mean_param_states(&g, &bytes, &index(["a", "b"]), g.device())
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                )
            },
        )
        .unwrap();
        for result in refused {
            let err = result.unwrap_err();
            assert!(err.contains("different parameters"), "{err}");
        }
    }
}
