//! afterburner-throughput: throughput over a window of training steps, as Fabric's `ThroughputMonitor` and
//! torchtitan's step metrics: samples/s, tokens/s, achieved FLOP/s from the FLOPs `Autocast`
//! counted (`afterburner::count_flops`), MFU against the device's peak ([`peak_flops`]) and
//! the process's peak memory ([`peak_memory_bytes`]).
//!
//! ```
//! use afterburner_throughput::ThroughputMeter;
//!
//! let mut meter = ThroughputMeter::start();
//! // ... train a step of 32 samples of 128 tokens ...
//! meter.add(32, Some(32 * 128));
//! let window = meter.read();
//! assert_eq!(window.samples, 32);
//! ```

#![warn(missing_docs)]

mod memory;
mod peak;

use std::time::Instant;

use afterburner_precision::flops_counted;

pub use memory::{DeviceMemory, device_memory, peak_memory_bytes};
pub use peak::{PeakFlops, PeakSource, peak_flops, peak_from_table};

/// Counts samples, tokens and this thread's counted FLOPs from its start (or last
/// [`restart`](Self::restart)), leaving out the time and FLOPs between a
/// [`pause`](Self::pause) and a [`resume`](Self::resume) (an evaluation, a save);
/// [`read`](Self::read) gives the window's totals and time.
#[derive(Debug, Clone)]
pub struct ThroughputMeter {
    started: Instant,
    flops_at_start: u64,
    samples: u64,
    tokens: Option<u64>,
    /// When and at which FLOP count the current pause began.
    paused_at: Option<(Instant, u64)>,
    paused_seconds: f64,
    paused_flops: u64,
}

impl ThroughputMeter {
    /// A window starting now.
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            flops_at_start: flops_counted(),
            samples: 0,
            tokens: None,
            paused_at: None,
            paused_seconds: 0.0,
            paused_flops: 0,
        }
    }

    /// Stops counting time and FLOPs until [`resume`](Self::resume) (a second pause is a
    /// no-op).
    pub fn pause(&mut self) {
        if self.paused_at.is_none() {
            self.paused_at = Some((Instant::now(), flops_counted()));
        }
    }

    /// Counts again after a [`pause`](Self::pause).
    pub fn resume(&mut self) {
        if let Some((at, flops)) = self.paused_at.take() {
            self.paused_seconds += at.elapsed().as_secs_f64();
            self.paused_flops = self
                .paused_flops
                .wrapping_add(flops_counted().wrapping_sub(flops));
        }
    }

    /// Starts a new window now (after time that should not count: an evaluation, a save).
    pub fn restart(&mut self) {
        *self = Self::start();
    }

    /// Adds a step's (or micro-batch's) samples and, when the batch says, its tokens.
    pub fn add(&mut self, samples: u64, tokens: Option<u64>) {
        self.samples += samples;
        if let Some(tokens) = tokens {
            self.tokens = Some(self.tokens.unwrap_or(0) + tokens);
        }
    }

    /// The window so far, without its paused time and FLOPs.
    pub fn read(&self) -> Window {
        let (now, flops_now) = match self.paused_at {
            Some((at, flops)) => (at, flops),
            None => (Instant::now(), flops_counted()),
        };
        let seconds = now.duration_since(self.started).as_secs_f64() - self.paused_seconds;
        let flops = flops_now
            .wrapping_sub(self.flops_at_start)
            .wrapping_sub(self.paused_flops);
        Window {
            seconds: seconds.max(0.0),
            samples: self.samples,
            tokens: self.tokens,
            flops,
        }
    }
}

/// What a window of steps did, on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Seconds it lasted.
    pub seconds: f64,
    /// Samples it trained on.
    pub samples: u64,
    /// Tokens it trained on, when the batches said.
    pub tokens: Option<u64>,
    /// FLOPs counted on this thread (0 on a backend without `Autocast`).
    pub flops: u64,
}

impl Window {
    /// The window's rates against `peak` (this device's peak FLOP/s, when known).
    pub fn rates(&self, peak: Option<f64>) -> Rates {
        let seconds = self.seconds.max(1e-9);
        let flops_per_second = (self.flops > 0).then(|| self.flops as f64 / seconds);
        Rates {
            samples_per_second: self.samples as f64 / seconds,
            tokens_per_second: self.tokens.map(|t| t as f64 / seconds),
            flops_per_second,
            mfu: flops_per_second
                .zip(peak.filter(|p| *p > 0.0))
                .map(|(f, p)| f / p),
        }
    }
}

/// Rates of one window on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Samples per second.
    pub samples_per_second: f64,
    /// Tokens per second, when the batches said how many.
    pub tokens_per_second: Option<f64>,
    /// Achieved FLOP/s of the counted ops, when any were counted.
    pub flops_per_second: Option<f64>,
    /// Model FLOPs utilisation: achieved over peak FLOP/s, when both are known.
    pub mfu: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_divide_by_the_window_and_the_peak() {
        let window = Window {
            seconds: 2.0,
            samples: 64,
            tokens: Some(640),
            flops: 4_000,
        };
        let rates = window.rates(Some(4_000.0));
        assert_eq!(rates.samples_per_second, 32.0);
        assert_eq!(rates.tokens_per_second, Some(320.0));
        assert_eq!(rates.flops_per_second, Some(2_000.0));
        assert_eq!(rates.mfu, Some(0.5));
        let uncounted = Window { flops: 0, ..window }.rates(Some(4_000.0));
        assert_eq!((uncounted.flops_per_second, uncounted.mfu), (None, None));
        assert_eq!(window.rates(None).mfu, None);
    }

    #[test]
    fn a_meter_adds_samples_and_tokens_and_restarts() {
        let mut meter = ThroughputMeter::start();
        meter.add(4, None);
        assert_eq!(meter.read().tokens, None);
        meter.add(4, Some(40));
        let window = meter.read();
        assert_eq!((window.samples, window.tokens), (8, Some(40)));
        meter.restart();
        assert_eq!(meter.read().samples, 0);
    }

    #[test]
    fn a_pause_leaves_its_time_out() {
        let started = Instant::now();
        let mut meter = ThroughputMeter::start();
        meter.pause();
        // At least 50 ms paused, whatever the scheduler does.
        std::thread::sleep(std::time::Duration::from_millis(50));
        meter.resume();
        let window = meter.read();
        assert!(window.seconds + 0.05 <= started.elapsed().as_secs_f64());
    }
}
