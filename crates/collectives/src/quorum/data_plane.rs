//! How a [`QuorumGroup`](super::QuorumGroup) moves its values: over a ring between the
//! members (crate::ring), with the lighthouse as the control plane.
//!
//! - A group whose ranks fail together (`afterburner launch`, policy `all`) asks the
//!   lighthouse once, at its first collective, who is where; from then on its collectives go
//!   over the ring alone, and the first failure is sticky.
//! - A fault-tolerant group asks the lighthouse before each collective who is present (a
//!   round that also checks the members agree on the collective and its length), runs it on
//!   the ring of those members (rebuilt when the membership's generation changed), then
//!   commits it in a second round: when a member failed or left during the ring, every member
//!   retries over the members left, so they all return the same result.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use afterburner_rendezvous::{Coordinator, Op, Reply, Session};

use super::Quorum;
use super::group::Handle;
use crate::ParallelError;
use crate::ring::{Endpoint, Ring};

/// How many times a fault-tolerant collective is retried over unchanged members before it
/// fails (a membership change does not count: a lost member is the failure retries are for).
const RETRIES: usize = 3;

/// A collective, as the ring runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum RingOp {
    AllReduce { mean: bool },
    ReduceScatter { mean: bool },
    Broadcast(usize),
    Gather,
}

impl RingOp {
    fn code(self) -> (f32, f32) {
        match self {
            RingOp::AllReduce { mean } => (1.0 + f32::from(u8::from(mean)), 0.0),
            RingOp::ReduceScatter { mean } => (3.0 + f32::from(u8::from(mean)), 0.0),
            RingOp::Broadcast(root) => (5.0, root as f32),
            RingOp::Gather => (6.0, 0.0),
        }
    }

    fn name(code: f32) -> &'static str {
        match code as u8 {
            1 => "all_reduce (sum)",
            2 => "all_reduce (mean)",
            3 => "reduce_scatter (sum)",
            4 => "reduce_scatter (mean)",
            5 => "broadcast",
            _ => "all_gather",
        }
    }
}

/// A replica's ring and where it listens for its peers.
pub(super) struct DataPlane {
    endpoint: Endpoint,
    ring: Option<Ring>,
    /// Bytes sent over rings since replaced.
    retired: u64,
    /// A group failing together: its first failure.
    sticky: Option<ParallelError>,
    /// How long one ring exchange waits: half the lighthouse's collective timeout, so that
    /// after a ring fails every member reaches the lighthouse's next round before its
    /// deadline (the round's clock starts with the first member that failed fast).
    timeout: Duration,
}

impl DataPlane {
    /// Listens for peers on the address that reaches the lighthouse and tells the lighthouse;
    /// `timeout` is the lighthouse's collective timeout.
    pub fn open(
        coordinator: &Arc<dyn Coordinator>,
        session: &Session,
        timeout: Duration,
    ) -> Result<Self, ParallelError> {
        let endpoint = Endpoint::bind(coordinator.local_ip(), session.replica)?;
        coordinator.announce(session, &endpoint.address())?;
        Ok(Self {
            endpoint,
            ring: None,
            retired: 0,
            sticky: None,
            timeout: (timeout / 2).max(Duration::from_millis(1)),
        })
    }

    /// Value bytes this replica sent to its peers.
    pub fn bytes_sent(&self) -> u64 {
        self.retired + self.ring.as_ref().map_or(0, Ring::bytes_sent)
    }

    fn replace_ring(&mut self, ring: Option<Ring>) {
        self.retired += self.ring.as_ref().map_or(0, Ring::bytes_sent);
        self.ring = ring;
    }
}

impl Handle {
    /// One collective over the ring (the caller holds `plane`, so one at a time).
    pub(super) fn over_ring(
        &self,
        plane: &mut DataPlane,
        op: RingOp,
        values: Option<Vec<f32>>,
        together: bool,
    ) -> Result<Vec<Vec<f32>>, ParallelError> {
        if let Some(error) = &plane.sticky {
            return Err(error.clone());
        }
        if !together {
            return self.committed(plane, op, values);
        }
        // The values bypass the lighthouse: without this look, ranks whose lighthouse died
        // (node 0's launcher) would train on unsupervised until they next needed it.
        if let Some(reason) = self.coordinator.lost() {
            let error = ParallelError::Collective {
                op: "collective",
                rank: self.session.replica,
                reason: format!("{reason}; the ranks fail together, so this one stops too"),
            };
            plane.replace_ring(None);
            plane.sticky = Some(error.clone());
            return Err(error);
        }
        let result = (|| {
            if plane.ring.is_none() {
                let reply = self.begin(op, values.as_deref(), true)?;
                let all: Vec<usize> = (0..self.replicas).collect();
                if reply.members != all {
                    return Err(ParallelError::Collective {
                        op: "collective",
                        rank: self.session.replica,
                        reason: format!(
                            "the ranks fail together, but only {:?} of {} are present",
                            reply.members, self.replicas
                        ),
                    });
                }
                self.rebuild(plane, &reply)?;
            }
            run(ring_of(plane), op, values)
        })();
        if let Err(error) = &result {
            plane.replace_ring(None);
            // The lighthouse knows who left and why: its round fails naming the lost rank
            // (every rank fails this collective, as each neighbour of a failure drops its links).
            let named = self.round(Op::Sum, Some(vec![1.0])).err();
            let error = named.unwrap_or_else(|| error.clone());
            plane.sticky = Some(error.clone());
            return Err(error);
        }
        result
    }

    /// A fault-tolerant collective: begin, ring, commit, retried over the members left.
    fn committed(
        &self,
        plane: &mut DataPlane,
        op: RingOp,
        values: Option<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>, ParallelError> {
        let mut failures = 0;
        loop {
            let reply = self.begin(op, values.as_deref(), false)?;
            // A failed attempt dropped its ring; a kept one is rebuilt when the members changed.
            let stale = plane.ring.as_ref().is_none_or(|ring| {
                ring.generation() != reply.generation || ring.members() != reply.members
            });
            let attempt = match stale {
                true => self.rebuild(plane, &reply),
                false => Ok(()),
            }
            .and_then(|()| run(ring_of(plane), op, values.clone()));
            if reply.members.len() == 1 {
                return attempt; // nobody to agree with
            }
            let failed = f32::from(u8::from(attempt.is_err()));
            let commit = self.round(Op::Sum, Some(vec![failed]))?;
            let failed_on = commit.values.first().and_then(|v| v.first()).copied();
            if failed_on == Some(0.0) && commit.members == reply.members {
                return attempt;
            }
            plane.replace_ring(None);
            if let Err(error) = &attempt {
                tracing::warn!(
                    replica = self.session.replica,
                    "ring collective failed: {error}"
                );
            }
            if commit.members == reply.members {
                failures += 1;
                if failures == RETRIES {
                    return Err(attempt.err().unwrap_or_else(|| ParallelError::Collective {
                        op: "collective",
                        rank: self.session.replica,
                        reason: format!(
                            "the ring collective failed {RETRIES} times over the same members \
                             {:?} (see the failing members' errors)",
                            reply.members
                        ),
                    }));
                }
            }
        }
    }

    /// The round before a collective: who is present, and whether they agree on it.
    ///
    /// Members that disagree (another collective, or another length) never take down the
    /// members that were right. In a fault-tolerant group the right call is the one most of
    /// the replicas of this replica's previous collective made (on a tie, the lowest one's);
    /// a member that made another call, or a newcomer (healed since) when the others
    /// disagree, is out of step: it leaves the quorum with the error, and the others run the
    /// collective again without it. Ranks failing together all fail.
    fn begin(
        &self,
        op: RingOp,
        values: Option<&[f32]>,
        together: bool,
    ) -> Result<Reply, ParallelError> {
        let (code, root) = op.code();
        let len = values.map_or(0, <[f32]>::len) as u64;
        let control = vec![code, root, (len & 0xFF_FFFF) as f32, (len >> 24) as f32];
        let sized = !matches!(op, RingOp::Gather | RingOp::Broadcast(_));
        loop {
            // The members of this replica's previous collective (none for a newcomer).
            let before = Quorum::members(self);
            let seq = self.seq.load(Ordering::SeqCst);
            let reply = self.round(Op::Gather, Some(control.clone()))?;
            let rank = self.session.replica;
            let calls: Vec<(usize, Call)> = reply
                .members
                .iter()
                .zip(&reply.values)
                .map(|(replica, c)| (*replica, Call::of(c, sized)))
                .collect();
            let Some(disagreement) = disagreement(seq, &calls) else {
                if let RingOp::Broadcast(root) = op
                    && !reply.members.contains(&root)
                {
                    return Err(ParallelError::Collective {
                        op: "collective",
                        rank,
                        reason: format!(
                            "collective {seq}: the broadcast's root, replica {root}, left the quorum"
                        ),
                    });
                }
                return Ok(reply);
            };
            let right = match together {
                true => None,
                false => right_call(&calls, &before),
            };
            let mine = Call::of(&control, sized);
            if right.is_none_or(|right| right != mine) {
                if !together {
                    let reason = format!("it is out of step with the others ({disagreement})");
                    tracing::warn!(replica = rank, "leaving the quorum: {reason}");
                    self.coordinator.leave(&self.session, &reason);
                }
                return Err(disagreement.into_error(rank));
            }
            let wrong: Vec<usize> = calls
                .iter()
                .filter(|(_, call)| Some(*call) != right)
                .map(|(replica, _)| *replica)
                .collect();
            tracing::warn!(
                replica = rank,
                "{disagreement}: replica(s) {wrong:?} are out of step and leave the quorum; the \
                 collective runs again without them"
            );
        }
    }

    /// Builds the ring of `reply`'s members and generation.
    fn rebuild(&self, plane: &mut DataPlane, reply: &Reply) -> Result<(), ParallelError> {
        plane.replace_ring(None);
        let peers = self.coordinator.peers(&self.session, &reply.members)?;
        let ring = Ring::build(
            &plane.endpoint,
            self.session.replica,
            &reply.members,
            reply.generation,
            &peers,
            plane.timeout,
        )?;
        plane.replace_ring(Some(ring));
        Ok(())
    }
}

fn ring_of(plane: &mut DataPlane) -> &mut Ring {
    plane.ring.as_mut().expect("built before it runs")
}

/// Runs `op` on `ring`: one vector, or one per member for a gather.
fn run(
    ring: &mut Ring,
    op: RingOp,
    values: Option<Vec<f32>>,
) -> Result<Vec<Vec<f32>>, ParallelError> {
    let given = |values: Option<Vec<f32>>| values.unwrap_or_default();
    Ok(match op {
        RingOp::AllReduce { mean } => vec![ring.all_reduce(given(values), mean)?],
        RingOp::ReduceScatter { mean } => vec![ring.reduce_scatter(given(values), mean)?],
        RingOp::Broadcast(root) => vec![ring.broadcast(values, root)?],
        RingOp::Gather => ring.all_gather(given(values))?,
    })
}

/// The lock on a replica's data plane, whatever a panicking holder left.
pub(super) fn lock(plane: &std::sync::Mutex<DataPlane>) -> std::sync::MutexGuard<'_, DataPlane> {
    plane.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a member called in a collective: the collective's code, and its length where the
/// members must agree on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    code: u8,
    len: Option<u64>,
}

impl Call {
    /// The call a member's control values (code, root, length in two parts) describe.
    fn of(control: &[f32], sized: bool) -> Self {
        let at = |i: usize| control.get(i).copied().unwrap_or(0.0);
        Self {
            code: at(0) as u8,
            len: sized.then(|| at(2) as u64 + ((at(3) as u64) << 24)),
        }
    }
}

/// How the members of collective `seq` disagree, when they do.
enum Disagreement {
    /// Two members called different collectives.
    Op(String),
    /// Two members sent different lengths.
    Length(String),
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disagreement::Op(reason) | Disagreement::Length(reason) => f.write_str(reason),
        }
    }
}

impl Disagreement {
    fn into_error(self, rank: usize) -> ParallelError {
        match self {
            Disagreement::Op(reason) => ParallelError::Mismatch { rank, reason },
            Disagreement::Length(reason) => ParallelError::Collective {
                op: "collective",
                rank,
                reason,
            },
        }
    }
}

/// The first disagreement among `calls` (against the lowest member's call), if any.
fn disagreement(seq: u64, calls: &[(usize, Call)]) -> Option<Disagreement> {
    let &(first, first_call) = calls.first()?;
    calls[1..].iter().find_map(|&(replica, call)| {
        if call.code != first_call.code {
            return Some(Disagreement::Op(format!(
                "collective {seq}: replica {replica} called {}, replica {first} {}",
                RingOp::name(f32::from(call.code)),
                RingOp::name(f32::from(first_call.code))
            )));
        }
        match (call.len, first_call.len) {
            (Some(len), Some(first_len)) if len != first_len => {
                Some(Disagreement::Length(format!(
                    "collective {seq}: replica {replica} sent {len} values, replica {first} sent \
                     {first_len}"
                )))
            }
            _ => None,
        }
    })
}

/// The call most of the members that were in the previous collective (`before`) made, on a
/// tie the lowest one's; `None` when none of them is here (the run's first collective, or
/// this replica is a newcomer).
fn right_call(calls: &[(usize, Call)], before: &[usize]) -> Option<Call> {
    let veterans: Vec<Call> = calls
        .iter()
        .filter(|(replica, _)| before.contains(replica))
        .map(|(_, call)| *call)
        .collect();
    let count = |call: &Call| veterans.iter().filter(|c| *c == call).count();
    // The first of the most made calls: `veterans` is in replica order.
    let most = veterans.iter().map(count).max()?;
    veterans.iter().find(|call| count(call) == most).copied()
}
