//! The one guard that handler code runs under, in the compute phase and in the effects phase
//! alike: a time bound and a panic catch around the call and its future.
//!
//! Invariants this module keeps:
//! - The guarded future is built by the caller as `async move { handler_call().await }`, so a
//!   handler that panics while *making* its future is caught too, not only one whose future
//!   panics when polled.
//! - A guarded run ends in exactly one of three ways, and the guard decides none of what follows
//!   (which code a timeout or a panic becomes is the caller's).

use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use tokio::time::{timeout_at, Instant};

/// How a guarded run of handler code ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Guarded<T> {
    /// It finished, with this value.
    Done(T),
    /// It was still running at its deadline, and was dropped.
    TimedOut,
    /// It panicked.
    Panicked,
}

/// Runs `handler_code` until `deadline`, catching a panic.
pub(crate) async fn guarded<T>(
    deadline: Instant,
    handler_code: impl Future<Output = T>,
) -> Guarded<T> {
    match timeout_at(deadline, AssertUnwindSafe(handler_code).catch_unwind()).await {
        Err(_) => Guarded::TimedOut,
        Ok(Err(_panic)) => Guarded::Panicked,
        Ok(Ok(value)) => Guarded::Done(value),
    }
}

#[cfg(test)]
mod tests {
    use super::{guarded, Guarded};
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test]
    async fn a_guarded_run_finishes_times_out_or_panics_and_nothing_else() {
        let soon = || Instant::now() + Duration::from_millis(50);
        assert_eq!(guarded(soon(), async { 7 }).await, Guarded::Done(7));
        assert_eq!(
            guarded(soon(), std::future::pending::<()>()).await,
            Guarded::TimedOut
        );
        /// A call that panics before it returns a future.
        fn panics_when_called() -> std::future::Ready<u8> {
            panic!("before the future")
        }
        assert_eq!(
            guarded(soon(), async { panics_when_called().await }).await,
            Guarded::Panicked
        );
    }
}
