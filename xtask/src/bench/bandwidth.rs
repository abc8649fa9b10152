//! All-reduce bandwidth of the in-process engine (burn-collective) over every device of a
//! backend, as NCCL's tests report it: algorithm bandwidth (bytes / time) and bus bandwidth
//! (algorithm bandwidth x 2(n-1)/n, comparable across device counts).

use std::time::Instant;

use afterburner::parallel::{LaunchConfig, ProcessGroup, ReduceOp, launch, local_devices};
use burn::tensor::Tensor;
use burn::tensor::backend::{Backend, DeviceOps};
use serde::Serialize;

/// One measured all-reduce.
#[derive(Debug, Clone, Serialize)]
pub struct Bandwidth {
    /// Ranks (devices; 2 workers sharing the device on a one-device backend).
    pub ranks: usize,
    /// Whether the ranks share one device.
    pub shared_device: bool,
    /// f32 payload per rank, MiB.
    pub mib: f64,
    /// Mean time of one all-reduce (slowest rank), ms.
    pub ms: f64,
    /// Payload bytes / time, GB/s.
    pub algorithm_gb_s: f64,
    /// Algorithm bandwidth x 2(n-1)/n, GB/s.
    pub bus_gb_s: f64,
}

/// Times `reps` all-reduces (sum) of `mib` MiB of f32 on every device of `I`, after one
/// warm-up.
pub fn all_reduce<I: Backend>(mib: usize, reps: usize) -> Result<Bandwidth, String> {
    let count = I::device_count(I::Device::default().id().type_id);
    let ranks = count.max(2);
    let len = mib * (1 << 20) / 4;
    let seconds = all_reduce_seconds::<I>(ranks, len, reps)?;
    let bytes = (len * 4) as f64;
    let algorithm = bytes / seconds / 1e9;
    Ok(Bandwidth {
        ranks,
        shared_device: count <= 1,
        mib: mib as f64,
        ms: seconds * 1e3,
        algorithm_gb_s: algorithm,
        bus_gb_s: algorithm * 2.0 * (ranks as f64 - 1.0) / ranks as f64,
    })
}

/// Mean seconds of one all-reduce (sum) of `len` f32 over `ranks` in-process workers (on
/// distinct devices where the backend has them), the slowest rank's, after one warm-up.
pub fn all_reduce_seconds<I: Backend>(
    ranks: usize,
    len: usize,
    reps: usize,
) -> Result<f64, String> {
    let devices = local_devices::<I>(ranks).map_err(|e| e.to_string())?;
    let times = launch::<I, _, String, _>(devices, LaunchConfig::default(), move |g| {
        let t = Tensor::<I, 1>::ones([len], g.device());
        let warm = g
            .all_reduce(t.clone(), ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        I::sync(g.device()).ok();
        drop(warm);
        let start = Instant::now();
        for _ in 0..reps {
            let r = g
                .all_reduce(t.clone(), ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            I::sync(g.device()).ok();
            drop(r);
        }
        Ok(start.elapsed().as_secs_f64() / reps as f64)
    })
    .map_err(|e| e.to_string())?;
    Ok(times.into_iter().fold(0.0, f64::max))
}
