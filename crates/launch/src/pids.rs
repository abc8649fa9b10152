//! A launched run's workers found from outside (Linux's `/proc`): what chaos tests and benches
//! kill to see the launcher restart them.

use afterburner_rendezvous::launched::LIGHTHOUSE;

/// The pids of the live launched workers (their environment names a lighthouse) whose command
/// line contains `marker` (e.g. the run's output folder) and whose environment holds every one
/// of `vars` (`"RANK=1"`, `"AFTERBURNER_RESTART_COUNT=0"`). Empty where `/proc` cannot be read.
pub fn launched_workers(marker: &str, vars: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let launched = format!("{LIGHTHOUSE}=");
    let mut pids: Vec<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let read =
                |file: &str| std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&read("cmdline")).replace('\0', " ");
            let environ = read("environ");
            let environ: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            cmdline.contains(marker)
                && environ.iter().any(|v| v.starts_with(launched.as_bytes()))
                && vars.iter().all(|v| environ.contains(&v.as_bytes()))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Sends SIGKILL to process `pid`; whether it was there to receive it.
pub fn kill_worker(pid: u32) -> bool {
    // SAFETY: kill(2) on a pid; no memory is shared.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) == 0 }
}
