//! The tensors inside a decoded record: found depth-first, read as f32 and written back in
//! their own dtype.

use burn::tensor::{DType, TensorData};
use rmpv::Value;

use crate::ParallelError;

/// The field `name` of a map value.
pub(super) fn field_mut<'a>(value: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    let Value::Map(entries) = value else {
        return None;
    };
    entries
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// Gets a state tensor's values and shape; returns the new ones.
pub(super) type TensorFn<'a> =
    dyn FnMut(Vec<f32>, Vec<usize>) -> Result<(Vec<f32>, Vec<usize>), ParallelError> + 'a;

/// Depth-first, in the record's own order (struct fields in declaration order).
pub(super) fn visit_tensors(value: &mut Value, f: &mut TensorFn<'_>) -> Result<(), ParallelError> {
    if let Some((data, dtype)) = as_tensor(value)? {
        let shape = data.shape.to_vec();
        let values = data
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ParallelError::Record(format!("optimizer state tensor: {e:?}")))?;
        let (values, shape) = f(values, shape)?;
        let data = TensorData::new(values, shape.clone()).convert_dtype(dtype);
        if let Some(bytes) = field_mut(value, "bytes") {
            *bytes = Value::Binary(data.bytes.to_vec());
        }
        if let Some(dims) = field_mut(value, "shape") {
            *dims = Value::Array(shape.into_iter().map(|d| Value::from(d as u64)).collect());
        }
        return Ok(());
    }
    match value {
        Value::Map(entries) => entries
            .iter_mut()
            .try_for_each(|(_, v)| visit_tensors(v, f)),
        Value::Array(items) => items.iter_mut().try_for_each(|v| visit_tensors(v, f)),
        _ => Ok(()),
    }
}

/// The tensor a `{bytes, shape, dtype}` map holds, with its dtype.
fn as_tensor(value: &Value) -> Result<Option<(TensorData, DType)>, ParallelError> {
    let Value::Map(entries) = value else {
        return Ok(None);
    };
    let get = |name: &str| entries.iter().find(|(k, _)| k.as_str() == Some(name));
    let (Some((_, bytes)), Some((_, shape)), Some((_, dtype))) =
        (get("bytes"), get("shape"), get("dtype"))
    else {
        return Ok(None);
    };
    let bad = |what: String| ParallelError::Record(format!("optimizer state tensor: {what}"));
    let dtype = match dtype.as_str() {
        Some("F32") => DType::F32,
        Some("F64") => DType::F64,
        Some("F16") => DType::F16,
        Some("BF16") => DType::BF16,
        other => {
            return Err(bad(format!(
                "dtype {other:?} is not a float dtype FSDP can gather"
            )));
        }
    };
    let bytes = match bytes {
        Value::Binary(b) => b.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|b| b as u8)
            .collect(),
        _ => return Err(bad("bytes are not binary".into())),
    };
    let shape: Vec<usize> = match shape {
        Value::Array(dims) => dims
            .iter()
            .filter_map(Value::as_u64)
            .map(|d| d as usize)
            .collect(),
        _ => return Err(bad("shape is not a list".into())),
    };
    Ok(Some((
        TensorData::from_bytes_vec(bytes, shape, dtype),
        dtype,
    )))
}
