//! The process's peak memory: what a CPU run's "device memory" is.

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
    #[cfg(target_os = "linux")]
    fn the_peak_covers_what_was_allocated() {
        let block = vec![1u8; 64 << 20];
        let peak = super::peak_memory_bytes().expect("Linux says");
        assert!(peak >= 64 << 20, "{peak}");
        drop(block);
    }
}
