//! Counted host reads: every device-to-host read that runs through
//! [`Autocast`](crate::Autocast) (a float, int, bool or quantized tensor's data, or a
//! transaction of several read together) adds one to a counter of the calling thread. On a GPU
//! each one waits for every kernel queued before it and leaves the device idle until the host
//! queues more, so a training step that makes none keeps the device busy; a step's count is
//! the difference of two readings.
//!
//! ```
//! use afterburner_precision::{Autocast, count_host_reads};
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//!
//! let x = Tensor::<Autocast<Flex>, 1>::ones([4], &Default::default());
//! let (sum, reads) = count_host_reads(|| x.clone().sum().mul_scalar(2.0));
//! assert_eq!(reads, 0); // queued, not read
//! let (value, reads) = count_host_reads(|| sum.into_scalar());
//! assert_eq!((value, reads), (8.0, 1));
//! ```

use std::cell::Cell;

thread_local! {
    /// Device-to-host reads this thread has made through `Autocast`.
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// Device-to-host reads this thread has made through `Autocast` since it started.
pub fn host_reads_counted() -> u64 {
    READS.with(Cell::get)
}

/// Runs `f` and returns its result with the host reads it made on this thread.
pub fn count_host_reads<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = host_reads_counted();
    let result = f();
    (result, host_reads_counted().wrapping_sub(before))
}

/// Counts one read on this thread.
pub(crate) fn add_read() {
    READS.with(|reads| reads.set(reads.get().wrapping_add(1)));
}
