//! The bench's progress bar: one stderr line per scenario with how many are done, the time
//! spent and an estimate of the time left (plain lines, so logs and pipes read them too).

use std::fmt::Display;
use std::time::{Duration, Instant};

/// Width of the bar in characters.
const WIDTH: usize = 20;

/// Counts a suite's scenarios as they start.
pub struct Progress {
    suite: &'static str,
    total: usize,
    done: usize,
    start: Instant,
}

impl Progress {
    /// A suite about to run `total` scenarios.
    pub fn new(suite: &'static str, total: usize) -> Self {
        Self {
            suite,
            total: total.max(1),
            done: 0,
            start: Instant::now(),
        }
    }

    /// Announces the next scenario, e.g.
    /// `[linear #####--------------- 2/4] Vit round 1/2: Autodiff<I>, 41 s spent, ~123 s left`.
    pub fn next(&mut self, label: impl Display) {
        eprintln!("{}", self.line(&label.to_string(), self.start.elapsed()));
        self.done += 1;
    }

    /// The line for the next scenario after `spent` (its own function so it can be tested).
    fn line(&self, label: &str, spent: Duration) -> String {
        let filled = WIDTH * self.done.min(self.total) / self.total;
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(WIDTH - filled));
        let left = if self.done == 0 {
            String::new()
        } else {
            let per = spent.as_secs_f64() / self.done as f64;
            let rest = per * self.total.saturating_sub(self.done) as f64;
            format!(", ~{} left", seconds(rest))
        };
        format!(
            "[{} {bar} {:>w$}/{}] {label}, {} spent{left}",
            self.suite,
            self.done + 1,
            self.total,
            seconds(spent.as_secs_f64()),
            w = self.total.to_string().len(),
        )
    }
}

/// `75 s`, or `3 min 5 s` from two minutes on.
fn seconds(s: f64) -> String {
    let s = s.round() as u64;
    if s < 120 {
        format!("{s} s")
    } else {
        format!("{} min {} s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_and_the_estimate_follows_the_mean_scenario_time() {
        let mut p = Progress::new("linear", 4);
        assert_eq!(
            p.line("first", Duration::ZERO),
            "[linear -------------------- 1/4] first, 0 s spent"
        );
        p.done = 2;
        assert_eq!(
            p.line("third", Duration::from_secs(40)),
            "[linear ##########---------- 3/4] third, 40 s spent, ~40 s left"
        );
        p.done = 3;
        assert_eq!(
            p.line("last", Duration::from_secs(300)),
            "[linear ###############----- 4/4] last, 5 min 0 s spent, ~100 s left"
        );
    }
}
