//! A ring between the members of a group, over TCP: the data plane of a [`QuorumGroup`]
//! (afterburner launch's ranks without MPI, and the fault-tolerant replicas), while the
//! lighthouse keeps the control plane (membership, quorum, healing, where each member
//! listens).
//!
//! - All-reduce is a reduce-scatter then an all-gather: each member sends `2(n-1)/n` of the
//!   buffer whatever `n` is (a star's root moves `n` buffers). The sum of chunk `c` runs in a
//!   fixed order, the ring's, starting at the member after `c`'s position: run to run
//!   bitwise the same for the same members.
//! - Every frame carries the membership's generation ([`Reply::generation`]); a frame of an
//!   old generation is refused by name. A ring is built for one generation and rebuilt when
//!   the membership changes.
//! - Each read and write waits at most the given timeout (a quorum group gives half its
//!   collective timeout). The first failure is sticky:
//!   the ring drops its links (its neighbours see them close at once) and every later call on
//!   it returns the same error.
//!
//! [`QuorumGroup`]: crate::QuorumGroup
//! [`Reply::generation`]: afterburner_rendezvous::Reply::generation

mod algorithms;
mod endpoint;
mod frames;
mod paced;

use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::TcpStream;
use std::time::Duration;

pub(crate) use endpoint::Endpoint;
pub use paced::LINK_RATE_VAR;

use crate::ParallelError;

/// The links of a ring of two members or more.
struct Links {
    next: paced::Paced,
    prev: BufReader<TcpStream>,
    next_replica: usize,
    prev_replica: usize,
}

/// One member's place in a ring of one generation (see the module docs).
pub(crate) struct Ring {
    me: usize,
    members: Vec<usize>,
    position: usize,
    generation: u64,
    links: Option<Links>,
    /// The ring collectives called so far (the next one's number).
    ops: u64,
    timeout: Duration,
    /// Value bytes this member sent.
    sent: u64,
    failed: Option<ParallelError>,
}

impl Ring {
    /// `me`'s place in the ring of `members` (in ring order) for `generation`: connects to
    /// the next member at its address in `peers` and takes the previous member's connection
    /// from `endpoint`, each within `timeout`.
    pub fn build(
        endpoint: &Endpoint,
        me: usize,
        members: &[usize],
        generation: u64,
        peers: &BTreeMap<usize, String>,
        timeout: Duration,
    ) -> Result<Self, ParallelError> {
        let n = members.len();
        let Some(position) = members.iter().position(|m| *m == me) else {
            return Err(ParallelError::Collective {
                op: "ring",
                rank: me,
                reason: format!("replica {me} is not among the ring's members {members:?}"),
            });
        };
        let links = match n {
            1 => None,
            _ => Some(Self::link(
                endpoint,
                me,
                members[(position + 1) % n],
                members[(position + n - 1) % n],
                generation,
                peers,
                timeout,
            )?),
        };
        Ok(Self {
            me,
            members: members.to_vec(),
            position,
            generation,
            links,
            ops: 0,
            timeout,
            sent: 0,
            failed: None,
        })
    }

    fn link(
        endpoint: &Endpoint,
        me: usize,
        next_replica: usize,
        prev_replica: usize,
        generation: u64,
        peers: &BTreeMap<usize, String>,
        timeout: Duration,
    ) -> Result<Links, ParallelError> {
        let fail = |reason: String| ParallelError::Collective {
            op: "ring",
            rank: me,
            reason,
        };
        let address = peers.get(&next_replica).ok_or_else(|| {
            fail(format!(
                "no address for replica {next_replica}, the next in the ring"
            ))
        })?;
        let next = endpoint::connect(address, me, generation, timeout).map_err(|e| {
            fail(format!(
                "cannot connect to replica {next_replica} at {address}: {e}"
            ))
        })?;
        let prev = endpoint
            .take(prev_replica, generation, timeout)
            .map_err(|newer| {
                fail(match newer {
                    Some(newer) if newer > generation => format!(
                        "replica {prev_replica} did not connect for generation {generation} \
                         (a connection of generation {newer} came: this replica is behind)"
                    ),
                    _ => format!(
                        "replica {prev_replica}, the previous in the ring, did not connect \
                         within {} s",
                        timeout.as_secs_f64()
                    ),
                })
            })?;
        for stream in [&next, &prev] {
            let set = stream
                .set_read_timeout(Some(timeout))
                .and_then(|()| stream.set_write_timeout(Some(timeout)));
            set.map_err(|e| fail(format!("cannot set the ring's timeout: {e}")))?;
        }
        Ok(Links {
            next: paced::Paced::new(next, paced::link_rate()),
            prev: BufReader::with_capacity(1 << 20, prev),
            next_replica,
            prev_replica,
        })
    }

    /// The generation this ring serves.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The members, in ring order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Value bytes this member sent over the ring so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent
    }
}

#[cfg(test)]
mod tests;
