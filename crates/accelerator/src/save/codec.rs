//! The record codec of state files: how a Burn record (a model's, an optimizer's, a
//! scheduler's) becomes the bytes of its part file and back.

use std::path::Path;

use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::AccelerateError;

/// Full precision, named MessagePack: every part file in every precision.
type StateRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// Encodes a record the way state files hold it.
pub(crate) fn encode<B: AutodiffBackend, R: Record<B>>(
    record: R,
) -> Result<Vec<u8>, AccelerateError> {
    Recorder::<B>::record(&StateRecorder::default(), record, ()).map_err(|e| {
        AccelerateError::InvalidPart {
            part: String::new(),
            reason: format!("encoding: {e}"),
        }
    })
}

/// Decodes a record the way state files hold it (`path` names it in errors). The bytes passed
/// their checksum, so a record that does not decode is of another type (`what`: "model",
/// "optimizer state", ...): [`AccelerateError::Mismatched`], never damage.
pub(crate) fn decode_record<B: AutodiffBackend, R: Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
    path: &Path,
    what: &'static str,
) -> Result<R, AccelerateError> {
    Recorder::<B>::load(&StateRecorder::default(), bytes, device)
        .map_err(|e| AccelerateError::mismatched(path, what, e))
}
