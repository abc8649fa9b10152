//! A ring link paced to a set rate, for benchmarks: with `AFTERBURNER_RING_LINK_MBPS` set (MB
//! per second), each write to the next member takes as long as its bytes would on a link of
//! that rate, counted from when the link was last free, after the bytes were really sent. On
//! loopback the ring then sees a network's transfer time while doing all its real work (the
//! copies, the conversions, the syscalls, the sums), unlike a sleep before the call. Unset (the
//! default): no pacing.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The variable that sets the emulated link's rate, in MB (10^6 bytes) per second.
pub const LINK_RATE_VAR: &str = "AFTERBURNER_RING_LINK_MBPS";

/// The emulated link's rate in bytes per second, when `AFTERBURNER_RING_LINK_MBPS` holds a
/// positive number (anything else is said in the log, at each ring built, and ignored).
pub(crate) fn link_rate() -> Option<f64> {
    let given = std::env::var(LINK_RATE_VAR).ok()?;
    match given.trim().parse::<f64>() {
        Ok(mbps) if mbps.is_finite() && mbps > 0.0 => Some(mbps * 1e6),
        _ => {
            tracing::warn!("{LINK_RATE_VAR}={given:?} is not a positive number of MB/s: ignored");
            None
        }
    }
}

/// The stream to the next member, paced to `rate` bytes per second when given.
pub(crate) struct Paced {
    stream: TcpStream,
    rate: Option<f64>,
    /// When the emulated link has sent everything written so far.
    free: Instant,
}

impl Paced {
    /// `stream`, paced to `rate` bytes per second when given.
    pub(crate) fn new(stream: TcpStream, rate: Option<f64>) -> Self {
        Self {
            stream,
            rate,
            free: Instant::now(),
        }
    }
}

impl Write for Paced {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.stream.write(bytes)?;
        if let Some(rate) = self.rate {
            let now = Instant::now();
            self.free = self.free.max(now) + Duration::from_secs_f64(written as f64 / rate);
            if self.free > now {
                std::thread::sleep(self.free - now);
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
