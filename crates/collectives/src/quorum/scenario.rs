//! A test and benchmark helper (feature `testing`): one replica of a fault-tolerant run fails
//! and is started again while the others wait at a known point, so a test knows which round
//! each replica saw.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};

/// What one run of a replica in [`fail_and_restart`] is asked to do.
pub struct ReplicaRun {
    /// The replica id.
    pub id: usize,
    /// This run must fail (return an error) at the test's chosen step.
    pub fails: bool,
    /// This run is the failed replica started again.
    pub restarted: bool,
    pause: Option<Pause>,
    connected: Option<Sender<()>>,
}

/// Where a replica that stays up says it arrived, and what lets it go on.
struct Pause {
    arrived: Sender<()>,
    open: Arc<Mutex<Receiver<()>>>,
}

impl ReplicaRun {
    /// Whether this run waits at the test's pause step (the replicas that stay up do).
    pub fn pauses(&self) -> bool {
        self.pause.is_some()
    }

    /// At the pause step: says it arrived and waits until the failed replica has restarted
    /// and connected. Does nothing on a run that does not pause.
    pub fn pause(&self) {
        if let Some(pause) = &self.pause {
            let _ = pause.arrived.send(());
            let open = pause.open.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = open.recv();
        }
    }

    /// Call once the run has its quorum group: the restarted replica says it is connected.
    pub fn connected(&self) {
        if let Some(connected) = &self.connected {
            let _ = connected.send(());
        }
    }
}

/// What [`fail_and_restart`] returns.
pub struct FailAndRestart<R> {
    /// The replicas that stayed up, in id order.
    pub survivors: Vec<R>,
    /// The failed run of the failing replica.
    pub failed: R,
    /// Its run after the restart.
    pub restarted: R,
}

/// Runs replicas `0..replicas` on threads: replica `failing` runs once with `fails` set (it
/// must return at the step the test chose), the others with a pause (they call
/// [`ReplicaRun::pause`] at a step after the failure). Once the failed run has returned and
/// every other replica waits at its pause, `failing` runs again (`restarted`), and the others
/// go on once it has [`connected`](ReplicaRun::connected). A panic in a run is re-raised.
pub fn fail_and_restart<R, F>(replicas: usize, failing: usize, run: F) -> FailAndRestart<R>
where
    R: Send + 'static,
    F: Fn(ReplicaRun) -> R + Send + Sync + 'static,
{
    let run = Arc::new(run);
    let (arrived, has_arrived) = channel();
    let (open, opened) = channel();
    let opened = Arc::new(Mutex::new(opened));
    let start = |replica: ReplicaRun| {
        let run = run.clone();
        std::thread::spawn(move || run(replica))
    };
    let survivors: Vec<_> = (0..replicas)
        .filter(|id| *id != failing)
        .map(|id| {
            start(ReplicaRun {
                id,
                fails: false,
                restarted: false,
                pause: Some(Pause {
                    arrived: arrived.clone(),
                    open: opened.clone(),
                }),
                connected: None,
            })
        })
        .collect();
    let join =
        |t: std::thread::JoinHandle<R>| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
    let failed = join(start(ReplicaRun {
        id: failing,
        fails: true,
        restarted: false,
        pause: None,
        connected: None,
    }));
    for _ in &survivors {
        let _ = has_arrived.recv();
    }
    let (connected, is_connected) = channel();
    let restarted = start(ReplicaRun {
        id: failing,
        fails: false,
        restarted: true,
        pause: None,
        connected: Some(connected),
    });
    let _ = is_connected.recv();
    for _ in &survivors {
        let _ = open.send(());
    }
    FailAndRestart {
        survivors: survivors.into_iter().map(join).collect(),
        failed,
        restarted: join(restarted),
    }
}
