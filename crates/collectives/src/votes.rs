//! Agreement across ranks, for whoever must not go on alone: who is present and how many say
//! yes, whether every rank holds the same counters, one rank's text on every rank. Each is one
//! or two small collectives over any [`ProcessGroup`]; `None` (a single device) answers
//! locally. A fault-tolerant group's collectives combine the replicas present, so every answer
//! here counts the ranks that took part, not the configured world size: a replica that died
//! before a vote is not a "no".

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};

use crate::{ParallelError, ProcessGroup, ReduceOp};

/// The outcome of a vote: the ranks that took part (in rank order) and how many said yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ballot {
    /// The ranks that voted (every rank, except in a fault-tolerant group that lost some).
    pub voters: Vec<usize>,
    /// How many of them said yes.
    pub yes: usize,
}

impl Ballot {
    /// How many voters said no.
    pub fn no(&self) -> usize {
        self.voters.len() - self.yes
    }

    /// The lowest rank that voted (the one to act for the others: stage, commit).
    pub fn first(&self) -> usize {
        self.voters.first().copied().unwrap_or(0)
    }
}

/// Who votes and how many pass `yes`: one all-reduce of `1 + world_size` values (the yes count,
/// then one presence flag per rank); this rank alone without a group.
pub fn vote<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    yes: bool,
    device: &B::Device,
) -> Result<Ballot, ParallelError> {
    let Some(group) = group else {
        return Ok(Ballot {
            voters: vec![0],
            yes: usize::from(yes),
        });
    };
    let world = group.world_size();
    let mut mine = vec![0f32; 1 + world];
    mine[0] = f32::from(u8::from(yes));
    mine[1 + group.rank().min(world - 1)] = 1.0;
    let sums = group
        .all_reduce(
            Tensor::<B, 1>::from_floats(mine.as_slice(), device),
            ReduceOp::Sum,
        )?
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("a vote's counts: {e:?}")))?;
    let voters = (0..world)
        .filter(|r| sums.get(1 + r).is_some_and(|v| *v > 0.5))
        .collect();
    Ok(Ballot {
        voters,
        yes: sums.first().map_or(0, |v| v.round() as usize),
    })
}

/// How many ranks pass `yes` (one all-reduce of one value; this rank's vote without a group).
pub fn ranks_voting_yes<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    yes: bool,
    device: &B::Device,
) -> Result<usize, ParallelError> {
    let Some(group) = group else {
        return Ok(usize::from(yes));
    };
    let vote = Tensor::<B, 1>::from_floats([f32::from(u8::from(yes))], device);
    let votes = group.all_reduce(vote, ReduceOp::Sum)?.into_scalar();
    Ok(votes.elem::<f32>().round() as usize)
}

/// Whether every rank present passed the same `values` (two small all-reduces; true without a
/// group): each rank checks that the sum over the ranks present is their count times its own
/// values, and the ranks then agree on the verdict. Each value travels as four 16-bit parts,
/// so the f32 sums stay exact for any `u64` and up to 256 ranks.
pub fn same_on_every_rank<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    values: &[u64],
    device: &B::Device,
) -> Result<bool, ParallelError> {
    let Some(group) = group else {
        return Ok(true);
    };
    let mut mine: Vec<f32> = values
        .iter()
        .flat_map(|v| [0, 16, 32, 48].map(|shift| ((v >> shift) & 0xFFFF) as f32))
        .collect();
    // The last value counts the ranks present.
    mine.push(1.0);
    let tensor = Tensor::<B, 1>::from_floats(mine.as_slice(), device);
    let sums = group.all_reduce(tensor, ReduceOp::Sum)?;
    let sums = sums.into_data().to_vec::<f32>().unwrap_or_default();
    let present = sums.last().copied().unwrap_or(0.0).round();
    let agree = sums.len() == mine.len()
        && sums
            .iter()
            .zip(&mine)
            .all(|(sum, v)| (sum - present * v).abs() < 0.5);
    let verdict = vote(Some(group), agree, device)?;
    Ok(verdict.no() == 0)
}

/// Rank 0's `text` (`Some` there, ignored elsewhere) on every rank: its length, then its
/// bytes, by two broadcasts (the text itself without a group).
pub fn broadcast_text<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    text: Option<&str>,
    device: &B::Device,
) -> Result<String, ParallelError> {
    broadcast_text_from(group, 0, text, device)
}

/// Rank `root`'s `text` (`Some` there, ignored elsewhere) on every rank, as
/// [`broadcast_text`].
pub fn broadcast_text_from<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    root: usize,
    text: Option<&str>,
    device: &B::Device,
) -> Result<String, ParallelError> {
    let Some(group) = group else {
        return Ok(text.unwrap_or_default().to_string());
    };
    let is_root = group.rank() == root;
    let mine = text.unwrap_or_default().as_bytes();
    let len = is_root.then(|| Tensor::from_floats([mine.len() as f32], device));
    let len = group.broadcast(len, root)?.into_scalar().elem::<f32>() as usize;
    let bytes: Vec<f32> = mine.iter().map(|b| f32::from(*b)).collect();
    let bytes = is_root.then(|| Tensor::from_floats(bytes.as_slice(), device));
    let bytes = group.broadcast(bytes, root)?.into_data().to_vec::<f32>();
    let bytes: Vec<u8> = bytes.unwrap_or_default().iter().map(|b| *b as u8).collect();
    match bytes.len() == len {
        true => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        false => Err(ParallelError::Mismatch {
            rank: group.rank(),
            reason: format!("a broadcast of {len} bytes arrived as {}", bytes.len()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LaunchConfig, launch};
    use burn::backend::Flex;

    #[test]
    fn votes_count_and_compare_across_ranks() {
        let device = Default::default();
        assert_eq!(ranks_voting_yes::<Flex>(None, true, &device).unwrap(), 1);
        assert!(same_on_every_rank::<Flex>(None, &[7], &device).unwrap());
        let results = launch::<Flex, _, ParallelError, _>(
            vec![Default::default(); 3],
            LaunchConfig::default(),
            |group| {
                let device = *group.device();
                let g: &dyn ProcessGroup<Flex> = &group;
                let rank = g.rank() as u64;
                let yes = ranks_voting_yes(Some(g), rank != 1, &device)?;
                let same = same_on_every_rank(Some(g), &[u64::MAX - 3, 42], &device)?;
                let differ = same_on_every_rank(Some(g), &[rank, 1 << 40], &device)?;
                let text = (rank == 0).then_some("checkpoint_7");
                let text = broadcast_text(Some(g), text, &device)?;
                let ballot = vote(Some(g), rank == 2, &device)?;
                assert_eq!(
                    ballot,
                    Ballot {
                        voters: vec![0, 1, 2],
                        yes: 1
                    }
                );
                Ok((yes, same, differ, text))
            },
        )
        .unwrap();
        for result in results {
            assert_eq!(result, (2, true, false, "checkpoint_7".to_string()));
        }
    }
}
