//! Heartbeats: the role that, once per interval, renews in one statement the leases of every job
//! the replica holds, on a task of its own (so a busy claim loop never delays a renewal).
//!
//! Invariants this module keeps:
//! - A heartbeat renews only rows still `running` under this owner AND one of the claim ids the
//!   replica holds; it never revives a lease another claim or recovery has taken.
//! - A claim the heartbeat reports as no longer held is lost: the caller abandons that job locally.
//! - A heartbeat re-stamps `lease_owner_locked` from the session's real lock state, and
//!   `lease_renewed_at`, the evidence recovery needs before it takes a lock-less owner for dead.
//! - A heartbeat never waits on a row lock: a row locked by this replica's own executor (committing
//!   right now) is reported as held but not renewed, and its commit settles it.

use crate::db;
use crate::error::Error;
use crate::worker::lease::{self, millis};
use crate::worker::liveness::held::HeldJobs;
use crate::worker::shared::Shared;
use crate::worker::timing::ticker;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Renews the leases of owner `$1`'s claims `$2` by `$3` ms, stamps whether the owner holds its
/// owner lock right now (`$4`), and returns the claims still held, each with whether it was
/// renewed (a held row that this replica's own commit has locked is not).
///
/// Locks: `held` is a plain snapshot read (no lock). `renew` row-locks the held rows with
/// `SKIP LOCKED`, so a row an executor is committing is skipped instead of waited for. The UPDATE
/// changes only lease columns that no index covers, so it is a HOT update.
pub const HEARTBEAT_SQL: &str = "
WITH held AS (
    SELECT id, lease_claim_id
      FROM etl_job_records
     WHERE lease_owner_id = $1 AND status = 'running' AND lease_claim_id = ANY($2)
),
renew AS (
    SELECT j.id
      FROM etl_job_records j JOIN held h ON h.id = j.id
     WHERE j.lease_claim_id = h.lease_claim_id AND j.status = 'running'
       FOR UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE etl_job_records j
       SET lease_expires_at = now() + $3 * interval '1 millisecond',
           lease_renewed_at = now(),
           lease_owner_locked = $4
      FROM renew
     WHERE j.id = renew.id
 RETURNING j.id
)
SELECT h.lease_claim_id, EXISTS (SELECT 1 FROM renewed r WHERE r.id = h.id) FROM held h";

/// Renews `claims` for `owner_id`, stamping `owner_locked`; returns the subset still held by
/// this replica, each with whether its lease was renewed now.
///
/// # Errors
/// The database error of the statement.
pub async fn beat(
    client: &impl GenericClient,
    owner_id: &str,
    claims: &[Uuid],
    lease: Duration,
    owner_locked: bool,
) -> Result<HashMap<Uuid, bool>, tokio_postgres::Error> {
    if claims.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = client
        .query_typed(
            HEARTBEAT_SQL,
            &[
                (&owner_id, Type::TEXT),
                (&claims, Type::UUID_ARRAY),
                (&millis(lease), Type::INT8),
                (&owner_locked, Type::BOOL),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The heartbeat role: renews the leases of `held` every heartbeat interval (at once, then on
/// every tick) until `stop`. A failed heartbeat is logged by code and left to the next tick; the
/// jobs' own lease clocks abandon them if renewals fail for too long.
pub(crate) async fn run(shared: Arc<Shared>, held: HeldJobs, stop: CancellationToken) {
    let mut tick = ticker(shared.config.heartbeat_interval);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {
                if let Err(e) = renew(&shared, &held).await {
                    tracing::warn!(code = %e.code(), "heartbeat failed");
                }
            }
        }
    }
}

/// Renews the leases of `held`; cancels the jobs whose lease is gone (their tasks then end with
/// `LeaseLost`, unless they had already settled). A renewal moves each renewed job's local lease
/// clock forward, from when it was sent.
#[tracing::instrument(name = "heartbeat", skip_all, fields(held = tracing::field::Empty))]
async fn renew(shared: &Shared, held: &HeldJobs) -> Result<(), Error> {
    let jobs = held.renewable();
    tracing::Span::current().record("held", jobs.len());
    let claims: Vec<Uuid> = jobs.iter().map(|j| j.claim).collect();
    let conn = db::checkout(&shared.pool).await?;
    if !claims.is_empty() {
        crash_point!("heartbeat");
    }
    shared.stats.record_round_trips(1);
    let sent = Instant::now();
    let config = &shared.config;
    // A heartbeat slower than its interval is as good as lost: the next one is due.
    let still_held = db::bounded(
        config.heartbeat_interval.min(shared.statement_bound),
        beat(
            &*conn,
            shared.owner_id(),
            &claims,
            config.lease,
            shared.owner_locked(),
        ),
    )
    .await?;
    let trusted_until = sent + lease::trusted_for(config.lease);
    for job in jobs {
        match still_held.get(&job.claim) {
            Some(true) => job.clock.trust_until(trusted_until),
            // Held but locked by this replica's own commit: not renewed, not lost.
            Some(false) => {}
            None if job.lost.is_cancelled() => {}
            None => {
                job.lost.cancel();
                tracing::debug!(job_id = %job.id, "heartbeat found the lease gone");
            }
        }
    }
    Ok(())
}
