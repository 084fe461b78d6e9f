//! Leases: what a claim grants, and how every later write is scoped to it.
//!
//! # State model
//! A claim moves a `pending` row to `running` and stamps it with a lease: the replica's stable
//! `lease_owner_id`, a fresh `lease_claim_id` (unique per claim), `lease_expires_at` and
//! `lease_renewed_at` (database clock), `lease_owner_locked` (whether the replica's session
//! held its owner lock right then), and the owner's terms recovery judges it by: its heartbeat
//! interval (`lease_heartbeat_ms`) and whether its connections hold alive locks
//! (`lease_owner_alive_locked`). It also adds 1 to the job's `fencing_token`, which nothing else writes: the token
//! numbers the job's terms in order, for external systems that must refuse a stale term. A lease
//! is a *term*: it ends when the job reaches a terminal state, is released, or is recovered by
//! any replica after the owner died or the lease expired.
//!
//! # Term-scoped operations
//! Every write after the claim is scoped to the term by its claim id and `status = 'running'`:
//! the effects commit locks its rows with `id`, `lease_claim_id` and `status` (`group_commit`),
//! success, retry, failure and release match the same three (`completer`), and the heartbeat
//! renews only rows still `running` under this owner and one of the claim ids it holds
//! (`heartbeat`). A write that matches no row means the term is over: the worker abandons the
//! job, rolls back what it had not committed, counts `lease_lost`, and never reports success.
//! Fencing compares claim ids, never timestamps; `lease_expires_at` is on the database's clock.
//!
//! # Trust window
//! The heartbeat renews the leases every `heartbeat_interval`, which `validate()` keeps under a
//! third of the lease, so two lost heartbeats still leave the lease alive. A job whose lease the
//! heartbeat finds gone is abandoned locally at once. Each held job also has a local lease clock
//! (`LeaseClock`, on this process's monotonic clock): trusted until the send time of its claim
//! or of its last successful renewal, plus the lease less a fifth of it (`trusted_for`). The
//! job's own task watches that clock (`watch_lease`): when renewals fail for that long, the job
//! is cancelled and settles as a lost lease before the database lets another replica take it.
//! A replica with a session also trusts no lease longer than 1.5 s after its last beat that
//! succeeded (`beat`), since recovery may take a silent owner's jobs 1.75 s after its last
//! beat; the job's watch takes the earlier of the two clocks, and its cancellation is what
//! `JobContext::lease_lost` tells the handler.
//!
//! # Failure handling
//! A dead owner (no connection of its process left holding its owner lock or its alive lock, and
//! no beat for its silence, judged by the owner's own terms, stamped by the claim, and never by time the
//! recovering replica itself could not see; see `rescuer`) or an expired lease makes the row
//! reclaimable by recovery.
//! Recovery, like every fenced write, re-checks `status = 'running'` in the statement that
//! changes the row, and skips rows another session has locked (an executor committing).

use crate::job::handler::JobContext;
use crate::worker::liveness::beat::BeatClock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One claim of one job: what fences every write after the claim, and the only shape in which a
/// claim is held, sent or fenced. Two leases are the same lease when job and claim ids match (a
/// claim id names one claim, hence one fencing token); job ids alone never identify a lease, since
/// a replica may hold a stale claim and the live claim of the same job at once.
#[derive(Debug, Clone, Copy)]
pub struct Lease {
    /// The job's id.
    pub job_id: Uuid,
    /// The claim's id (`lease_claim_id`), compared by every fenced write.
    pub claim_id: Uuid,
    /// The job's fencing token under this claim (`fencing_token`), for systems outside
    /// PostgreSQL.
    pub fencing_token: i64,
}

impl PartialEq for Lease {
    fn eq(&self, other: &Lease) -> bool {
        (self.job_id, self.claim_id) == (other.job_id, other.claim_id)
    }
}

impl Eq for Lease {}

impl std::hash::Hash for Lease {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.job_id, self.claim_id).hash(state);
    }
}

/// The job ids and claim ids of `leases`, pairwise, as the `$1::uuid[], $2::uuid[]` of the fenced
/// statements that `unnest` them: the one place leases become SQL arrays.
pub fn unzip(leases: &[Lease]) -> (Vec<Uuid>, Vec<Uuid>) {
    leases.iter().map(|l| (l.job_id, l.claim_id)).unzip()
}

/// `leases` by their `(job id, claim id)`: how the rows a fenced statement returns become leases
/// again.
pub fn by_ids(leases: &[Lease]) -> HashMap<(Uuid, Uuid), Lease> {
    leases
        .iter()
        .map(|l| ((l.job_id, l.claim_id), *l))
        .collect()
}

/// A job this replica claimed, with the lease that fences it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// What the handler sees, including the claim id and the fencing token; shared with the
    /// job's effects, which keep it until they apply.
    pub ctx: Arc<JobContext>,
    /// The request payload (every live row has one).
    pub payload: serde_json::Value,
    /// Seconds the job had been due when it was claimed (database clock).
    pub due_for: f64,
    /// Which of the claim's asks (by position) it was claimed for: the queue it came from.
    pub asked_of: usize,
    /// The name of that queue (the claim's ask), for the job's tracing span and logs.
    pub queue: Arc<str>,
    /// Whether the claim holds a permit of its queue's cap or of its key's: its completion
    /// frees it and wakes nobody, so the completer claims again or wakes the waiting replicas
    /// (`worker::completer::wake_waiting`).
    pub held_permit: bool,
}

impl ClaimedJob {
    /// The job's id.
    pub fn id(&self) -> Uuid {
        self.ctx.id
    }

    /// The claim's id, which every fenced write of this crate compares.
    pub fn claim_id(&self) -> Uuid {
        self.ctx.lease_claim_id
    }

    /// The lease of this claim.
    pub fn lease(&self) -> Lease {
        Lease {
            job_id: self.ctx.id,
            claim_id: self.ctx.lease_claim_id,
            fencing_token: self.ctx.fencing_token,
        }
    }
}

/// A duration in whole milliseconds for SQL (`$n::bigint * interval '1 millisecond'`).
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The local lease clock of one held job: the instant after which the replica no longer trusts
/// the lease (its last renewal, measured from when that renewal was sent, plus the lease, less
/// the [`trust_margin`]). The job's own task watches it (`watch_lease`), so the job is
/// abandoned before the database lets another replica take it, however busy the claim loop is.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    /// The instant the offsets count from.
    base: Instant,
    /// Milliseconds after `base` until which the lease is trusted.
    trusted_ms: AtomicU64,
}

impl LeaseClock {
    /// A clock trusted until `until`.
    pub(crate) fn new(until: Instant) -> LeaseClock {
        let base = Instant::now();
        let clock = LeaseClock {
            base,
            trusted_ms: AtomicU64::new(0),
        };
        clock.trust_until(until);
        clock
    }

    /// Moves the trusted end to `until` (never backwards: renewals may answer out of order).
    pub(crate) fn trust_until(&self, until: Instant) {
        let ms = u64::try_from(until.saturating_duration_since(self.base).as_millis())
            .unwrap_or(u64::MAX);
        self.trusted_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The instant until which the lease is trusted.
    pub(crate) fn trusted_until(&self) -> Instant {
        self.base + Duration::from_millis(self.trusted_ms.load(Ordering::Relaxed))
    }
}

/// Waits until `clock` runs out without being renewed, or the replica's `beats` (when it beats)
/// run out first, then cancels the job (`lost`). Never returns while the lease is trusted.
pub(crate) async fn watch_lease(
    clock: &LeaseClock,
    beats: Option<&BeatClock>,
    lost: &CancellationToken,
    id: Uuid,
) {
    loop {
        let until = match beats.and_then(BeatClock::trusted_until) {
            Some(beaten) => clock.trusted_until().min(beaten),
            None => clock.trusted_until(),
        };
        if Instant::now() >= until {
            if !lost.is_cancelled() {
                tracing::warn!(
                    job_id = %id,
                    code = "lease_lost",
                    "lease not renewed in time; abandoning the job"
                );
                lost.cancel();
            }
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = lost.cancelled() => return,
        }
    }
}

/// How long after a renewal is sent the replica still trusts the lease: the lease less the
/// [`trust_margin`], so the job is abandoned locally before the database's lease (which starts
/// no earlier than the renewal was sent) lets another replica take it.
pub(crate) fn trusted_for(lease: Duration) -> Duration {
    lease.saturating_sub(trust_margin(lease))
}

/// The part of a lease the replica never relies on: a fifth of it, covering the clock drift
/// between this process and the database and the time an abandoned handler takes to stop.
fn trust_margin(lease: Duration) -> Duration {
    lease / 5
}

#[cfg(test)]
mod tests {
    use super::{watch_lease, LeaseClock};
    use std::time::Duration;

    #[tokio::test]
    async fn a_lease_clock_moves_only_forward_and_its_watch_cancels_when_it_runs_out() {
        let now = tokio::time::Instant::now();
        let clock = LeaseClock::new(now + Duration::from_millis(50));
        clock.trust_until(now + Duration::from_millis(10));
        // Kept in whole milliseconds, rounded down: trust ends at most 1 ms early, never late.
        assert!(clock.trusted_until() >= now + Duration::from_millis(49));
        let lost = tokio_util::sync::CancellationToken::new();
        watch_lease(&clock, None, &lost, uuid::Uuid::nil()).await;
        assert!(lost.is_cancelled());
        assert!(tokio::time::Instant::now() >= now + Duration::from_millis(49));
    }
}
