//! Where the Trainer's logs go: `output_dir/log.jsonl` (one JSON object per log or
//! evaluation), TensorBoard event files when asked (`report_to`), a progress bar on a
//! terminal (a progress line per log otherwise) and a `tracing` event, all on the main
//! process only.

use std::fs::{self, File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};

use super::LogEntry;
use super::tensorboard::TensorBoardLog;
use crate::AccelerateError;

/// The metrics log file's name in `output_dir`.
pub const LOG_FILE: &str = "log.jsonl";

/// The main process's log writer (silent on the other ranks).
pub(crate) struct RunLog {
    path: PathBuf,
    main: bool,
    started: Instant,
    /// Whether a progress bar may be drawn (HF's `disable_tqdm` off).
    bar_allowed: bool,
    bar: Option<ProgressBar>,
    /// TensorBoard event files (`report_to = "tensorboard"`).
    tensorboard: Option<TensorBoardLog>,
}

impl RunLog {
    pub(crate) fn new(output_dir: &Path, main: bool, bar_allowed: bool) -> Self {
        Self {
            path: output_dir.join(LOG_FILE),
            main,
            started: Instant::now(),
            bar_allowed,
            bar: None,
            tensorboard: None,
        }
    }

    /// Also writes every entry to TensorBoard event files in `dir` (main process).
    pub(crate) fn with_tensorboard(mut self, dir: &Path) -> Self {
        self.tensorboard = self.main.then(|| TensorBoardLog::new(dir));
        self
    }

    /// Draws the bar at `done` of `total` optimizer steps (on a terminal, main process).
    pub(crate) fn progress(&mut self, done: u64, total: u64) {
        if !(self.main && self.bar_allowed && std::io::stderr().is_terminal()) {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let style = ProgressStyle::default_bar()
                .template("{bar:30} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total).with_style(style)
        });
        bar.set_length(total);
        bar.set_position(done);
    }

    /// Removes the bar (at the end of training).
    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    /// Starts the clock and (re)writes the log file with `history` (empty on a fresh run,
    /// the checkpoint's history on a resume, so the file never holds lines past it), the run
    /// starting after `global_step` optimizer steps.
    pub(crate) fn start(
        &mut self,
        history: &[LogEntry],
        global_step: u64,
    ) -> Result<(), AccelerateError> {
        self.started = Instant::now();
        if !self.main {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)
                .map_err(|e| AccelerateError::io("create output directory", dir, e))?;
        }
        let mut file = File::create(&self.path)
            .map_err(|e| AccelerateError::io("create log file", &self.path, e))?;
        for entry in history {
            writeln!(file, "{}", json_line(entry))
                .map_err(|e| AccelerateError::io("write log file", &self.path, e))?;
        }
        if let Some(tensorboard) = self.tensorboard.as_mut() {
            tensorboard.start(global_step)?;
        }
        Ok(())
    }

    /// Time since [`start`](Self::start).
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Appends `entry` to the file and prints it with the progress (`done` of `total`
    /// optimizer steps, and for a training log the `items` processed so far on every rank).
    pub(crate) fn write(
        &mut self,
        entry: &LogEntry,
        done: u64,
        total: u64,
        items: Option<u64>,
    ) -> Result<(), AccelerateError> {
        tracing::info!(step = entry.step, epoch = entry.epoch, values = %entry.values, "trainer log");
        if !self.main {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)
                .map_err(|e| AccelerateError::io("create output directory", dir, e))?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| AccelerateError::io("open log file", &self.path, e))?;
        writeln!(file, "{}", json_line(entry))
            .map_err(|e| AccelerateError::io("write log file", &self.path, e))?;
        if let Some(tensorboard) = self.tensorboard.as_mut() {
            tensorboard.write(entry)?;
        }
        let secs = self.elapsed().as_secs_f64().max(1e-9);
        let eta = match done {
            0 => 0.0,
            _ => secs / done as f64 * total.saturating_sub(done) as f64,
        };
        let rate = rate(entry, items, secs);
        let line = format!(
            "[{done}/{total} | epoch {:.2}{rate} | ETA {}] {}",
            entry.epoch,
            clock(eta),
            entry.values
        );
        match &self.bar {
            // Through the bar: it is cleared, the line printed, the bar drawn again below it
            // (no stale bar left in the scrollback); the bar shows the last loss and rate.
            Some(bar) => {
                bar.println(line);
                if let Some(message) = bar_message(entry, &rate) {
                    bar.set_message(message);
                }
            }
            None => eprintln!("{line}"),
        }
        Ok(())
    }
}

/// `" | N samples/s | MFU x%"` from a training log's throughput values (the MFU when
/// known), else `" | N items/s"` for `items` processed in `secs` (empty when not counted).
fn rate(entry: &LogEntry, items: Option<u64>, secs: f64) -> String {
    if let Some(samples) = entry.values.get("samples_per_second") {
        let mfu = entry
            .values
            .get("mfu")
            .map_or(String::new(), |m| format!(" | MFU {:.1}%", m * 100.0));
        return format!(" | {samples:.0} samples/s{mfu}");
    }
    items.map_or(String::new(), |n| {
        format!(" | {:.0} items/s", n as f64 / secs.max(1e-9))
    })
}

/// What the progress bar shows after a training log: its loss and the `rate` text (`None`
/// for an evaluation, which has no training loss).
fn bar_message(entry: &LogEntry, rate: &str) -> Option<String> {
    let loss = entry.values.get("loss")?;
    Some(format!("loss {loss:.4}{rate}"))
}

/// An entry as one JSON object: `{"step": .., "epoch": .., "loss": .., ...}`.
fn json_line(entry: &LogEntry) -> String {
    let mut map = Map::new();
    map.insert("step".into(), entry.step.into());
    map.insert("epoch".into(), entry.epoch.into());
    for (name, value) in &entry.values.0 {
        map.insert(name.clone(), (*value).into());
    }
    Value::Object(map).to_string()
}

/// Seconds as `h:mm:ss`.
fn clock(secs: f64) -> String {
    let secs = secs.max(0.0) as u64;
    format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::Metrics;

    #[test]
    fn the_bar_shows_the_last_loss_and_the_rate() {
        let entry = |name: &str, value: f64| {
            let mut values = Metrics::default();
            values.insert(name, value);
            LogEntry {
                step: 10,
                epoch: 0.5,
                values,
            }
        };
        let loss = entry("loss", 0.25);
        assert_eq!(
            bar_message(&loss, &rate(&loss, Some(640), 2.0)).as_deref(),
            Some("loss 0.2500 | 320 items/s")
        );
        let eval = entry("eval_loss", 0.3);
        assert_eq!(bar_message(&eval, &rate(&eval, None, 2.0)), None);
        // A training log's own throughput, and the MFU when known.
        let mut measured = entry("loss", 0.25);
        measured.values.insert("samples_per_second", 512.4);
        assert_eq!(
            bar_message(&measured, &rate(&measured, Some(640), 2.0)).as_deref(),
            Some("loss 0.2500 | 512 samples/s")
        );
        measured.values.insert("mfu", 0.4219);
        assert_eq!(
            rate(&measured, Some(640), 2.0),
            " | 512 samples/s | MFU 42.2%"
        );
    }
}
