//! [`OuterDtype`]: how Streaming DiLoCo sends outer gradients. `f32` all-reduces them; the
//! low-precision formats all-gather every rank's encoded gradient and each rank decodes and
//! sums in f32 (a half-precision sum over ranks would round at every addition).

use afterburner_parallel::{ParallelError, ProcessGroup, ReduceOp, spellings};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use serde_with::{DeserializeFromStr, SerializeDisplay};

/// Values per int8 chunk sharing one scale.
pub const INT8_CHUNK: usize = 256;

/// The format of the outer gradients on the wire.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    SerializeDisplay,
    DeserializeFromStr,
    strum::Display,
    strum::EnumString,
    strum::EnumIter,
    strum::EnumMessage,
)]
#[strum(
    ascii_case_insensitive,
    parse_err_ty = ParallelError,
    parse_err_fn = OuterDtype::unknown
)]
pub enum OuterDtype {
    /// 4 bytes a value, one all-reduce (exact mean).
    #[default]
    #[strum(to_string = "f32", serialize = "fp32", serialize = "float32")]
    F32,
    /// 2 bytes a value (bfloat16), all-gathered, summed in f32.
    #[strum(to_string = "bf16", serialize = "bfloat16")]
    Bf16,
    /// 2 bytes a value (IEEE half), all-gathered, summed in f32.
    #[strum(
        to_string = "f16",
        serialize = "fp16",
        serialize = "float16",
        serialize = "half"
    )]
    F16,
    /// Symmetric int8 with one f32 scale per 256 values (`max |x| / 127`), three codes packed
    /// exactly into one f32 on the wire: about 1.35 bytes a value. Error per value at most
    /// `max |x| / 254` of its chunk, per rank.
    #[strum(to_string = "int8", serialize = "i8")]
    Int8,
}

impl OuterDtype {
    fn unknown(given: &str) -> ParallelError {
        ParallelError::InvalidConfig {
            field: "diloco.outer_dtype",
            value: given.into(),
            expected: format!("one of: {}", spellings::<Self>()),
        }
    }

    /// Bytes a value costs on the wire (the int8 scales included, for full chunks).
    pub fn bytes_per_value(self) -> f64 {
        match self {
            Self::F32 => 4.0,
            Self::Bf16 | Self::F16 => 2.0,
            Self::Int8 => 4.0 / 3.0 + 4.0 / INT8_CHUNK as f64,
        }
    }

    /// The mean over the ranks of `values` (the same length on every rank), sent in this
    /// format. Every rank calls it.
    pub fn mean<B: Backend, G: ProcessGroup<B> + ?Sized>(
        self,
        group: &G,
        values: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let half = match self {
            Self::F32 => return group.all_reduce(values, ReduceOp::Mean),
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
            Self::Int8 => return int8_mean(group, values),
        };
        let dtype = values.dtype();
        let parts = group.all_gather(values.cast(half))?;
        let world = parts.len().max(1) as f64;
        let sum = parts
            .into_iter()
            .map(|part| part.cast(DType::F32))
            .reduce(|a, b| a + b)
            .ok_or_else(|| ParallelError::Record("an all-gather returned nothing".into()))?;
        Ok(sum.div_scalar(world).cast(dtype))
    }
}

/// The int8 mean: each rank's values encoded, all-gathered, decoded and summed in f32.
fn int8_mean<B: Backend, G: ProcessGroup<B> + ?Sized>(
    group: &G,
    values: Tensor<B, 1>,
) -> Result<Tensor<B, 1>, ParallelError> {
    let (device, dtype) = (values.device(), values.dtype());
    let host = values
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ParallelError::Record(format!("outer gradient: {e:?}")))?;
    let len = host.len();
    let wire = encode_int8(&host);
    let sent = Tensor::<B, 1>::from_data(TensorData::new(wire.clone(), [wire.len()]), &device);
    let mut sum = vec![0f32; len];
    let parts = group.all_gather(sent)?;
    // Divided by the parts received: a fault-tolerant group gathers the replicas present.
    let count = parts.len().max(1) as f32;
    for part in parts {
        let part = part
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ParallelError::Record(format!("outer gradient: {e:?}")))?;
        let decoded = decode_int8(&part, len)?;
        sum.iter_mut().zip(decoded).for_each(|(s, v)| *s += v);
    }
    sum.iter_mut().for_each(|s| *s /= count);
    Ok(Tensor::<B, 1>::from_data(TensorData::new(sum, [len]), &device).cast(dtype))
}

/// `values` as int8 codes (offset to 0..=254, three packed exactly in one f32) followed by one
/// f32 scale per chunk.
pub(crate) fn encode_int8(values: &[f32]) -> Vec<f32> {
    let scales: Vec<f32> = values
        .chunks(INT8_CHUNK)
        .map(|chunk| chunk.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
        .collect();
    let codes: Vec<u32> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let scale = scales[i / INT8_CHUNK];
            let q = if scale > 0.0 && scale.is_finite() {
                (v / scale).round().clamp(-127.0, 127.0)
            } else {
                0.0
            };
            (q as i32 + 127) as u32
        })
        .collect();
    let mut wire: Vec<f32> = codes
        .chunks(3)
        .map(|c| {
            let at = |i: usize| c.get(i).copied().unwrap_or(127);
            (at(0) * 65_536 + at(1) * 256 + at(2)) as f32
        })
        .collect();
    wire.extend(scales);
    wire
}

/// The `len` values [`encode_int8`] encoded in `wire`.
pub(crate) fn decode_int8(wire: &[f32], len: usize) -> Result<Vec<f32>, ParallelError> {
    let packed = len.div_ceil(3);
    let chunks = len.div_ceil(INT8_CHUNK);
    if wire.len() != packed + chunks {
        return Err(ParallelError::Mismatch {
            rank: 0,
            reason: format!(
                "an int8 outer gradient of {} wire values for {len} values",
                wire.len()
            ),
        });
    }
    let (codes, scales) = wire.split_at(packed);
    Ok((0..len)
        .map(|i| {
            let word = codes[i / 3] as u32;
            let code = (word >> (8 * (2 - i % 3))) & 0xFF;
            (code as f32 - 127.0) * scales[i / INT8_CHUNK]
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_round_trip_stays_within_its_bound() {
        // Values of very different sizes in different chunks: each chunk has its own scale.
        let values: Vec<f32> = (0..1000)
            .map(|i| {
                let x = ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
                if i < 256 { x * 1e-4 } else { x * 3.0 }
            })
            .collect();
        let wire = encode_int8(&values);
        assert_eq!(
            wire.len(),
            334 + 4,
            "1000 codes packed 3 to a value, 4 scales"
        );
        let back = decode_int8(&wire, values.len()).unwrap();
        for (c, (chunk, got)) in values
            .chunks(INT8_CHUNK)
            .zip(back.chunks(INT8_CHUNK))
            .enumerate()
        {
            let bound = chunk.iter().fold(0f32, |m, v| m.max(v.abs())) / 254.0;
            let err = chunk
                .iter()
                .zip(got)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= bound * 1.0001, "chunk {c}: {err} > {bound}");
        }
        assert!(decode_int8(&wire[1..], values.len()).is_err());
    }

    #[test]
    fn names_parse_and_bad_ones_are_named() {
        assert_eq!("bf16".parse::<OuterDtype>().unwrap(), OuterDtype::Bf16);
        assert_eq!("INT8".parse::<OuterDtype>().unwrap(), OuterDtype::Int8);
        let err = "int4".parse::<OuterDtype>().unwrap_err().to_string();
        assert!(
            err.contains("diloco.outer_dtype") && err.contains("int8"),
            "{err}"
        );
    }
}
