//! DDP's gradient buckets: the parameters grouped, last ones first, into buffers of at most
//! `bucket_cap_mb` (PyTorch DDP's 25 MiB by default), each all-reduced with one presence flag
//! per parameter. One bucket holds the whole model when it fits: the buffer is then exactly
//! the one-buffer reduction's.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::{ParallelError, ProcessGroup, ReduceOp};

/// PyTorch DDP's default bucket size.
pub const DEFAULT_BUCKET_CAP_MB: f64 = 25.0;

/// The buckets over parameters of `lens` values (f32), `cap_mb` MiB each at most: the last
/// parameters first (the order backward produces gradients in), each bucket's parameters in
/// visit order. A parameter larger than the cap gets a bucket of its own.
pub(crate) fn plan(lens: &[usize], cap_mb: f64) -> Vec<Vec<usize>> {
    let cap = ((cap_mb * 1024.0 * 1024.0 / 4.0) as usize).max(1);
    let mut buckets = Vec::new();
    let (mut current, mut size) = (Vec::new(), 0);
    for index in (0..lens.len()).rev() {
        if !current.is_empty() && size + lens[index] > cap {
            buckets.push(std::mem::take(&mut current));
            size = 0;
        }
        current.push(index);
        size += lens[index];
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets.iter_mut().for_each(|bucket| bucket.reverse());
    buckets
}

/// One bucket summed over the ranks: its parameters' summed values (f32, flat) and their
/// presence counts (how many ranks had a gradient), still on the device.
pub(crate) struct Summed<I: Backend> {
    pub(crate) params: Vec<(usize, Tensor<I, 1>)>,
    pub(crate) flags: Tensor<I, 1>,
}

/// All-reduces one bucket: `parts` are its parameters' flat f32 gradients (zeros where this
/// rank has none), `present` whether this rank has each, in the bucket's order.
pub(crate) fn all_reduce_bucket<I: Backend, G: ProcessGroup<I> + ?Sized>(
    group: &G,
    bucket: &[usize],
    parts: Vec<Tensor<I, 1>>,
    present: &[bool],
) -> Result<Summed<I>, ParallelError> {
    let device = parts[0].device();
    let lens: Vec<usize> = parts.iter().map(|p| p.dims()[0]).collect();
    let flags: Vec<f32> = present.iter().map(|p| f32::from(u8::from(*p))).collect();
    let flags = Tensor::<I, 1>::from_floats(flags.as_slice(), &device);
    let summed = group.all_reduce(Tensor::cat([parts, vec![flags]].concat(), 0), ReduceOp::Sum)?;
    let mut offset = 0;
    let params = bucket
        .iter()
        .zip(&lens)
        .map(|(&index, &len)| {
            let values = summed.clone().narrow(0, offset, len);
            offset += len;
            (index, values)
        })
        .collect();
    Ok(Summed {
        params,
        flags: summed.narrow(0, offset, bucket.len()),
    })
}

/// Every bucket of `plan`, in order: `parts` are the parameters' flat f32 gradients in visit
/// order (zeros where this rank has none), `locally` whether this rank has each.
pub(crate) fn all_reduce_buckets<I: Backend, G: ProcessGroup<I> + ?Sized>(
    group: &G,
    plan: &[Vec<usize>],
    parts: Vec<Tensor<I, 1>>,
    locally: &[bool],
) -> Result<Vec<Summed<I>>, ParallelError> {
    let mut parts: Vec<Option<Tensor<I, 1>>> = parts.into_iter().map(Some).collect();
    plan.iter()
        .map(|bucket| {
            let bucket_parts = bucket
                .iter()
                .map(|&i| parts[i].take().expect("one bucket each"));
            let present: Vec<bool> = bucket.iter().map(|&i| locally[i]).collect();
            all_reduce_bucket(group, bucket, bucket_parts.collect(), &present)
        })
        .collect()
}

/// Whether some rank had a gradient for each of `count` parameters: where this rank had all
/// of them, every one (no read); else the buckets' summed flags, read in one go.
pub(crate) fn present_anywhere<I: Backend>(
    buckets: &[Vec<usize>],
    flags: Vec<Tensor<I, 1>>,
    locally: &[bool],
) -> Vec<bool> {
    if locally.iter().all(|p| *p) {
        return vec![true; locally.len()];
    }
    let read = Tensor::cat(flags, 0).into_data().convert::<f32>();
    let read = read.to_vec::<f32>().unwrap_or_default();
    let mut anywhere = vec![false; locally.len()];
    for (&index, flag) in buckets.iter().flatten().zip(read) {
        anywhere[index] = flag > 0.0;
    }
    anywhere
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn buckets_take_the_last_parameters_first_up_to_the_cap() {
        // 1 MiB = 262,144 f32 values.
        let mib = 262_144;
        let lens = [mib, mib / 2, mib / 2, 3 * mib, mib / 4];
        assert_eq!(plan(&lens, 25.0), vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(
            plan(&lens, 1.0),
            vec![vec![4], vec![3], vec![1, 2], vec![0]]
        );
        assert_eq!(plan(&lens, 2.0), vec![vec![4], vec![3], vec![0, 1, 2]]);
        assert_eq!(plan(&[], 25.0), Vec::<Vec<usize>>::new());
    }
}
