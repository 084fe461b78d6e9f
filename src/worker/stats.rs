//! Counters of one replica, cheap to bump from any task (Prometheus export reads them).
//!
//! Invariants this module keeps:
//! - Counters only grow; a snapshot is a consistent-enough read for metrics and tests.
//! - No counter is labelled by a job id, a principal or any request value.

use crate::codes::Code;
use crate::metrics::{stored_codes, Histogram, BATCH_BUCKETS, LATENCY_BUCKETS};
use crate::worker::completer::Transition;
use crate::worker::rescuer::Recovered;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once, for both the live struct and its snapshot.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A replica's live counters and histograms.
        #[derive(Debug)]
        pub struct WorkerStats {
            $($(#[$doc])* pub $name: AtomicU64,)*
            /// Jobs that ended `failed`, by stored code (in `metrics::stored_codes` order).
            failed_by_code: Vec<AtomicU64>,
            /// Seconds from a job becoming due to its claim (database clock).
            pub pickup_latency: Histogram,
            /// Seconds from claim to transition.
            pub execution: Histogram,
            /// Jobs per non-empty claim.
            pub claim_batch: Histogram,
            /// Jobs per group commit.
            pub commit_batch: Histogram,
        }

        impl Default for WorkerStats {
            fn default() -> Self {
                WorkerStats {
                    $($name: AtomicU64::new(0),)*
                    failed_by_code: stored_codes().map(|_| AtomicU64::new(0)).collect(),
                    pickup_latency: Histogram::new(LATENCY_BUCKETS),
                    execution: Histogram::new(LATENCY_BUCKETS),
                    claim_batch: Histogram::new(BATCH_BUCKETS),
                    commit_batch: Histogram::new(BATCH_BUCKETS),
                }
            }
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
    /// Statements (and transaction-control commands) the replica sent on pooled connections:
    /// claims, next-due reads, group commits, failure writes, heartbeats, recovery and release.
    round_trips,
    /// Group commits (batches of finished jobs written together).
    commit_batches,
    /// Jobs claimed.
    claimed,
    /// Jobs that ended `succeeded`.
    succeeded,
    /// Jobs that ended `failed` (any code).
    failed,
    /// Attempts that went back to `pending` for a retry.
    retried,
    /// Running jobs that ended `cancelled` at their owner's request.
    cancelled,
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
    /// Notifications received on the session.
    notifications,
    /// Times the session reconnected.
    reconnects,
    /// 1 while the session is up, 0 while it is down (a gauge).
    session_up,
    /// Claims made because a notification arrived.
    claims_by_notify,
    /// Claims made by the backstop poll.
    claims_by_poll,
    /// Claims made when a known deferred job became due.
    claims_by_due,
    /// Claims made to keep draining after a full claim, as slots freed.
    claims_by_drain,
    /// Catch-up claims after the session reconnected.
    claims_by_reconnect,
    /// Jobs claimed by claims a notification triggered.
    claimed_by_notify,
    /// Jobs claimed by the backstop poll.
    claimed_by_poll,
    /// Poll claims that found work although no notification had arrived since the previous
    /// claim: a sign of lost notifications (or of work that became due).
    poll_found_work,
}

/// Why the claim loop claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimReason {
    /// The replica just started.
    Startup,
    /// A notification arrived.
    Notify,
    /// The backstop poll fired.
    Poll,
    /// A known deferred job became due.
    Due,
    /// A slot freed after a full claim.
    Drain,
    /// The session reconnected, or recovery returned jobs.
    CatchUp,
    /// A single step (tests and tools).
    Step,
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
                if let Some(counter) = stored_codes()
                    .position(|c| c == code)
                    .and_then(|i| self.failed_by_code.get(i))
                {
                    bump(counter);
                }
                match code {
                    Code::HandlerPanicked => bump(&self.panicked),
                    Code::ExecutionTimeout => bump(&self.timed_out),
                    _ => {}
                }
            }
            Transition::Cancelled => bump(&self.cancelled),
            Transition::LeaseLost => bump(&self.lease_lost),
            Transition::Unwritten => bump(&self.unwritten),
        }
    }

    /// Jobs that ended `failed`, by stored code.
    pub fn failed_by_code(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        stored_codes()
            .zip(&self.failed_by_code)
            .map(|(code, n)| (code.as_str(), n.load(Ordering::Relaxed)))
    }

    /// Counts one claim statement, made for `reason`, that returned `n` jobs.
    pub fn record_claim(&self, reason: ClaimReason, n: usize) {
        bump(&self.claims);
        bump(&self.round_trips);
        if n == 0 {
            bump(&self.empty_claims);
        } else {
            self.claim_batch.observe(n as f64);
        }
        let n = n as u64;
        self.claimed.fetch_add(n, Ordering::Relaxed);
        match reason {
            ClaimReason::Notify => {
                bump(&self.claims_by_notify);
                self.claimed_by_notify.fetch_add(n, Ordering::Relaxed);
            }
            ClaimReason::Poll => {
                bump(&self.claims_by_poll);
                self.claimed_by_poll.fetch_add(n, Ordering::Relaxed);
            }
            ClaimReason::Due => bump(&self.claims_by_due),
            ClaimReason::Drain => bump(&self.claims_by_drain),
            ClaimReason::CatchUp => bump(&self.claims_by_reconnect),
            ClaimReason::Startup | ClaimReason::Step => {}
        }
    }

    /// Counts `n` round trips to the database.
    pub fn record_round_trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one group commit of `n` jobs.
    pub fn record_commit_batch(&self, n: usize) {
        bump(&self.commit_batches);
        self.commit_batch.observe(n as f64);
    }

    /// Counts a poll claim that found work no notification announced.
    pub fn record_poll_found_work(&self) {
        bump(&self.poll_found_work);
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
