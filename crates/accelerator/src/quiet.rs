//! Panics turned into errors without their text on stderr: Burn asserts where a caller of
//! ours gave bad input (a model of another structure, a batcher given ragged items), and we
//! report those as errors of our own.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use crate::AccelerateError;

thread_local! {
    /// Whether a panic on this thread is one [`quietly`] turns into an error.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, catching a panic without its text on stderr (the caller reports it as an error
/// of its own). Panics elsewhere, on other threads or outside, print as before: the hook
/// installed once here hands them to the hook that was in place.
pub(crate) fn quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.replace(true);
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.set(was);
    result
}

/// The message of a caught panic (its `&str` or `String` payload).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic without a message".to_string(),
    }
}

/// The next batch of `batches`; a panic while making it (a batcher given items it cannot
/// stack, like images of another size) is [`AccelerateError::BadData`] with its message.
pub fn next_batch<T>(batches: &mut impl Iterator<Item = T>) -> Result<Option<T>, AccelerateError> {
    quietly(|| batches.next()).map_err(|panic| AccelerateError::BadData(panic_message(&*panic)))
}
