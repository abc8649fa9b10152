//! Agreement across ranks, for whoever must not go on alone: how many ranks say yes, whether
//! every rank holds the same counters, rank 0's text on every rank. Each is one or two small
//! collectives over any [`ProcessGroup`]; `None` (a single device) answers locally.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};

use crate::{ParallelError, ProcessGroup, ReduceOp};

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

/// Whether every rank passed the same `values` (two small all-reduces; true without a group):
/// each rank checks that the sum over ranks is `world` times its own values, and the ranks
/// then agree on the verdict. Each value travels as four 16-bit parts, so the f32 sums stay
/// exact for any `u64` and up to 256 ranks.
pub fn same_on_every_rank<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    values: &[u64],
    device: &B::Device,
) -> Result<bool, ParallelError> {
    let Some(group) = group else {
        return Ok(true);
    };
    let mine: Vec<f32> = values
        .iter()
        .flat_map(|v| [0, 16, 32, 48].map(|shift| ((v >> shift) & 0xFFFF) as f32))
        .collect();
    let tensor = Tensor::<B, 1>::from_floats(mine.as_slice(), device);
    let sums = group.all_reduce(tensor, ReduceOp::Sum)?;
    let sums = sums.into_data().to_vec::<f32>().unwrap_or_default();
    let world = group.world_size() as f32;
    let agree = sums.len() == mine.len()
        && sums
            .iter()
            .zip(&mine)
            .all(|(sum, v)| (sum - world * v).abs() < 0.5);
    Ok(ranks_voting_yes(Some(group), agree, device)? == group.world_size())
}

/// Rank 0's `text` (`Some` there, ignored elsewhere) on every rank: its length, then its
/// bytes, by two broadcasts (the text itself without a group).
pub fn broadcast_text<B: Backend>(
    group: Option<&dyn ProcessGroup<B>>,
    text: Option<&str>,
    device: &B::Device,
) -> Result<String, ParallelError> {
    let Some(group) = group else {
        return Ok(text.unwrap_or_default().to_string());
    };
    let root = group.rank() == 0;
    let mine = text.unwrap_or_default().as_bytes();
    let len = root.then(|| Tensor::from_floats([mine.len() as f32], device));
    let len = group.broadcast(len, 0)?.into_scalar().elem::<f32>() as usize;
    let bytes: Vec<f32> = mine.iter().map(|b| f32::from(*b)).collect();
    let bytes = root.then(|| Tensor::from_floats(bytes.as_slice(), device));
    let bytes = group.broadcast(bytes, 0)?.into_data().to_vec::<f32>();
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
                Ok((yes, same, differ, text))
            },
        )
        .unwrap();
        for result in results {
            assert_eq!(result, (2, true, false, "checkpoint_7".to_string()));
        }
    }
}
