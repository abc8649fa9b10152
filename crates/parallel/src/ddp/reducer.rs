//! DDP's communication thread: the gradient buckets all-reduced while backward goes on. The
//! view's hooks ([`hook`](super::hook)) hand each parameter's gradient over as soon as
//! backward has produced it; a bucket goes out once all its gradients are in and every bucket
//! before it went (the same order on every rank). After backward the rest is flushed: a
//! parameter without a gradient on this rank counts as zeros, with its presence flag down.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::buckets::{self, Summed};
use crate::{ParallelError, ProcessGroup};

/// The buckets of one backward pass and their sums.
pub(crate) type Reduced<I> = (Arc<Vec<Vec<usize>>>, Vec<Summed<I>>);

/// One forward-backward pass's gradients and buckets, as the thread sees them.
struct Pass<I: Backend> {
    /// Which pass (a view starts the next one; hooks of an older view are ignored).
    id: u64,
    lens: Vec<usize>,
    plan: Arc<Vec<Vec<usize>>>,
    grads: Vec<Option<Tensor<I, 1>>>,
    /// The hooks' gradients as backward produced them (shape and dtype of the parameter),
    /// for the step: the hooks hand them here instead of to the parameters, so what reaches
    /// a parameter besides (a use of the model outside the view) shows.
    local: Vec<Option<FloatTensor<I>>>,
    /// Where the gradients are (from the first one handed over): a missing one's zeros go
    /// there, even once every handed-over gradient has been sent.
    device: Option<I::Device>,
    /// The next bucket to send.
    next: usize,
    /// A bucket is on the wire.
    sending: bool,
    /// Backward is over: missing gradients count as zeros.
    flushing: bool,
    /// A hook handed a gradient over in this pass.
    fired: bool,
    done: Vec<Summed<I>>,
    failure: Option<ParallelError>,
    stop: bool,
    /// The parameters in the order their gradients arrived (this pass).
    arrived: Vec<usize>,
}

/// The thread and what it shares with the hooks and with [`Ddp`](super::Ddp).
pub(crate) struct Reducer<I: Backend> {
    shared: Arc<(Mutex<Pass<I>>, Condvar)>,
}

impl<I: Backend> Drop for Reducer<I> {
    /// Lets a bucket on the wire finish (its collective bounds the wait), then stops the
    /// thread: a worker never returns while its thread still calls a collective.
    fn drop(&mut self) {
        let mut pass = self.lock();
        while pass.sending {
            pass = self.wait(pass);
        }
        pass.stop = true;
        drop(pass);
        self.shared.1.notify_all();
    }
}

impl<I: Backend> Reducer<I> {
    /// Starts the thread, which all-reduces over `group`.
    pub fn start(group: Box<dyn ProcessGroup<I>>) -> Result<Self, ParallelError> {
        let shared = Arc::new((
            Mutex::new(Pass {
                id: 0,
                lens: Vec::new(),
                plan: Arc::new(Vec::new()),
                grads: Vec::new(),
                local: Vec::new(),
                device: None,
                next: 0,
                sending: false,
                flushing: false,
                fired: false,
                done: Vec::new(),
                failure: None,
                stop: false,
                arrived: Vec::new(),
            }),
            Condvar::new(),
        ));
        let thread_side = shared.clone();
        // Its host reads (the ring and MPI engines copy each bucket) count towards the rank's.
        let builder = std::thread::Builder::new().name("afterburner-ddp-reducer".into());
        afterburner_precision::spawn_counted(builder, move || run(&*group, &thread_side)).map_err(
            |e| ParallelError::Collective {
                op: "ddp",
                rank: 0,
                reason: format!("cannot start the gradient reducer thread: {e}"),
            },
        )?;
        Ok(Self { shared })
    }

    fn lock(&self) -> MutexGuard<'_, Pass<I>> {
        self.shared.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts pass `lens` (the parameters' value counts, in visit order) in buckets of
    /// `cap_mb` MiB, once the thread has sent what it was sending; returns its id.
    pub fn begin(&self, lens: Vec<usize>, cap_mb: f64) -> u64 {
        let mut pass = self.lock();
        while pass.sending {
            pass = self.wait(pass);
        }
        if pass.lens != lens || pass.plan.is_empty() {
            pass.plan = Arc::new(buckets::plan(&lens, cap_mb));
        }
        pass.id += 1;
        pass.grads = vec![None; lens.len()];
        pass.local = vec![None; lens.len()];
        pass.device = None;
        pass.lens = lens;
        pass.next = 0;
        pass.flushing = false;
        pass.fired = false;
        pass.done.clear();
        pass.failure = None;
        pass.arrived.clear();
        pass.id
    }

    /// A hook's gradient: parameter `index`'s of pass `id`, as backward produced it (`local`)
    /// and flat in f32 (`flat`, what the buckets carry). False when it is not this pass's (a
    /// hook of an older view): the caller keeps it.
    pub fn ready(&self, id: u64, index: usize, local: FloatTensor<I>, flat: Tensor<I, 1>) -> bool {
        let mut pass = self.lock();
        if pass.id != id || index >= pass.grads.len() {
            return false;
        }
        pass.device.get_or_insert_with(|| flat.device());
        pass.grads[index] = Some(flat);
        pass.local[index] = Some(local);
        pass.arrived.push(index);
        pass.fired = true;
        drop(pass);
        self.shared.1.notify_all();
        true
    }

    /// The hooks' gradients of the current pass, by parameter index (taken: a second call
    /// finds none).
    pub fn take_local(&self) -> Vec<Option<FloatTensor<I>>> {
        let mut pass = self.lock();
        let len = pass.local.len();
        std::mem::replace(&mut pass.local, vec![None; len])
    }

    /// Ends the backward pass: sends the buckets left and waits for all of them. Returns the
    /// pass's summed buckets (`None` where no hook fired in it), or the first failure.
    pub fn finish(&self) -> Result<Option<Reduced<I>>, ParallelError> {
        let mut pass = self.lock();
        if !pass.fired {
            return Ok(None);
        }
        pass.flushing = true;
        self.shared.1.notify_all();
        while pass.failure.is_none() && pass.done.len() < pass.plan.len() {
            pass = self.wait(pass);
        }
        pass.fired = false; // taken: a second call finds nothing
        if let Some(failure) = pass.failure.take() {
            return Err(failure);
        }
        Ok(Some((pass.plan.clone(), std::mem::take(&mut pass.done))))
    }

    /// The parameters of the current pass in the order their gradients arrived.
    #[cfg(test)]
    pub fn arrived(&self) -> Vec<usize> {
        self.lock().arrived.clone()
    }

    fn wait<'a>(&'a self, pass: MutexGuard<'a, Pass<I>>) -> MutexGuard<'a, Pass<I>> {
        self.shared
            .1
            .wait(pass)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The thread: sends each bucket in order once it can go.
fn run<I: Backend>(group: &dyn ProcessGroup<I>, shared: &(Mutex<Pass<I>>, Condvar)) {
    let (lock, changed) = shared;
    let mut pass = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if pass.stop {
            return;
        }
        // A hook fired in this pass, so the device is known.
        let ready = pass.plan.get(pass.next).cloned().filter(|bucket| {
            pass.failure.is_none()
                && pass.fired
                && (pass.flushing || bucket.iter().all(|&i| pass.grads[i].is_some()))
        });
        let (Some(bucket), Some(device)) = (ready, pass.device.clone()) else {
            pass = changed.wait(pass).unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let id = pass.id;
        let present: Vec<bool> = bucket.iter().map(|&i| pass.grads[i].is_some()).collect();
        let parts: Vec<Tensor<I, 1>> = bucket
            .iter()
            .map(|&i| match pass.grads[i].take() {
                Some(grad) => grad,
                None => Tensor::zeros([pass.lens[i]], &device),
            })
            .collect();
        pass.sending = true;
        drop(pass);
        let result = buckets::all_reduce_bucket(group, &bucket, parts, &present);
        pass = lock.lock().unwrap_or_else(PoisonError::into_inner);
        pass.sending = false;
        if pass.id == id {
            match result {
                Ok(summed) => {
                    pass.done.push(summed);
                    pass.next += 1;
                }
                Err(failure) => pass.failure = Some(failure),
            }
        }
        changed.notify_all();
    }
}
