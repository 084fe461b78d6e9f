//! Counters of one replica, cheap to bump from any task (Prometheus export reads them).
//!
//! Invariants this module keeps:
//! - Counters only grow; a snapshot is a consistent-enough read for metrics and tests.
//! - No counter is labelled by a job id, a principal or any request value.

use crate::codes::Code;
use crate::worker::completer::Transition;
use crate::worker::rescuer::Recovered;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once, for both the live struct and its snapshot.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A replica's live counters.
        #[derive(Debug, Default)]
        pub struct WorkerStats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A point-in-time copy of [`WorkerStats`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl WorkerStats {
            /// Reads every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Claim statements run.
    claims,
    /// Claim statements that returned no job.
    empty_claims,
    /// Jobs claimed.
    claimed,
    /// Jobs that ended `succeeded`.
    succeeded,
    /// Jobs that ended `failed` (any code).
    failed,
    /// Attempts that went back to `pending` for a retry.
    retried,
    /// Jobs given back on shutdown.
    released,
    /// Fenced writes or heartbeats that found the lease gone.
    lease_lost,
    /// Transitions that could not be written (database unavailable).
    unwritten,
    /// Rows recovered because their lease expired.
    recovered_expired,
    /// Rows recovered because their owner was dead.
    recovered_dead_owner,
    /// Recovered rows that ended `failed` with `lease_expired_exhausted`.
    recovered_exhausted,
    /// Jobs that ended `failed` with `handler_panicked`.
    panicked,
    /// Jobs that ended `failed` with `execution_timeout`.
    timed_out,
}

/// Adds one to `counter`.
fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl WorkerStats {
    /// Counts one job's final transition on this replica.
    pub fn record(&self, transition: Transition) {
        match transition {
            Transition::Succeeded => bump(&self.succeeded),
            Transition::Retried => bump(&self.retried),
            Transition::Failed(code) => {
                bump(&self.failed);
                match code {
                    Code::HandlerPanicked => bump(&self.panicked),
                    Code::ExecutionTimeout => bump(&self.timed_out),
                    _ => {}
                }
            }
            Transition::LeaseLost => bump(&self.lease_lost),
            Transition::Unwritten => bump(&self.unwritten),
        }
    }

    /// Counts one claim statement that returned `n` jobs.
    pub fn record_claim(&self, n: usize) {
        bump(&self.claims);
        if n == 0 {
            bump(&self.empty_claims);
        }
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts one recovery pass.
    pub fn record_recovery(&self, recovered: Recovered) {
        self.recovered_expired
            .fetch_add(recovered.expired, Ordering::Relaxed);
        self.recovered_dead_owner
            .fetch_add(recovered.dead_owner, Ordering::Relaxed);
        self.recovered_exhausted
            .fetch_add(recovered.exhausted, Ordering::Relaxed);
    }

    /// Counts `n` jobs given back on shutdown.
    pub fn record_released(&self, n: u64) {
        self.released.fetch_add(n, Ordering::Relaxed);
    }
}
