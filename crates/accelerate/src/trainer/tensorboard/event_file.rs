//! TensorBoard's event file format, written by hand (no TensorFlow, no protobuf crate): a
//! TFRecord stream of `Event` protocol buffers.
//!
//! - A record: the data's length (u64, little endian), its masked CRC-32C (u32), the data,
//!   the data's masked CRC-32C.
//! - An `Event` (tensorflow/core/util/event.proto): `wall_time` (1, double), `step` (2, int64),
//!   then one of `file_version` (3, string), `summary` (5) or `session_log` (7).
//! - A `Summary` holds `Value`s: `tag` (1, string) and `simple_value` (2, float).
//! - A `SessionLog` with `status` START (1) at step N tells TensorBoard to drop what an earlier
//!   run wrote in this directory past step N (a resumed or restarted run).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::AccelerateError;

/// Event files this process has opened (the last part of their names).
static FILES_OPENED: AtomicU64 = AtomicU64::new(0);

/// An open event file, appended to record by record (each flushed).
pub(crate) struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
    /// Creates `events.out.tfevents.<seconds>.<host>.<pid>.<n>` in `dir` (created if needed;
    /// `n` counts this process's files, so two runs in one second never share a file; names
    /// sort in creation order, as TensorBoard reads them) and writes its first event, the
    /// file version.
    pub(crate) fn create(dir: &Path) -> Result<Self, AccelerateError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| AccelerateError::io("create logging_dir", dir, e))?;
        let name = format!(
            "events.out.tfevents.{}.{}.{}.{:06}",
            now().floor() as u64,
            host(),
            std::process::id(),
            FILES_OPENED.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = File::create_new(&path)
            .map_err(|e| AccelerateError::io("create TensorBoard event file", &path, e))?;
        let mut events = Self { path, file };
        events.write_event(0, &string_field(3, "brain.Event:2"))?;
        Ok(events)
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A summary of scalars (`tag`, value) at `step`.
    pub(crate) fn scalars(
        &mut self,
        step: u64,
        values: &[(String, f64)],
    ) -> Result<(), AccelerateError> {
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut entry = string_field(1, tag);
            entry.push(0x15); // field 2, 32-bit
            entry.extend_from_slice(&(*value as f32).to_le_bytes());
            summary.extend(bytes_field(1, &entry));
        }
        self.write_event(step, &bytes_field(5, &summary))
    }

    /// A session start at `step`: TensorBoard drops what earlier runs in this directory wrote
    /// past it.
    pub(crate) fn session_start(&mut self, step: u64) -> Result<(), AccelerateError> {
        let status_start = [0x08, 0x01]; // field 1, varint: START
        self.write_event(step, &bytes_field(7, &status_start))
    }

    /// One `Event` with the wall time, `step` and `payload` (its other fields, encoded).
    fn write_event(&mut self, step: u64, payload: &[u8]) -> Result<(), AccelerateError> {
        let mut event = vec![0x09]; // field 1, 64-bit
        event.extend_from_slice(&now().to_le_bytes());
        event.push(0x10); // field 2, varint
        varint(step, &mut event);
        event.extend_from_slice(payload);
        let record = record(&event);
        self.file
            .write_all(&record)
            .and_then(|()| self.file.flush())
            .map_err(|e| AccelerateError::io("write TensorBoard event file", &self.path, e))
    }
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name, as event file names carry it (letters, digits, `-` and `_` only).
fn host() -> String {
    let name = std::fs::read_to_string("/etc/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    match name.is_empty() {
        true => "localhost".into(),
        false => name,
    }
}

/// `data` framed as one TFRecord.
pub(crate) fn record(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// A length-delimited field (`number`, wire type 2).
fn bytes_field(number: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 4);
    varint(number << 3 | 2, &mut out);
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// A string field.
fn string_field(number: u64, text: &str) -> Vec<u8> {
    bytes_field(number, text.as_bytes())
}

/// A protocol buffer varint.
fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The CRC-32C of `data`, masked as TFRecord stores it.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli), bit by bit (event files are small).
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = match crc & 1 {
                1 => (crc >> 1) ^ 0x82F6_3B78,
                _ => crc >> 1,
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_varints_match_their_specifications() {
        // The check value of CRC-32C (RFC 3720's polynomial).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let mut out = Vec::new();
        varint(300, &mut out);
        assert_eq!(out, [0xAC, 0x02]);
        // A record frames its data with its length and both checksums.
        let framed = record(b"abc");
        assert_eq!(framed.len(), 8 + 4 + 3 + 4);
        assert_eq!(&framed[..8], &3u64.to_le_bytes());
        assert_eq!(&framed[12..15], b"abc");
        assert_eq!(&framed[15..], &masked_crc(b"abc").to_le_bytes());
    }
}
