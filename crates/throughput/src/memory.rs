//! Memory: a GPU device's as CubeCL's pools see it (with the `cuda` or `wgpu` feature), and
//! the process's peak, which is what a CPU run's device memory is. Burn 0.21 has no
//! backend-generic call for device memory: the figures come from the CubeCL client of the
//! device, for the cuda and wgpu backends.

use burn::tensor::backend::Backend;
use serde::Serialize;

/// A device's memory as Burn's pools see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// The memory of `device`, where backend `B`'s devices are those of one of Burn's CubeCL
/// backends compiled in (feature `cuda` or `wgpu`; fused or not, autodiff or not); `None`
/// elsewhere (the CPU: see [`peak_memory_bytes`]). Waits for the device's queued work first
/// (a `Backend::sync`, only where there is device memory to read).
pub fn device_memory<B: Backend>(device: &B::Device) -> Option<DeviceMemory> {
    #[cfg(feature = "cuda")]
    if let Some(m) = cube::<B, burn_cubecl::cubecl::cuda::CudaRuntime>(device) {
        return Some(m);
    }
    #[cfg(feature = "wgpu")]
    if let Some(m) = cube::<B, burn_cubecl::cubecl::wgpu::WgpuRuntime>(device) {
        return Some(m);
    }
    let _ = device;
    None
}

/// The figures of CubeCL runtime `R`'s client, when `B`'s devices are `R`'s (the client is
/// the device's, whatever wraps the backend).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn cube<B: Backend, R: burn_cubecl::CubeRuntime>(device: &B::Device) -> Option<DeviceMemory> {
    let cube_device = (device as &dyn std::any::Any).downcast_ref::<R::Device>()?;
    // A fused backend queues ops: run what is queued so the pools hold what is alive.
    B::sync(device).ok();
    let usage = R::client(cube_device).memory_usage().ok()?;
    Some(DeviceMemory {
        in_use_bytes: usage.bytes_in_use,
        reserved_bytes: usage.bytes_reserved,
    })
}

/// The most memory this process has held resident since it started (Linux's `VmHWM`), in
/// bytes; `None` where the system does not say (not Linux).
pub fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cpu_has_no_device_memory() {
        let device = Default::default();
        assert_eq!(super::device_memory::<burn::backend::Flex>(&device), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_peak_covers_what_was_allocated() {
        let block = vec![1u8; 64 << 20];
        let peak = super::peak_memory_bytes().expect("Linux says");
        assert!(peak >= 64 << 20, "{peak}");
        drop(block);
    }
}
