//! [`Prefetcher`]: results made ahead, in order, on one background thread.

use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::{self, JoinHandle};

use crate::quiet::{panic_message, quietly};

/// Runs a function over a list of jobs on a background thread, at most `depth` finished
/// results waiting (plus the one being made), and hands them over in the jobs' order.
///
/// Dropping it early stops the thread: the channel closes, the thread's next hand-over fails
/// and it returns; the drop joins it, so it waits for at most the result in progress. A panic
/// on the thread is raised again in [`next`](Self::next), as if the function ran there.
pub(crate) struct Prefetcher<O> {
    /// `None` once every result is handed over (or on drop, before the join).
    receiver: Option<Receiver<O>>,
    /// Ends with the message of a panic while making a result, if one did.
    worker: Option<JoinHandle<Option<String>>>,
}

impl<O: Send + 'static> Prefetcher<O> {
    /// Starts the thread; an error if the OS refuses one.
    pub(crate) fn start<J, F>(jobs: J, depth: usize, mut make: F) -> std::io::Result<Self>
    where
        J: Iterator + Send + 'static,
        F: FnMut(J::Item) -> O + Send + 'static,
    {
        let (sender, receiver) = sync_channel(depth);
        let worker = thread::Builder::new()
            .name("afterburner-prefetch".into())
            .spawn(move || {
                for job in jobs {
                    // A panic is raised again on the consumer's thread, which prints it (or
                    // turns it into an error, as the Trainer does): not here as well.
                    let made = match quietly(|| make(job)) {
                        Ok(made) => made,
                        Err(panic) => return Some(panic_message(panic.as_ref())),
                    };
                    if sender.send(made).is_err() {
                        return None; // the consumer is gone
                    }
                }
                None
            })?;
        Ok(Self {
            receiver: Some(receiver),
            worker: Some(worker),
        })
    }

    /// The next result in order; `None` after the last.
    pub(crate) fn next(&mut self) -> Option<O> {
        let received = self.receiver.as_ref()?.recv();
        match received {
            Ok(result) => Some(result),
            // The thread ended: every job done, or it panicked.
            Err(_) => {
                self.receiver = None;
                match self.worker.take().map(JoinHandle::join) {
                    Some(Ok(Some(message))) => std::panic::panic_any(message),
                    Some(Err(panic)) => std::panic::resume_unwind(panic),
                    _ => None,
                }
            }
        }
    }
}

impl<O> Drop for Prefetcher<O> {
    fn drop(&mut self) {
        // Close the channel first so a thread blocked on a full channel wakes up and returns.
        self.receiver = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn results_come_in_job_order() {
        let mut p = Prefetcher::start(0..100, 3, |i| i * 2).unwrap();
        let got: Vec<i32> = std::iter::from_fn(|| p.next()).collect();
        assert_eq!(got, (0..100).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(p.next(), None);
    }

    #[test]
    fn dropping_early_stops_the_thread() {
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let mut p = Prefetcher::start(0..1_000_000, 2, move |i| {
            counter.fetch_add(1, Ordering::SeqCst);
            i
        })
        .unwrap();
        assert_eq!(p.next(), Some(0));
        drop(p); // joins the thread
        // 1 handed over + 2 waiting + 1 in progress, at most; and the thread let go of its
        // closure (the counter's only other owner).
        assert!(made.load(Ordering::SeqCst) <= 4, "{made:?}");
        assert_eq!(Arc::strong_count(&made), 1);
    }

    #[test]
    #[should_panic(expected = "job 3 is bad")]
    fn a_panic_on_the_thread_reaches_the_caller() {
        let mut p = Prefetcher::start(0..10, 2, |i| {
            assert!(i != 3, "job {i} is bad");
            i
        })
        .unwrap();
        while p.next().is_some() {}
    }
}
