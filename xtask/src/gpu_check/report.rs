//! gpu-check's report: one markdown and one JSON file.

use std::fmt::Write as _;

use serde::Serialize;
use xtask::suite::Outcome;

use super::twins::TwinRow;
use crate::bench::bandwidth::Bandwidth;
use crate::bench::presets::Row;

/// Everything one gpu-check run found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The backend it ran on ("cuda" on a GPU machine).
    pub backend: String,
    /// Burn's name of the backend on the device.
    pub backend_name: String,
    /// Burn features this binary was built with that change the GPU kernels ("fusion",
    /// "autotune"; none on flex).
    pub built_with: Vec<String>,
    /// The GPUs the machine shows (`nvidia-smi -L`), empty off CUDA.
    pub gpus: Vec<String>,
    /// The first GPU's name and the driver version, where `nvidia-smi` tells.
    pub device: Option<String>,
    pub driver: Option<String>,
    /// Whether Burn supports each float dtype on the device.
    pub dtypes: Vec<(String, bool)>,
    /// The backend suite's outcomes.
    pub checks: Vec<Outcome>,
    /// The presets' rows.
    pub presets: Vec<Row>,
    /// Why the presets did not run, if they did not.
    pub presets_error: Option<String>,
    /// The in-process engine's all-reduce over every device, or why it failed (`None`: not
    /// run, under `--only` and `--perf`).
    pub all_reduce: Option<Result<Bandwidth, String>>,
    /// The PyTorch twins of the presets on the same device (`--perf`).
    pub twins: Vec<TwinRow>,
    /// Why the twins did not run, if they were to and did not.
    pub twins_error: Option<String>,
}

impl Report {
    /// Whether every check passed and every preset row that ran had no error.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
            && self.presets_error.is_none()
            && self.presets.iter().all(|r| r.error.is_none())
            && self.all_reduce.as_ref().is_none_or(Result::is_ok)
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut md = String::from("# gpu-check\n\n");
        let _ = writeln!(md, "- backend: {} ({})", self.backend, self.backend_name);
        let built = match self.built_with.is_empty() {
            true => "neither fusion nor autotune".to_string(),
            false => self.built_with.join(", "),
        };
        let _ = writeln!(md, "- built with: {built}");
        if !self.gpus.is_empty() {
            let _ = writeln!(md, "- GPUs: {}", self.gpus.join("; "));
        }
        let unknown = || "unknown".to_string();
        let _ = writeln!(
            md,
            "- device: {}; driver: {}",
            self.device.clone().unwrap_or_else(unknown),
            self.driver.clone().unwrap_or_else(unknown)
        );
        let dtypes: Vec<String> = self
            .dtypes
            .iter()
            .map(|(d, ok)| format!("{d} {}", if *ok { "yes" } else { "no" }))
            .collect();
        let _ = writeln!(md, "- dtypes supported: {}", dtypes.join(", "));
        let _ = writeln!(
            md,
            "- result: {}\n",
            if self.passed() { "passed" } else { "FAILED" }
        );
        md.push_str("## Backend suite\n\n| check | result | figures | s |\n|---|---|---|---|\n");
        for c in &self.checks {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} |",
                c.name,
                if c.passed { "pass" } else { "FAIL" },
                c.detail.replace('|', "/").replace('\n', " "),
                c.seconds
            );
        }
        md.push('\n');
        match &self.all_reduce {
            None => {}
            Some(Ok(b)) => {
                let _ = writeln!(
                    md,
                    "## All-reduce (in-process engine)\n\n{} MiB of f32 over {} ranks{}: \
                     {:.2} ms, algorithm bandwidth {:.2} GB/s, bus bandwidth {:.2} GB/s\n",
                    b.mib,
                    b.ranks,
                    if b.shared_device {
                        " sharing one device"
                    } else {
                        ""
                    },
                    b.ms,
                    b.algorithm_gb_s,
                    b.bus_gb_s
                );
            }
            Some(Err(e)) => {
                let _ = writeln!(md, "## All-reduce (in-process engine)\n\nFAILED: {e}\n");
            }
        }
        if let Some(e) = &self.presets_error {
            let _ = writeln!(md, "## Presets\n\nnot run: {e}");
        } else {
            md.push_str(&crate::bench::presets::table(&self.presets));
        }
        if !self.twins.is_empty() || self.twins_error.is_some() {
            md.push_str(&super::twins::markdown(
                &self.presets,
                &self.twins,
                &self.twins_error,
            ));
        }
        md
    }

    /// Writes `<out>/gpu-check.md` and `<out>/gpu-check.json`.
    pub fn write(&self, out: &str) -> Result<(), String> {
        std::fs::create_dir_all(out).map_err(|e| format!("creating {out}: {e}"))?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let base = format!("{out}/gpu-check");
        std::fs::write(format!("{base}.json"), json)
            .map_err(|e| format!("writing {base}.json: {e}"))?;
        std::fs::write(format!("{base}.md"), self.markdown())
            .map_err(|e| format!("writing {base}.md: {e}"))?;
        eprintln!("gpu-check: wrote {base}.md and {base}.json");
        Ok(())
    }
}

/// The kernel-changing Burn features backend `I` was built with: "fusion" when it is Burn's
/// `Fusion<..>` backend, "autotune" with it (xtask's `cuda` and `wgpu` features turn both on);
/// none on flex.
pub fn built_with<I>() -> Vec<String> {
    match std::any::type_name::<I>().contains("Fusion<") {
        true => vec!["fusion".to_string(), "autotune".to_string()],
        false => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::built_with;

    #[test]
    fn a_fused_backend_reports_fusion_and_autotune_and_flex_neither() {
        assert!(built_with::<burn::backend::Flex>().is_empty());
        #[cfg(feature = "wgpu")]
        assert_eq!(
            built_with::<afterburner::Autocast<burn::backend::Wgpu>>(),
            ["fusion", "autotune"]
        );
    }
}
