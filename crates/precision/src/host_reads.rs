//! Counted host reads: every device-to-host read that runs through
//! [`Autocast`](crate::Autocast) (a float, int, bool or quantized tensor's data, or a
//! transaction of several read together) and every `Backend::sync` adds one. On a GPU each one
//! waits for every kernel queued before it and leaves the device idle until the host queues
//! more, so a training step that makes none keeps the device busy; a step's count is the
//! difference of two readings.
//!
//! A step runs on more than one thread (DDP's communication thread copies each bucket to the
//! host under the ring and MPI engines; checkpointed blocks recompute on a helper thread): a
//! thread started with [`spawn_counted`] counts its reads towards the thread that started it,
//! and [`host_reads_counted`] reads the total of a thread and its helpers.
//! [`host_reads_on_this_thread`] keeps the calling thread's own.
//!
//! ```
//! use afterburner_precision::{Autocast, count_host_reads, spawn_counted};
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//!
//! let x = Tensor::<Autocast<Flex>, 1>::ones([4], &Default::default());
//! let (sum, reads) = count_host_reads(|| x.clone().sum().mul_scalar(2.0));
//! assert_eq!(reads, 0); // queued, not read
//! let (value, reads) = count_host_reads(|| sum.into_scalar());
//! assert_eq!((value, reads), (8.0, 1));
//! // A read on a helper thread counts towards the thread that started it.
//! let helper = std::thread::Builder::new();
//! let (_, reads) = count_host_reads(|| {
//!     spawn_counted(helper, move || x.into_data()).unwrap().join().unwrap()
//! });
//! assert_eq!(reads, 1);
//! ```

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{Builder, JoinHandle};

thread_local! {
    /// Reads this thread has made through `Autocast`.
    static OWN: Cell<u64> = const { Cell::new(0) };
    /// The tally this thread's reads go to: its own, or the one of the thread that started it.
    static TALLY: RefCell<HostReadTally> = RefCell::default();
}

/// The host reads of a thread and of the helper threads it started with [`spawn_counted`]
/// (or that [`adopt`](Self::adopt)ed its tally): a shared count, cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct HostReadTally(Arc<AtomicU64>);

impl HostReadTally {
    /// The tally the calling thread counts towards.
    pub fn of_this_thread() -> Self {
        TALLY.with_borrow(Clone::clone)
    }

    /// Host reads counted so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Makes the calling thread count its reads towards this tally from now on (a helper
    /// thread doing a step's work, handed the step thread's tally).
    pub fn adopt(self) {
        TALLY.with_borrow_mut(|tally| *tally = self);
    }
}

/// Reads of the calling thread and of every helper thread counting towards it (see
/// [`spawn_counted`]) since the thread started. A helper's reads go on after the call that
/// started its work returns: read the count once the step's results are in.
pub fn host_reads_counted() -> u64 {
    TALLY.with_borrow(HostReadTally::count)
}

/// Reads the calling thread has made itself since it started (its helpers' left out).
pub fn host_reads_on_this_thread() -> u64 {
    OWN.with(Cell::get)
}

/// Runs `f` and returns its result with the host reads it made on this thread and its
/// helpers meanwhile.
pub fn count_host_reads<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = host_reads_counted();
    let result = f();
    (result, host_reads_counted().wrapping_sub(before))
}

/// Starts `f` on a thread built by `builder` whose host reads count towards the calling
/// thread's (the thread that hands it a step's work), as `std::thread::Builder::spawn` does.
pub fn spawn_counted<F, T>(builder: Builder, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let tally = HostReadTally::of_this_thread();
    builder.spawn(move || {
        tally.adopt();
        f()
    })
}

/// Counts one read on this thread and its tally.
pub(crate) fn add_read() {
    OWN.with(|reads| reads.set(reads.get().wrapping_add(1)));
    TALLY.with_borrow(|tally| tally.0.fetch_add(1, Ordering::Relaxed));
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Tensor;
    use burn::tensor::backend::Backend;

    use super::*;
    use crate::Autocast;

    #[test]
    fn a_sync_counts_as_a_read() {
        let ((), reads) = count_host_reads(|| Autocast::<Flex>::sync(&Default::default()).unwrap());
        assert_eq!(reads, 1);
    }

    #[test]
    fn a_helpers_reads_count_towards_the_thread_that_started_it_not_as_its_own() {
        let x = Tensor::<Autocast<Flex>, 1>::ones([2], &Default::default());
        let (all, own) = (host_reads_counted(), host_reads_on_this_thread());
        let helper = spawn_counted(Builder::new(), move || {
            let _ = x.clone().into_data();
            let _ = x.into_data();
            // The helper sees the tally it shares, and its own two.
            host_reads_on_this_thread()
        });
        assert_eq!(helper.unwrap().join().unwrap(), 2);
        assert_eq!(host_reads_counted() - all, 2);
        assert_eq!(host_reads_on_this_thread() - own, 0);

        // A plain thread counts towards nothing of this thread's.
        let y = Tensor::<Autocast<Flex>, 1>::ones([2], &Default::default());
        std::thread::spawn(move || y.into_data()).join().unwrap();
        assert_eq!(host_reads_counted() - all, 2);
    }
}
