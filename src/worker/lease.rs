//! Leases: what a claim grants, and how every later write is scoped to it.
//!
//! # State model
//! A claim moves a `pending` row to `running` and stamps it with a lease: the replica's stable
//! `lease_owner_id`, a fresh `lease_claim_id` (unique per claim) and `lease_expires_at` (database
//! clock). It also adds 1 to the job's `fencing_token`, which nothing else writes: the token
//! numbers the job's terms in order, for external systems that must refuse a stale term. A lease
//! is a *term*: it ends when the job reaches a terminal state, is released, or is recovered by
//! any replica after the owner died or the lease expired.
//!
//! # Term-scoped operations
//! Every write after the claim (heartbeat, effects commit, retry scheduling, failure, release)
//! carries [`FENCE`]: `id`, `lease_claim_id` and `status = 'running'`. A write that matches no
//! row means the term is over: the worker abandons the job, rolls back, counts `lease_lost`, and
//! never reports success. Claim ids are compared, never timestamps; every time is the database's.
//!
//! # Trust window
//! Heartbeats renew the lease every `heartbeat_interval`, at most a third of the lease, so two
//! lost heartbeats still leave the lease alive. A job whose lease the heartbeat finds gone is
//! abandoned locally at once. Each job also has a local lease clock: trusted until the last
//! successful renewal's send time plus the lease less a fifth of it. When renewals fail for that
//! long, the job is abandoned locally before the database lets another replica take it.
//!
//! # Failure handling
//! A dead owner (its advisory lock gone with its session, and its leases unrenewed for two
//! heartbeat intervals) or an expired lease makes the row reclaimable by recovery. Recovery, like every fenced write, re-checks `status = 'running'` in
//! the statement that changes the row and skips rows locked by a live executor.

use crate::handler::JobContext;
use std::time::Duration;
use uuid::Uuid;

/// The predicate every post-claim write of one job carries (`$1` job id, `$2` claim id).
pub const FENCE: &str = "id = $1 AND lease_claim_id = $2 AND status = 'running'";

/// A job this replica claimed, with the lease that fences it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// What the handler sees, including the claim id and the fencing token.
    pub ctx: JobContext,
    /// The request payload (`None` if the row had none).
    pub payload: Option<serde_json::Value>,
    /// Seconds the job had been due when it was claimed (database clock).
    pub due_for: f64,
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
}

/// A duration in whole milliseconds for SQL (`$n::bigint * interval '1 millisecond'`).
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
