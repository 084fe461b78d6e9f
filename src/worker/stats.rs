//! Counters and histograms of one replica, cheap to bump from any task (the `metrics` module
//! exports them; this module knows nothing of the exposition).
//!
//! Invariants this module keeps:
//! - Counters only grow (`session_up` and `commits_waiting_for_standby`, gauges, are the two
//!   exceptions); a snapshot reads each counter on its own, a consistent-enough read for metrics
//!   and tests.
//! - No counter is labelled by a job id, a principal or any request value.
//! - Histograms use the fixed buckets below, so their series are bounded too.
//! - The jobs ended per queue are counted for the queues the replica claimed from, which its
//!   configuration names: the map is bounded by it. Its lock is taken once per ended job, for a
//!   map lookup and two additions.

use crate::codes::Code;
use crate::worker::complete::transition::Transition;
use crate::worker::maintain::rescuer::recovered::Recovered;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio_postgres::error::SqlState;

/// Bucket upper bounds, in seconds, of the latency histograms, and of the pickup counts per
/// bucket the reporter sends (`etl_replica_minutes.pickup_buckets`, migration 0038, which lists
/// them: changing them changes what the minute rows mean).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];
/// Bucket upper bounds of the claim and commit batch size histograms, in jobs.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// A fixed-bucket histogram, safe to observe from any task: prometheus-client's, which counts
/// into its buckets (plus `+Inf`) and keeps the sum, with negative observations counted as zero.
/// Clones share their counts.
#[derive(Debug, Clone)]
pub struct Histogram(prometheus_client::metrics::histogram::Histogram);

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram(prometheus_client::metrics::histogram::Histogram::new(
            bounds.iter().copied(),
        ))
    }

    /// Records one observation (negative values count as zero).
    pub fn observe(&self, value: f64) {
        self.0.observe(value.max(0.0));
    }

    /// How many observations were recorded.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.0.count()
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// The codes a job row may store, in declaration order (the order of the failed-by-code counters).
pub fn stored_codes() -> impl Iterator<Item = Code> {
    Code::ALL.iter().copied().filter(|c| c.is_stored_failure())
}

/// Declares the counters once, for both the live struct and its snapshot.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A replica's live counters and histograms.
        #[derive(Debug)]
        pub struct WorkerStats {
            $($(#[$doc])* pub $name: AtomicU64,)*
            /// Jobs that ended `failed`, by stored code (in [`stored_codes`] order).
            failed_by_code: Vec<AtomicU64>,
            /// Seconds from a job becoming due to its claim (database clock).
            pub pickup_latency: Histogram,
            /// Pickups per [`LATENCY_BUCKETS`] bucket (a pickup in the first whose bound it does
            /// not exceed), then those slower than the last bound.
            pickup_buckets: Vec<AtomicU64>,
            /// Jobs that ended `succeeded` and `failed`, by queue.
            ended_by_queue: Mutex<BTreeMap<Arc<str>, [u64; 2]>>,
            /// Seconds from claim to transition.
            pub execution: Histogram,
            /// Jobs per non-empty claim.
            pub claim_batch: Histogram,
            /// Jobs per group commit.
            pub commit_batch: Histogram,
            /// Seconds from a schedule's fire to its job's insert (database clock).
            pub schedule_lateness: Histogram,
        }

        impl Default for WorkerStats {
            fn default() -> Self {
                WorkerStats {
                    $($name: AtomicU64::new(0),)*
                    failed_by_code: stored_codes().map(|_| AtomicU64::new(0)).collect(),
                    pickup_latency: Histogram::new(LATENCY_BUCKETS),
                    pickup_buckets: (0..=LATENCY_BUCKETS.len()).map(|_| AtomicU64::new(0)).collect(),
                    ended_by_queue: Mutex::default(),
                    execution: Histogram::new(LATENCY_BUCKETS),
                    claim_batch: Histogram::new(BATCH_BUCKETS),
                    commit_batch: Histogram::new(BATCH_BUCKETS),
                    schedule_lateness: Histogram::new(LATENCY_BUCKETS),
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
    /// Claim sessions whose prepared claim failed its plan check, so they plan every claim.
    claim_plan_fallbacks,
    /// Claims sent unnamed and planned for their values: behind a transaction-mode pooler
    /// (`--pooler transaction`), or on a session whose prepared claim failed its plan check.
    unnamed_claims,
    /// Statements refused because a prepared statement was missing (SQLSTATE 26000) or already
    /// there (42P05) on the server connection: the sign of a transaction-mode pooler on a URL not
    /// declared `--pooler transaction`.
    prepared_statement_misses,
    /// Statements (and transaction-control commands) the replica sent on pooled connections
    /// while running: claims, next-due reads, group commits, retry and failure writes,
    /// heartbeats, recovery passes and the shutdown release (not the start-up release).
    round_trips,
    /// Group commits (batches of finished jobs written together).
    commit_batches,
    /// Group commits whose own statements failed (the replica's database trouble, not a job's
    /// effects): their jobs retry.
    commit_failures,
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
    /// Jobs given back: unfinished leases released at shutdown, and the `running` rows of a
    /// previous incarnation with the same owner id released at start-up.
    released,
    /// Jobs that settled as a lost lease: a fenced write matched no row, the heartbeat found
    /// the lease gone, or the job's local lease clock ran out (one per job, however found).
    lease_lost,
    /// Transitions that could not be written (database unavailable).
    unwritten,
    /// Jobs given back uncharged (attempt refunded, recorded `released`) after an infrastructure
    /// fault kept their result from committing, or after the replica stopped trusting their
    /// lease: counted once the give-back is written.
    given_back,
    /// Commits of a job's computed result tried again under the same claim after an
    /// infrastructure fault rolled the first back.
    recommits,
    /// Jobs adopted: claimed by a claim whose reply was lost, found and taken into the
    /// replica's slots by the statement after it (`claimer::adopt`).
    adopted,
    /// Attempts recovery took from this replica while it was alive (cut off, not dead), given
    /// back once it reached the database again (`maintain::refund`).
    refunded,
    /// Jobs the replica's scheduler made for schedule fires.
    schedule_jobs,
    /// Schedule fires that made no job of their own, of schedules under `coalesce`: coalesced
    /// into a later one.
    schedule_missed_coalesce,
    /// Schedule fires that made no job of their own, of schedules under `catch_up`: beyond the
    /// catch-up bound.
    schedule_missed_catch_up,
    /// Schedule fires that made no job of their own, of schedules under `skip`: too late.
    schedule_missed_skip,
    /// Schedule fires that made no job because the previous one still lived (`overlap: skip`).
    schedule_overlapped,
    /// Rows recovered because their lease expired.
    recovered_expired,
    /// Rows recovered because their owner was dead.
    recovered_dead_owner,
    /// Recovered rows that ended instead of going back to `pending`: `failed` with
    /// `lease_expired_exhausted`, or `cancelled` at their owner's request.
    recovered_exhausted,
    /// Jobs that ended `failed` with `handler_panicked`.
    panicked,
    /// Jobs that ended `failed` with `execution_timeout`.
    timed_out,
    /// Notifications for this replica received on the session: its own wake token, a wake of a
    /// queue, or the empty payload that wakes every replica (those naming another replica are
    /// counted by the backups they cause, `backup_claims`).
    notifications,
    /// Times the session reconnected.
    reconnects,
    /// 1 while the session is up, 0 while it is down (a gauge).
    session_up,
    /// Commits of the replica's database its session's last probe saw stuck waiting for a
    /// synchronous standby (a gauge; `worker::liveness::session`).
    commits_waiting_for_standby,
    /// Claims made because a notification arrived.
    claims_by_notify,
    /// Claims made by the backstop poll.
    claims_by_poll,
    /// Claims made when a known deferred job became due.
    claims_by_due,
    /// Claims made to keep draining a backlog (after a full claim, or a wake that found no room),
    /// once half the room (slots and prefetch) is free, or a short delay after a slot freed with
    /// nothing buffered.
    claims_by_drain,
    /// Catch-up claims: after the session reconnected, or after recovery returned jobs to
    /// `pending` (exposed as trigger `catch_up`).
    claims_by_reconnect,
    /// Claims of the queues whose permits this replica's own completions had just freed (a
    /// completion of a capped queue's job wakes nobody: its replica claims next, migration 0023;
    /// exposed as trigger `freed`).
    claims_by_freed,
    /// Wakes of the waiting replicas this replica sent for permits its completions freed and its
    /// next claim did not take again (`worker::completer::wake_waiting`).
    freed_wakes,
    /// Jobs claimed by claims a notification triggered.
    claimed_by_notify,
    /// Jobs claimed by the backstop poll.
    claimed_by_poll,
    /// Poll claims that found work although no notification had arrived since the previous
    /// claim: a sign of lost notifications (or of work that became due).
    poll_found_work,
    /// Times the replica began waiting for work: its row registered (enqueues name it while it
    /// waits).
    waits,
    /// Times a replica whose claim came back full stopped waiting.
    waits_left,
    /// Tries of the enqueue barrier that found an enqueue in flight (tried again later).
    barrier_held,
    /// Claims sent to back up a wake that named another replica, for a queue and kind this one
    /// waits for, when this replica had not claimed since (`producer::BACKUP_DELAY`).
    backup_claims,
    /// Presence statements (a registration, a try of the barrier, a park) that failed: tried
    /// again later (a park is not: a row left waiting only makes enqueues notify).
    presence_failures,
    /// Claims a wake caused that waited out the claim cooldown (each counted once, however many
    /// wakes joined it).
    claims_held,
    /// Jobs picked up (claimed), counted with their pickup latency.
    pickups,
    /// Their pickup latencies (due to claimed, database clock), summed, in microseconds.
    pickup_micros,
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
    /// Room (free slots, or the prefetch buffer's) freed under a backlog (see `claims_by_drain`).
    Drain,
    /// The session reconnected, or recovery returned jobs.
    CatchUp,
    /// The replica's own completions freed permits of capped queues (see `claims_by_freed`).
    Freed,
    /// A single step (tests and tools).
    Step,
    /// The replica registers as waiting, or tries the enqueue barrier again (see `presence`).
    Presence,
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
            // Counted once the give-back is written (`given_back`).
            Transition::GivenBack => {}
        }
    }

    /// Counts one job's final transition on this replica, of a job of `queue`: as [`record`]
    /// does, and its success or failure under its queue too.
    ///
    /// [`record`]: WorkerStats::record
    pub fn record_in(&self, queue: &str, transition: Transition) {
        self.record(transition);
        let column = match transition {
            Transition::Succeeded => 0,
            Transition::Failed(_) => 1,
            _ => return,
        };
        let mut by_queue = self
            .ended_by_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(counts) = by_queue.get_mut(queue) {
            counts[column] += 1;
        } else {
            let mut counts = [0; 2];
            counts[column] = 1;
            by_queue.insert(Arc::from(queue), counts);
        }
    }

    /// Jobs that ended `succeeded` and `failed` on this replica, by queue (those recorded with
    /// [`WorkerStats::record_in`]), by name.
    pub fn ended_by_queue(&self) -> Vec<(Arc<str>, [u64; 2])> {
        let by_queue = self
            .ended_by_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        by_queue.iter().map(|(q, n)| (Arc::clone(q), *n)).collect()
    }

    /// Pickups per [`LATENCY_BUCKETS`] bucket, then those slower than its last bound.
    pub fn pickup_buckets(&self) -> Vec<u64> {
        self.pickup_buckets
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Counts a job given back uncharged.
    pub(crate) fn record_given_back(&self) {
        bump(&self.given_back);
    }

    /// Counts `n` jobs adopted (and claimed: their claim took them, its reply was lost).
    pub(crate) fn record_adopted(&self, n: usize) {
        let n = n as u64;
        self.adopted.fetch_add(n, Ordering::Relaxed);
        self.claimed.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts what one pass of the scheduler did: `jobs` made, fires missed by schedules under
    /// `coalesce`, `catch_up` and `skip`, fires `overlapped`, and the lateness of each job's
    /// fire.
    pub(crate) fn record_schedules(
        &self,
        (jobs, [coalesce, catch_up, skip], overlapped): (u64, [u64; 3], u64),
        lateness: &[std::time::Duration],
    ) {
        self.schedule_jobs.fetch_add(jobs, Ordering::Relaxed);
        let by_policy = [
            (&self.schedule_missed_coalesce, coalesce),
            (&self.schedule_missed_catch_up, catch_up),
            (&self.schedule_missed_skip, skip),
        ];
        for (counter, n) in by_policy {
            counter.fetch_add(n, Ordering::Relaxed);
        }
        self.schedule_overlapped
            .fetch_add(overlapped, Ordering::Relaxed);
        for late in lateness {
            self.schedule_lateness.observe(late.as_secs_f64());
        }
    }

    /// Counts `n` attempts refunded.
    pub(crate) fn record_refunded(&self, n: u64) {
        self.refunded.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a commit tried again under the same claim.
    pub(crate) fn record_recommit(&self) {
        bump(&self.recommits);
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
            ClaimReason::Freed => bump(&self.claims_by_freed),
            ClaimReason::Startup | ClaimReason::Step | ClaimReason::Presence => {}
        }
    }

    /// Counts one wake of the waiting replicas for permits this replica freed.
    pub(crate) fn record_freed_wake(&self) {
        bump(&self.freed_wakes);
    }

    /// Counts `n` round trips to the database.
    pub fn record_round_trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a group commit whose own statements failed.
    pub(crate) fn record_commit_failure(&self) {
        bump(&self.commit_failures);
    }

    /// Counts a claim session whose prepared claim failed its plan check.
    pub fn record_claim_plan_fallback(&self) {
        bump(&self.claim_plan_fallbacks);
    }

    /// Counts a claim sent unnamed.
    pub(crate) fn record_unnamed_claim(&self) {
        bump(&self.unnamed_claims);
    }

    /// Counts a statement of this replica's that failed with `sqlstate`, if that says a prepared
    /// statement was missing or duplicated on its server connection, and the first time says
    /// how to fix it (a transaction-mode pooler behind a URL not declared so); later ones are
    /// only counted.
    pub(crate) fn record_statement_failure(&self, sqlstate: Option<&SqlState>) {
        if !sqlstate.is_some_and(crate::db::is_prepared_statement_miss) {
            return;
        }
        if self
            .prepared_statement_misses
            .fetch_add(1, Ordering::Relaxed)
            == 0
        {
            tracing::warn!(
                sqlstate = sqlstate.map_or("", SqlState::code),
                "a prepared statement was missing or already there on its server connection: \
                 the database URL looks like a transaction-mode pooler; start with \
                 --pooler transaction"
            );
        }
    }

    /// Records one pickup `seconds` after its job was due.
    pub(crate) fn record_pickup(&self, seconds: f64) {
        self.pickup_latency.observe(seconds);
        bump(&self.pickups);
        let bucket = LATENCY_BUCKETS.partition_point(|bound| *bound < seconds);
        if let Some(counter) = self.pickup_buckets.get(bucket) {
            bump(counter);
        }
        // Whole microseconds; a negative latency (clock skew) counts as 0.
        let micros = (seconds * 1e6).max(0.0) as u64;
        self.pickup_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Counts the replica beginning to wait for work.
    pub(crate) fn record_wait(&self) {
        bump(&self.waits);
    }

    /// Counts a busy replica leaving the waiting replicas.
    pub(crate) fn record_wait_left(&self) {
        bump(&self.waits_left);
    }

    /// Counts a try of the enqueue barrier that found an enqueue in flight.
    pub(crate) fn record_barrier_held(&self) {
        bump(&self.barrier_held);
    }

    /// Counts one presence statement that failed.
    pub(crate) fn record_presence_failure(&self) {
        bump(&self.presence_failures);
    }

    /// Counts one wake's claim held until the claim cooldown is over.
    pub(crate) fn record_claim_held(&self) {
        bump(&self.claims_held);
    }

    /// Counts one claim sent to back up a wake that named another replica.
    pub(crate) fn record_backup_claim(&self) {
        bump(&self.backup_claims);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_or_duplicated_prepared_statement_counts_as_a_miss() {
        let stats = WorkerStats::default();
        stats.record_statement_failure(None);
        stats.record_statement_failure(Some(&SqlState::LOCK_NOT_AVAILABLE));
        assert_eq!(stats.snapshot().prepared_statement_misses, 0);
        stats.record_statement_failure(Some(&SqlState::INVALID_SQL_STATEMENT_NAME));
        stats.record_statement_failure(Some(&SqlState::DUPLICATE_PSTATEMENT));
        assert_eq!(stats.snapshot().prepared_statement_misses, 2);
    }

    #[test]
    fn pickups_fall_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let stats = WorkerStats::default();
        for seconds in [-1.0, 0.0005, 0.0006, 0.001, 60.0, 61.0, 3600.0] {
            stats.record_pickup(seconds);
        }
        let buckets = stats.pickup_buckets();
        assert_eq!(buckets.len(), LATENCY_BUCKETS.len() + 1);
        assert_eq!(&buckets[..2], &[2, 2], "<= 0.5 ms, then <= 1 ms");
        assert_eq!(buckets[LATENCY_BUCKETS.len() - 1], 1, "<= 60 s");
        assert_eq!(buckets[LATENCY_BUCKETS.len()], 2, "slower than 60 s");
        assert_eq!(buckets.iter().sum::<u64>(), stats.snapshot().pickups);
    }

    #[test]
    fn successes_and_failures_are_counted_by_queue_too() {
        let stats = WorkerStats::default();
        stats.record_in("mail", Transition::Succeeded);
        stats.record_in("mail", Transition::Succeeded);
        stats.record_in("mail", Transition::Failed(Code::HandlerPanicked));
        stats.record_in("etl", Transition::Failed(Code::ExecutionTimeout));
        stats.record_in("etl", Transition::Retried);
        stats.record_in("idle", Transition::Retried);
        let by_queue: Vec<(String, [u64; 2])> = stats
            .ended_by_queue()
            .into_iter()
            .map(|(q, n)| (q.to_string(), n))
            .collect();
        assert_eq!(
            by_queue,
            [("etl".to_owned(), [0, 1]), ("mail".to_owned(), [2, 1])],
            "a queue appears once a job of it ends succeeded or failed"
        );
        let snapshot = stats.snapshot();
        assert_eq!(
            (snapshot.succeeded, snapshot.failed, snapshot.retried),
            (2, 2, 2)
        );
    }
}
