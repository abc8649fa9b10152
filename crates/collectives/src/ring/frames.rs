//! A ring's frames: a 32-byte header (the membership's generation, the ring collective's
//! number, the block's index, its value count) and the values as little-endian f32. The
//! receiver checks the header against what it expects and refuses, by name, a frame of an old
//! generation, of another collective, or of another length.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::ParallelError;

/// What a receiver expects of the next frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected {
    /// The ring's generation.
    pub generation: u64,
    /// The ring collective's number (counted on every member alike).
    pub op: u64,
    /// The block's index.
    pub index: u64,
    /// The value count, when the receiver knows it.
    pub count: Option<usize>,
}

/// The most values one frame may carry (a corrupt count must not allocate the machine away).
const MAX_VALUES: u64 = 1 << 32;

/// Writes one frame of `values` under `header`'s generation, collective and index.
pub(crate) fn write_block(
    writer: &mut impl Write,
    header: Expected,
    values: &[f32],
) -> io::Result<()> {
    let mut out = header_bytes(header, values.len() as u64, PIECE.min(values.len()));
    // In pieces that stay in cache: the values are converted as they go out.
    for piece in values.chunks(PIECE) {
        piece
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        writer.write_all(&out)?;
        out.clear();
    }
    writer.write_all(&out)?;
    writer.flush()
}

/// Values converted and moved at a time (256 KiB).
const PIECE: usize = 1 << 16;

/// A header carrying `count`, in a buffer with room for `values` values after it.
fn header_bytes(header: Expected, count: u64, values: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 4 * values);
    for field in [header.generation, header.op, header.index, count] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out
}

/// Who reads a frame from whom, for errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    /// This replica.
    pub me: usize,
    /// The replica the frame comes from.
    pub from: usize,
    /// The per-call timeout.
    pub timeout: Duration,
}

/// Reads one frame and checks it against `expected`.
pub(crate) fn read_block(
    reader: &mut impl Read,
    expected: Expected,
    link: Link,
) -> Result<Vec<f32>, ParallelError> {
    let count = read_header(reader, expected, link)?;
    let Expected { op, index, .. } = expected;
    let Link { me, from, .. } = link;
    if count > MAX_VALUES || expected.count.is_some_and(|c| c as u64 != count) {
        return Err(ParallelError::Mismatch {
            rank: me,
            reason: format!(
                "replica {from} sent {count} values for block {index} of ring collective {op}, \
                 {} expected (the members called it with different lengths)",
                expected
                    .count
                    .map_or("at most 2^32".into(), |c| c.to_string())
            ),
        });
    }
    let count = count as usize;
    let mut values = Vec::with_capacity(count);
    let mut raw = vec![0u8; 4 * PIECE.min(count)];
    while values.len() < count {
        let piece = &mut raw[..4 * PIECE.min(count - values.len())];
        reader.read_exact(piece).map_err(|e| broken(e, link))?;
        values.extend(
            piece
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    Ok(values)
}

/// How a received value lands in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landing {
    /// Replaces the value there.
    Copy,
    /// Is added to the value there (`there += received`, the ring's fixed order).
    Add,
}

/// Reads one frame of `into.len()` values, checked against `expected`, straight into `into`
/// piece by piece as it arrives: each piece is summed or copied while the next one is still
/// on its way (the receive and the sum overlap), with no buffer of the whole block.
pub(crate) fn read_block_into(
    reader: &mut impl Read,
    expected: Expected,
    link: Link,
    into: &mut [f32],
    landing: Landing,
) -> Result<(), ParallelError> {
    let count = read_header(reader, expected, link)?;
    if count != into.len() as u64 {
        let Expected { op, index, .. } = expected;
        return Err(ParallelError::Mismatch {
            rank: link.me,
            reason: format!(
                "replica {} sent {count} values for block {index} of ring collective {op}, {} \
                 expected (the members called it with different lengths)",
                link.from,
                into.len()
            ),
        });
    }
    let mut raw = vec![0u8; 4 * PIECE.min(into.len())];
    for piece in into.chunks_mut(PIECE) {
        let bytes = &mut raw[..4 * piece.len()];
        reader.read_exact(bytes).map_err(|e| broken(e, link))?;
        let received = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        match landing {
            Landing::Copy => piece.iter_mut().zip(received).for_each(|(v, r)| *v = r),
            Landing::Add => piece.iter_mut().zip(received).for_each(|(v, r)| *v += r),
        }
    }
    Ok(())
}

/// The error of a link that failed while reading from or writing to `link.from`.
pub(crate) fn broken(error: io::Error, link: Link) -> ParallelError {
    let Link { me, from, timeout } = link;
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ParallelError::Collective {
            op: "ring",
            rank: me,
            reason: format!(
                "replica {from} exchanged nothing within {} s (it hung, or is too slow for \
                 the collective timeout)",
                timeout.as_secs_f64()
            ),
        },
        _ => ParallelError::Collective {
            op: "ring",
            rank: me,
            reason: format!(
                "the link with replica {from} broke ({error}): it failed or was killed"
            ),
        },
    }
}

/// Writes a frame that carries only a count (a broadcast's length): a header whose value
/// count is `count`, with no values after it.
pub(crate) fn write_length(
    writer: &mut impl Write,
    header: Expected,
    count: u64,
) -> io::Result<()> {
    writer.write_all(&header_bytes(header, count, 0))?;
    writer.flush()
}

/// Reads a frame written by [`write_length`] and returns its count.
pub(crate) fn read_length(
    reader: &mut impl Read,
    expected: Expected,
    link: Link,
) -> Result<u64, ParallelError> {
    read_header(reader, expected, link)
}

/// Reads a header, refuses one of another generation, collective or block than `expected`,
/// and returns its value count.
fn read_header(
    reader: &mut impl Read,
    expected: Expected,
    link: Link,
) -> Result<u64, ParallelError> {
    let mut header = [0u8; 32];
    reader
        .read_exact(&mut header)
        .map_err(|e| broken(e, link))?;
    let field = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().unwrap());
    let (generation, op, index) = (field(0), field(1), field(2));
    let Link { me, from, .. } = link;
    if generation != expected.generation {
        return Err(ParallelError::Collective {
            op: "ring",
            rank: me,
            reason: format!(
                "refused a frame of generation {generation} from replica {from}: this ring is \
                 generation {} (the frame comes from an old membership)",
                expected.generation
            ),
        });
    }
    if op != expected.op || index != expected.index {
        return Err(ParallelError::Mismatch {
            rank: me,
            reason: format!(
                "replica {from} sent block {index} of ring collective {op}, this replica \
                 expected block {} of collective {} (the members called different collectives)",
                expected.index, expected.op
            ),
        });
    }
    Ok(field(3))
}
