//! One collective of a [`Lighthouse`](super::Lighthouse): what it computes ([`Op`]), the
//! contributions gathered so far ([`Round`]), and how they combine over the replicas present.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::RendezvousError;

/// What a collective computes from the members' contributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Element-wise sum over the members present.
    Sum,
    /// Element-wise sum divided by the number of members present.
    Mean,
    /// The root's values (the others contribute none).
    Broadcast(usize),
    /// Every member's values, in replica order.
    Gather,
}

/// A finished collective: its values and the replicas they came from, or why it failed.
pub(crate) type Combined = Result<(Vec<Vec<f32>>, Vec<usize>), RendezvousError>;

/// A finished collective as its members read it: [`Combined`] with the membership's
/// generation when it finished.
pub(crate) type Outcome = Result<(Vec<Vec<f32>>, Vec<usize>, u64), RendezvousError>;

/// One collective in progress.
pub(crate) struct Round {
    pub op: Op,
    pub first_at: Instant,
    pub contributions: BTreeMap<usize, Option<Vec<f32>>>,
}

/// The outcome of a finished round over its `members` (the contributions of replicas
/// dropped meanwhile are left out); fewer members than `min_replicas` fail it, with
/// `why_missing` (why the others left) in the error.
pub(crate) fn combine(
    round: Round,
    members: &[usize],
    seq: u64,
    min_replicas: usize,
    why_missing: &str,
) -> Combined {
    let fail = |reason: String| RendezvousError::Collective {
        op: "collective",
        rank: members.first().copied().unwrap_or(0),
        reason,
    };
    if members.len() < min_replicas {
        let why = match why_missing.is_empty() {
            true => String::new(),
            false => format!(" ({why_missing})"),
        };
        return Err(fail(format!(
            "collective {seq}: {} replica(s) present, fewer than min_replicas = {}{why}",
            members.len(),
            min_replicas
        )));
    }
    let mut parts: Vec<(usize, Vec<f32>)> = round
        .contributions
        .into_iter()
        .filter(|(r, _)| members.contains(r))
        .filter_map(|(r, v)| v.map(|v| (r, v)))
        .collect();
    let members = members.to_vec();
    match round.op {
        Op::Broadcast(root) => match parts.into_iter().find(|(r, _)| *r == root) {
            Some((_, values)) => Ok((vec![values], members)),
            None => Err(fail(format!(
                "collective {seq}: the broadcast's root, replica {root}, left the quorum"
            ))),
        },
        Op::Gather => Ok((parts.drain(..).map(|(_, v)| v).collect(), members)),
        Op::Sum | Op::Mean => {
            let len = parts.first().map_or(0, |(_, v)| v.len());
            if let Some((r, v)) = parts.iter().find(|(_, v)| v.len() != len) {
                return Err(fail(format!(
                    "collective {seq}: replica {r} sent {} values, replica {} sent {len}",
                    v.len(),
                    parts[0].0
                )));
            }
            let mut sum = vec![0f32; len];
            for (_, values) in &parts {
                sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
            }
            if round.op == Op::Mean {
                let count = parts.len().max(1) as f32;
                sum.iter_mut().for_each(|s| *s /= count);
            }
            Ok((vec![sum], members))
        }
    }
}
