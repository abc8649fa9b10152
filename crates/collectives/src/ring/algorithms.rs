//! The ring's collectives: reduce-scatter and all-gather (an all-reduce is both), an all-gather
//! of blocks of any length, and a pipelined broadcast along the ring.

use std::ops::Range;
use std::time::Duration;

use super::frames::{self, Expected, Landing, Link};
use super::{Links, Ring};
use crate::ParallelError;

/// A broadcast moves in segments of this many values, so each hop forwards one while the next
/// arrives.
const SEGMENT: usize = 1 << 18;

/// Chunk `c` of `n` of a buffer of `len` values (balanced, in order).
pub(crate) fn chunk(len: usize, n: usize, c: usize) -> Range<usize> {
    c * len / n..(c + 1) * len / n
}

impl Ring {
    /// The sum (or mean) of `values` over the members, on every member.
    pub fn all_reduce(&mut self, values: Vec<f32>, mean: bool) -> Result<Vec<f32>, ParallelError> {
        self.run(|pass| {
            let mut values = values;
            pass.reduce_scatter(&mut values)?;
            let mine = chunk(values.len(), pass.n, pass.position);
            if mean {
                let count = pass.n as f32;
                values[mine].iter_mut().for_each(|v| *v /= count);
            }
            pass.all_gather_chunks(&mut values)?;
            Ok(values)
        })
    }

    /// This member's chunk (by ring position) of the sum (or mean) of `values`.
    pub fn reduce_scatter(
        &mut self,
        values: Vec<f32>,
        mean: bool,
    ) -> Result<Vec<f32>, ParallelError> {
        self.run(|pass| {
            let mut values = values;
            pass.reduce_scatter(&mut values)?;
            let mut mine = values[chunk(values.len(), pass.n, pass.position)].to_vec();
            if mean {
                let count = pass.n as f32;
                mine.iter_mut().for_each(|v| *v /= count);
            }
            Ok(mine)
        })
    }

    /// Every member's `values` (lengths may differ), in ring order.
    pub fn all_gather(&mut self, values: Vec<f32>) -> Result<Vec<Vec<f32>>, ParallelError> {
        self.run(|pass| pass.all_gather_blocks(values))
    }

    /// `root`'s values on every member (`values` is `Some` on the root alone).
    pub fn broadcast(
        &mut self,
        values: Option<Vec<f32>>,
        root: usize,
    ) -> Result<Vec<f32>, ParallelError> {
        let me = self.me;
        let Some(root) = self.members.iter().position(|m| *m == root) else {
            return Err(ParallelError::Collective {
                op: "ring broadcast",
                rank: me,
                reason: format!("the root, replica {root}, is not a member of the ring"),
            });
        };
        self.run(|pass| pass.broadcast(values, root))
    }

    /// Runs one ring collective as a [`Pass`]: refused with the first failure's error once one
    /// failed; a failure drops the links (the neighbours see them close) and is kept.
    fn run<T>(
        &mut self,
        call: impl FnOnce(&mut Pass<'_>) -> Result<T, ParallelError>,
    ) -> Result<T, ParallelError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let mut links = self.links.take();
        let mut pass = Pass {
            me: self.me,
            n: self.members.len(),
            position: self.position,
            generation: self.generation,
            op: self.ops,
            timeout: self.timeout,
            links: links.as_mut(),
            sent: &mut self.sent,
        };
        self.ops += 1;
        match call(&mut pass) {
            Ok(result) => {
                self.links = links;
                Ok(result)
            }
            Err(error) => {
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }
}

/// `values[send]` to read and `values[recv]` to write, two ranges that do not overlap.
fn disjoint(values: &mut [f32], send: Range<usize>, recv: Range<usize>) -> (&[f32], &mut [f32]) {
    if send.end <= recv.start {
        let (low, high) = values.split_at_mut(recv.start);
        (&low[send], &mut high[..recv.len()])
    } else {
        let (low, high) = values.split_at_mut(send.start);
        (&high[..send.len()], &mut low[recv])
    }
}

/// One ring collective in progress on one member.
struct Pass<'a> {
    me: usize,
    n: usize,
    position: usize,
    generation: u64,
    op: u64,
    timeout: Duration,
    /// `None` for a ring of one.
    links: Option<&'a mut Links>,
    sent: &'a mut u64,
}

impl Pass<'_> {
    fn header(&self, index: usize, count: Option<usize>) -> Expected {
        Expected {
            generation: self.generation,
            op: self.op,
            index: index as u64,
            count,
        }
    }

    /// The links to the next and the previous member (for errors), and the streams; `None`
    /// in a ring of one.
    fn neighbours(&mut self) -> Option<(Link, Link, &mut Links)> {
        let (me, timeout) = (self.me, self.timeout);
        let links = self.links.as_deref_mut()?;
        let link = |from| Link { me, from, timeout };
        Some((link(links.next_replica), link(links.prev_replica), links))
    }

    /// Sends `send` as block `sent` to the next member while receiving block `received` from
    /// the previous one (both at once: every member sends and receives in the same step).
    fn exchange(
        &mut self,
        (sent, send): (usize, &[f32]),
        (received, count): (usize, Option<usize>),
    ) -> Result<Vec<f32>, ParallelError> {
        let (header, expected) = (self.header(sent, None), self.header(received, count));
        let Some((to_next, from_prev, links)) = self.neighbours() else {
            return Ok(send.to_vec());
        };
        let (next, prev) = (&mut links.next, &mut links.prev);
        let (written, received) = std::thread::scope(|scope| {
            let writer = scope.spawn(move || frames::write_block(next, header, send));
            let received = frames::read_block(prev, expected, from_prev);
            let written = writer.join().unwrap_or_else(|_| {
                Err(std::io::Error::other("the ring's writer thread panicked"))
            });
            (written, received)
        });
        written.map_err(|e| frames::broken(e, to_next))?;
        *self.sent += 4 * send.len() as u64;
        received
    }

    /// Sends chunk `send` of `values` as block `sent` to the next member while block
    /// `received` from the previous one lands in chunk `recv` of `values` piece by piece, as
    /// it arrives (the two chunks differ in a ring of two or more).
    fn exchange_chunks(
        &mut self,
        values: &mut [f32],
        (sent, send): (usize, usize),
        (received, recv): (usize, usize),
        landing: Landing,
    ) -> Result<(), ParallelError> {
        let n = self.n;
        let (send, recv) = (chunk(values.len(), n, send), chunk(values.len(), n, recv));
        let (header, expected) = (
            self.header(sent, None),
            self.header(received, Some(recv.len())),
        );
        let Some((to_next, from_prev, links)) = self.neighbours() else {
            return Ok(()); // a ring of one has nothing to exchange
        };
        let (next, prev) = (&mut links.next, &mut links.prev);
        let sent_len = send.len();
        let (out, into) = disjoint(values, send, recv);
        let (written, received) = std::thread::scope(|scope| {
            let writer = scope.spawn(move || frames::write_block(next, header, out));
            let received = frames::read_block_into(prev, expected, from_prev, into, landing);
            let written = writer.join().unwrap_or_else(|_| {
                Err(std::io::Error::other("the ring's writer thread panicked"))
            });
            (written, received)
        });
        written.map_err(|e| frames::broken(e, to_next))?;
        *self.sent += 4 * sent_len as u64;
        received
    }

    /// Leaves this member's chunk (by position) summed over every member, in the ring's order:
    /// each received partial sum is added to this member's values as it arrives.
    fn reduce_scatter(&mut self, values: &mut [f32]) -> Result<(), ParallelError> {
        let (n, p) = (self.n, self.position);
        for step in 0..n.saturating_sub(1) {
            let send = (p + n - step - 1) % n;
            let recv = (p + 2 * n - step - 2) % n;
            // This member's values plus the partial sum so far: the ring's fixed order.
            self.exchange_chunks(
                values,
                (step * n + send, send),
                (step * n + recv, recv),
                Landing::Add,
            )?;
        }
        Ok(())
    }

    /// Gives every member every chunk, each member holding its own (by position) at the start.
    fn all_gather_chunks(&mut self, values: &mut [f32]) -> Result<(), ParallelError> {
        let (n, p) = (self.n, self.position);
        for step in 0..n.saturating_sub(1) {
            let send = (p + n - step) % n;
            let recv = (p + 2 * n - step - 1) % n;
            self.exchange_chunks(
                values,
                (n * n + step * n + send, send),
                (n * n + step * n + recv, recv),
                Landing::Copy,
            )?;
        }
        Ok(())
    }

    /// Every member's block, in ring order.
    fn all_gather_blocks(&mut self, mine: Vec<f32>) -> Result<Vec<Vec<f32>>, ParallelError> {
        let (n, p) = (self.n, self.position);
        let mut blocks: Vec<Vec<f32>> = vec![Vec::new(); n];
        blocks[p] = mine;
        for step in 0..n.saturating_sub(1) {
            let send = (p + n - step) % n;
            let recv = (p + 2 * n - step - 1) % n;
            let sent = std::mem::take(&mut blocks[send]);
            blocks[recv] = self.exchange(
                (n * n + step * n + send, &sent),
                (n * n + step * n + recv, None),
            )?;
            blocks[send] = sent;
        }
        Ok(blocks)
    }

    /// The values of the member at position `root`, passed along the ring in segments.
    fn broadcast(
        &mut self,
        values: Option<Vec<f32>>,
        root: usize,
    ) -> Result<Vec<f32>, ParallelError> {
        let (n, p, me) = (self.n, self.position, self.me);
        if (p == root) != values.is_some() {
            return Err(ParallelError::Mismatch {
                rank: me,
                reason: format!(
                    "broadcast: values must be given on the root (position {root}) and only there"
                ),
            });
        }
        let (generation, op) = (self.generation, self.op);
        let header = |index: usize, count| Expected {
            generation,
            op,
            index: index as u64,
            count,
        };
        let mut sent = 0;
        let Some((to_next, from_prev, links)) = self.neighbours() else {
            return Ok(values.unwrap_or_default());
        };
        let forwards = (p + 1) % n != root;
        let len = match &values {
            Some(values) => values.len(),
            None => frames::read_length(&mut links.prev, header(0, None), from_prev)? as usize,
        };
        if forwards {
            frames::write_length(&mut links.next, header(0, None), len as u64)
                .map_err(|e| frames::broken(e, to_next))?;
        }
        let mut out = values.unwrap_or_default();
        let segments = len.div_ceil(SEGMENT);
        for segment in 0..segments {
            let range = segment * SEGMENT..((segment + 1) * SEGMENT).min(len);
            if p != root {
                let expected = header(1 + segment, Some(range.len()));
                out.extend(frames::read_block(&mut links.prev, expected, from_prev)?);
            }
            if forwards {
                frames::write_block(
                    &mut links.next,
                    header(1 + segment, None),
                    &out[range.clone()],
                )
                .map_err(|e| frames::broken(e, to_next))?;
                sent += 4 * range.len() as u64;
            }
        }
        *self.sent += sent;
        Ok(out)
    }
}
