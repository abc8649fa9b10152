//! Little-endian byte encoding shared by the lighthouse's TCP messages and the live state a
//! replica sends a joining one.

use crate::RendezvousError;

/// Appends `value`.
pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends `bytes` with their length.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends `values` with their count.
pub fn put_f32s(out: &mut Vec<u8>, values: &[f32]) {
    put_u64(out, values.len() as u64);
    values
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
}

/// Received bytes, read front to back; a short read is an error naming what was read.
pub struct Frame {
    what: &'static str,
    bytes: Vec<u8>,
    at: usize,
}

impl Frame {
    /// `bytes` holding `what` (for errors).
    pub fn new(what: &'static str, bytes: Vec<u8>) -> Self {
        Self { what, bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], RendezvousError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len());
        let Some(end) = end else {
            return Err(RendezvousError::Record(format!(
                "{} ends early ({} bytes, {} more wanted at byte {})",
                self.what,
                self.bytes.len(),
                n,
                self.at
            )));
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    /// Whether every byte was read.
    pub fn is_done(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, RendezvousError> {
        Ok(self.take(1)?[0])
    }

    /// The next u64.
    pub fn u64(&mut self) -> Result<u64, RendezvousError> {
        let mut value = [0u8; 8];
        value.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(value))
    }

    /// The next bytes written by [`put_bytes`].
    pub fn bytes(&mut self) -> Result<Vec<u8>, RendezvousError> {
        let len = self.u64()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    /// The next values written by [`put_f32s`].
    pub fn f32s(&mut self) -> Result<Vec<f32>, RendezvousError> {
        let len = self.u64()? as usize;
        let raw = self.take(len.saturating_mul(4))?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
