//! Device memory from Burn's GPU backends (CubeCL's memory pools), next to the CPU heap the
//! counting allocator measures. Burn 0.21 has no backend-generic call for it: the figures come
//! from the CubeCL client of a tensor on the device, for the cuda and wgpu backends.

use serde::Serialize;

use burn::tensor::backend::Backend;

/// A device's memory as Burn's pools see it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DeviceMemory {
    /// Bytes in live tensors (without padding).
    pub in_use_bytes: u64,
    /// Bytes the pools hold on the device (live, padding and free pages): the device's peak
    /// footprint, as pools grow and are only trimmed on a cleanup.
    pub reserved_bytes: u64,
}

impl DeviceMemory {
    /// "in use / reserved MiB".
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "{:.0} / {:.0} MiB",
            mib(self.in_use_bytes),
            mib(self.reserved_bytes)
        )
    }
}

/// The memory of `device`, where backend `I` is one of Burn's CubeCL backends compiled in
/// (cuda, wgpu); `None` elsewhere (flex: see the heap figures).
pub fn device_memory<I: Backend>(device: &I::Device) -> Option<DeviceMemory> {
    // A fused backend queues ops: run what is queued so the pools hold what is alive.
    I::sync(device).ok();
    #[cfg(feature = "cuda")]
    if let Some(m) = cube::<I, burn_cubecl::cubecl::cuda::CudaRuntime>(device) {
        return Some(m);
    }
    #[cfg(feature = "wgpu")]
    if let Some(m) = cube::<I, burn_cubecl::cubecl::wgpu::WgpuRuntime>(device) {
        return Some(m);
    }
    let _ = device;
    None
}

/// The figures of CubeCL runtime `R`'s client, when `I`'s devices are `R`'s (fused or not:
/// the client is the device's, whatever wraps the backend).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn cube<I: Backend, R: burn_cubecl::CubeRuntime>(device: &I::Device) -> Option<DeviceMemory> {
    let device = (device as &dyn std::any::Any).downcast_ref::<R::Device>()?;
    let usage = R::client(device).memory_usage().ok()?;
    Some(DeviceMemory {
        in_use_bytes: usage.bytes_in_use,
        reserved_bytes: usage.bytes_reserved,
    })
}
