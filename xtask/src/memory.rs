//! Device memory from Burn's GPU backends (CubeCL's memory pools), next to the CPU heap the
//! counting allocator measures: afterburner's own reader (`afterburner::throughput`), which
//! the Trainer's `peak_memory_mib` uses too.

pub use afterburner::throughput::{DeviceMemory, device_memory};
