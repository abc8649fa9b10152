//! Several ranks' optimizer records made one: merged (ZeRO-1: each parameter's state on one
//! rank), joined (FSDP: a chunk of every parameter's state on every rank) or averaged (Local
//! SGD).

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use rmpv::Value;

use super::tensors::visit_tensors;
use super::{OptimizerRecord, ParamPositions, bad, param_map, positions};
use crate::{ParallelError, ProcessGroup, ReduceOp};

/// One record holding every parameter state of `records` (each one rank's optimizer record,
/// with the map from its model's parameter ids to their positions), keyed by `ids`, the ids by
/// position of the model it will load into; otherwise in the first record's form. Errors on an
/// id its model lacks and on a parameter two records hold state for (parts of different saves).
pub fn merge_param_states(
    records: Vec<(OptimizerRecord, ParamPositions)>,
    ids: &[String],
) -> Result<OptimizerRecord, ParallelError> {
    let mut merged: Vec<Option<Value>> = vec![None; ids.len()];
    let mut base = None;
    for (mut record, index) in records {
        let params = param_map(&mut record.value)?;
        for (position, entry) in positions(params, &index)? {
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
    let params = merged
        .into_iter()
        .zip(ids)
        .filter_map(|(state, id)| Some((Value::from(id.as_str()), state?)))
        .collect();
    Ok(base
        .ok_or_else(|| bad("no record to merge"))?
        .with_params(params))
}

/// One record from the records of ranks that each held a chunk of every parameter's state
/// (FSDP's shards: `records[k]`, rank k's, with its model's id-to-position map): each state
/// tensor is the ranks' chunks joined in rank order, cut to `numels[p]` values and shaped
/// `shapes[p]`, keyed by `ids`; otherwise in the first record's form.
pub fn join_param_shards(
    records: Vec<(OptimizerRecord, ParamPositions)>,
    ids: &[String],
    numels: &[usize],
    shapes: &[Vec<usize>],
) -> Result<OptimizerRecord, ParallelError> {
    let saved_ranks = records.len();
    // Every rank's state tensors, by parameter position, in the entry's own order.
    let mut chunks: Vec<Vec<Vec<Vec<f32>>>> = vec![Vec::new(); ids.len()];
    let mut entries: Vec<Option<Value>> = vec![None; ids.len()];
    let mut base = None;
    for (mut record, index) in records {
        let params = param_map(&mut record.value)?;
        for (position, entry) in positions(params, &index)? {
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
        if ranks.len() != saved_ranks {
            return Err(bad(&format!(
                "{} of {saved_ranks} ranks hold state for parameter {position}",
                ranks.len(),
            )));
        }
        let mut tensor = 0;
        let chunk = numels[position].div_ceil(saved_ranks);
        visit_tensors(&mut entry, &mut |_, _| {
            let mut values = Vec::with_capacity(chunk * ranks.len());
            for (rank, tensors) in ranks.iter().enumerate() {
                match tensors.get(tensor) {
                    Some(part) if part.len() == chunk => values.extend_from_slice(part),
                    other => {
                        return Err(bad(&format!(
                            "parameter {position}: saved rank {rank}'s state tensor {tensor} \
                             holds {} values, a shard at {saved_ranks} ranks holds {chunk}",
                            other.map_or(0, Vec::len),
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
    Ok(base
        .ok_or_else(|| bad("no record to join"))?
        .with_params(joined))
}

/// `record` (this rank's optimizer state; `index` maps its model's parameter ids to
/// positions) with every state tensor replaced by its mean over the ranks: one all-reduce of
/// all of them, in parameter position order. Every rank's record must hold state for the same
/// parameters with the same shapes (an error on every rank otherwise). Every rank calls it.
pub fn mean_param_states<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    record: OptimizerRecord,
    index: &ParamPositions,
    device: &B::Device,
) -> Result<OptimizerRecord, ParallelError> {
    let mut all = Vec::new();
    let mut lengths = vec![0u64; index.len()];
    let record = record.map_tensors(index, |position, values, shape| {
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
    record.map_tensors(index, |_, values, shape| {
        let next = mean[at..at + values.len()].to_vec();
        at += values.len();
        Ok((next, shape))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{index, record};
    use crate::{LaunchConfig, launch};
    use burn::backend::Flex;

    #[test]
    fn states_average_by_position_and_only_when_every_rank_holds_the_same_ones() {
        // Rank 1 names its parameters differently (ids differ between ranks): positions pair.
        let averaged = launch::<Flex, _, String, _>(
            vec![Default::default(); 2],
            LaunchConfig::default(),
            move |g| {
                let (ids, rec) = match g.rank() {
                    0 => (["a", "b"], record(&[("a", &[1.0, 2.0]), ("b", &[10.0])])),
                    _ => (["x", "y"], record(&[("y", &[30.0]), ("x", &[3.0, 4.0])])),
                };
                let index = index(&ids);
                let mean =
                    mean_param_states(&g, rec, &index, g.device()).map_err(|e| e.to_string())?;
                mean.values(&index).map_err(|e| e.to_string())
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
                let rec = match g.rank() {
                    0 => record(&[("a", &[1.0, 2.0]), ("b", &[10.0])]),
                    _ => record(&[("a", &[1.0, 2.0, 3.0])]),
                };
                Ok(mean_param_states(&g, rec, &index(&["a", "b"]), g.device())
                    .map(|_| ())
                    .map_err(|e| e.to_string()))
            },
        )
        .unwrap();
        for result in refused {
            let err = result.unwrap_err();
            assert!(err.contains("different parameters"), "{err}");
        }
    }

    #[test]
    fn rank_records_merge_by_position_and_refuse_a_parameter_held_twice() {
        // Rank 0 owned parameter 0, rank 1 parameter 1, each under its own ids.
        let merged = merge_param_states(
            vec![
                (record(&[("a", &[1.0])]), index(&["a", "b"])),
                (record(&[("y", &[2.0, 3.0])]), index(&["x", "y"])),
            ],
            &["p".into(), "q".into()],
        )
        .unwrap();
        assert_eq!(
            merged.values(&index(&["p", "q"])).unwrap(),
            vec![1.0, 2.0, 3.0]
        );
        let twice = merge_param_states(
            vec![
                (record(&[("a", &[1.0])]), index(&["a"])),
                (record(&[("x", &[1.0])]), index(&["x"])),
            ],
            &["p".into()],
        )
        .unwrap_err();
        assert!(twice.to_string().contains("two ranks"), "{twice}");
    }

    #[test]
    fn shards_join_in_rank_order_cut_to_the_parameter() {
        // A 3-value parameter over 2 ranks: chunks of 2, the last padded.
        let joined = join_param_shards(
            vec![
                (record(&[("a", &[1.0, 2.0])]), index(&["a"])),
                (record(&[("x", &[3.0, 0.0])]), index(&["x"])),
            ],
            &["p".into()],
            &[3],
            &[vec![3]],
        )
        .unwrap();
        assert_eq!(joined.values(&index(&["p"])).unwrap(), vec![1.0, 2.0, 3.0]);
    }
}
