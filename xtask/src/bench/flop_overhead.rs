//! What the Trainer's throughput figures cost: the same 32-true training steps on
//! `Autodiff<Autocast<I>>` with FLOP counting on and off, alternating in each round (best
//! time of each over at least 10 rounds: a 1% difference is below one round's noise on a
//! shared 2-core machine), and the per-log cost of reading a window and the process's peak
//! memory.

use std::time::Instant;

use afterburner::throughput::{ThroughputMeter, peak_memory_bytes};
use afterburner::{AutocastMode, CheckpointPolicy, Precision, precision::set_flop_counting};
use serde::Serialize;

use super::Options;
use super::checkpoint::{Measured, Model, scenario_autocast};

/// Counting's cost on one model.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Overhead {
    pub(super) model: String,
    pub(super) counting_ms_per_step: f64,
    pub(super) not_counting_ms_per_step: f64,
    /// `counting / not counting - 1`, in percent.
    pub(super) overhead_percent: f64,
    /// Reading a window's rates and the peak memory, once per training log, in microseconds.
    pub(super) per_log_us: f64,
}

/// Rounds of the measurement (`2 *` this many scenarios).
pub(super) fn rounds(o: &Options) -> usize {
    if o.quick { o.rounds } else { o.rounds.max(10) }
}

/// Measures `model` over [`rounds`] rounds.
pub(super) fn measure<I: burn::tensor::backend::Backend>(
    o: &Options,
    model: Model,
    progress: &mut super::progress::Progress,
) -> Result<Overhead, String> {
    type B<I> = burn::backend::Autodiff<afterburner::Autocast<I>>;
    let mut best: [Option<Measured>; 2] = [None, None];
    let rounds = rounds(o);
    for round in 0..rounds {
        for k in [round % 2, 1 - round % 2] {
            let counting = k == 0;
            progress.next(format!(
                "{model:?} round {}/{}: FLOP counting {}",
                round + 1,
                rounds,
                if counting { "on" } else { "off" }
            ));
            let previous = set_flop_counting(counting);
            let m = scenario_autocast::<B<I>>(
                o,
                model,
                CheckpointPolicy::None,
                Precision::Full32,
                AutocastMode::Auto,
            );
            set_flop_counting(previous);
            best[k] = Some(Measured::best(best[k], m?));
        }
    }
    let ms = |m: &Option<Measured>| m.map_or(f64::NAN, |m| m.time.as_secs_f64() * 1e3);
    let (on, off) = (ms(&best[0]), ms(&best[1]));
    let meter = ThroughputMeter::start();
    let reads = 1000;
    let started = Instant::now();
    for _ in 0..reads {
        std::hint::black_box(meter.read().rates(Some(1e12)));
        std::hint::black_box(peak_memory_bytes());
    }
    Ok(Overhead {
        model: model.describe(o),
        counting_ms_per_step: on,
        not_counting_ms_per_step: off,
        overhead_percent: (on / off - 1.0) * 100.0,
        per_log_us: started.elapsed().as_secs_f64() * 1e6 / reads as f64,
    })
}
