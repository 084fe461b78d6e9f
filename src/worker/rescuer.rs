//! Recovery: the role that, twice per poll interval, returns the jobs of dead owners and expired
//! leases to `pending` (or ends them
//! `failed` with `lease_expired_exhausted` when their attempts are spent). The owner lock that
//! tells live owners from dead ones is held by the replica's session (see `session`).
//!
//! Invariants this module keeps:
//! - Each live replica holds a session-level advisory lock keyed by
//!   `durable_etl_owner_lock_key(lease_owner_id)` on its long-lived owner session; a second
//!   process with the same owner id cannot take it and refuses to start.
//! - A `running` row claimed by a lock-backed owner (`lease_owner_locked`) is reclaimable before
//!   its lease expires only on two pieces of evidence together: the owner lock is gone AND the
//!   lease has not been renewed for [`owner_silence`] (two heartbeat intervals of the recovering
//!   replica). The lock alone is not evidence: it also vanishes while a live replica's session
//!   reconnects (a terminated backend, a restart or failover, a cut to the direct URL), and its
//!   pool goes on renewing meanwhile. Claims and heartbeats stamp `lease_owner_locked` from
//!   whether the session holds the lock right then.
//! - A `running` row whose lease expired is reclaimable whatever its owner. Nothing else is
//!   touched: recovery re-checks `status = 'running'` in the statement that changes the row,
//!   skips rows locked by a live executor, and never sees ended jobs (they have no live row).
//! - Every path back to `pending` honours a cancel request (the job ends `cancelled`: its live
//!   row, payload included, is deleted and its outcome appended in the same statement) and clears
//!   the whole lease, `lease_owner_locked` included.
//! - Recovery charges the attempt (it was counted at claim and the job did not finish), so a job
//!   that kills its worker every time still stops at `max_attempts`.
//! - Where no direct session can hold the lock (a transaction-mode pooler), dead owners are found
//!   by lease expiry alone.

use crate::db;
use crate::error::Error;
use crate::worker::lease::millis;
use crate::worker::presence;
use crate::worker::shared::Shared;
use crate::worker::timing::ticker;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// How long a lock-backed owner whose lock is gone must also have left its leases unrenewed
/// before recovery treats it as dead: two heartbeat intervals, so one late or failed heartbeat is
/// not enough, while a replica whose session is only reconnecting (its pool still renews) is
/// never taken for dead.
pub fn owner_silence(heartbeat_interval: Duration) -> Duration {
    heartbeat_interval.saturating_mul(2)
}

/// The tail of a recovery statement over CTE `stale` (columns `id`, `expired`, `cancel`, `again`,
/// its rows locked): each stale row goes back to `pending` with its lease cleared while attempts
/// remain and no cancel was asked; otherwise its live row is deleted and its outcome appended
/// (`cancelled`, or `failed` with `lease_expired_exhausted`). A row given back is appended to its
/// job's attempt history (`recovered`). Returns, per recovered row, whether its lease had expired
/// and its new status.
///
/// Locks: none beyond `stale`'s row locks (and `history`'s `FOR KEY SHARE` on the intake rows of
/// the jobs given back); both writes re-check `status = 'running'`.
macro_rules! recover_stale {
    () => {
        concat!(
            "
), recovered AS (
    UPDATE etl_job_records AS j
       SET status = 'pending', updated_at = now(), ",
            lease_cleared!(),
            "
      FROM stale
     WHERE j.id = stale.id AND stale.again AND NOT stale.cancel AND j.status = 'running'
 RETURNING stale.expired, j.status, ",
            attempt_columns!(),
            "
), history AS (
    ",
            attempt_ended!("recovered", "recovered"),
            "
), ended AS (
    DELETE FROM etl_job_records AS j
     USING stale
     WHERE j.id = stale.id AND NOT (stale.again AND NOT stale.cancel) AND j.status = 'running'
 RETURNING ",
            ended_columns!(),
            ", stale.expired, stale.cancel
), outcome AS (
    ",
            outcome_of!(
                "ended",
                "CASE WHEN cancel THEN 'cancelled' ELSE 'failed' END",
                "CASE WHEN cancel THEN cancel_code ELSE 'lease_expired_exhausted' END",
                "NULL::int4"
            ),
            "
)
SELECT expired, status FROM recovered
UNION ALL
SELECT e.expired, o.status FROM ended e JOIN outcome o ON o.job_id = e.id"
        )
    };
}

/// What a stale row is to recovery, beside its id: whether its owner asked to cancel it, and
/// whether attempts remain.
macro_rules! stale_columns {
    () => {
        concat!(
            cancel_requested!(),
            " AS cancel, j.attempts < j.max_attempts AS again"
        )
    };
}

/// Recovers every `running` row whose lease expired, or whose lock-backed owner holds no owner
/// lock and has not renewed the lease for `$1` milliseconds.
///
/// Locks: `live_owners` reads `pg_locks` once (a brief look at the lock manager). `stale` walks
/// the small `status = 'running'` partial index and row-locks each candidate (`FOR UPDATE`: the
/// strongest row lock, which the DELETE of an ending row needs) with `SKIP LOCKED`, so rows an
/// executor or another rescuer holds are left alone; after locking, PostgreSQL re-checks the
/// candidate against the current row version. Returns, per recovered row, whether its lease had
/// expired (else its owner was dead) and its new status.
pub const RECOVER_SQL: &str = concat!(
    "
WITH live_owners AS MATERIALIZED (
    SELECT (l.classid::bigint << 32) | l.objid::bigint AS lock_key
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
),
stale AS (
    SELECT j.id, j.lease_expires_at < now() AS expired, ",
    stale_columns!(),
    "
      FROM etl_job_records j
     WHERE j.status = 'running'
       AND (j.lease_expires_at < now()
            OR (j.lease_owner_locked
                AND coalesce(j.lease_renewed_at, '-infinity') < now() - $1 * interval '1 millisecond'
                AND NOT EXISTS (SELECT 1 FROM live_owners o
                                 WHERE o.lock_key = durable_etl_owner_lock_key(j.lease_owner_id))))
       FOR UPDATE OF j SKIP LOCKED",
    recover_stale!()
);

/// Releases the `running` rows a previous incarnation of owner `$1` left behind.
///
/// Locks: row-locks this owner's running rows (through the running partial index), skipping
/// any another session holds.
pub const RECOVER_OWN_SQL: &str = concat!(
    "
WITH stale AS (
    SELECT j.id, false AS expired, ",
    stale_columns!(),
    "
      FROM etl_job_records j
     WHERE j.status = 'running' AND j.lease_owner_id = $1
       FOR UPDATE OF j SKIP LOCKED",
    recover_stale!()
);

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Rows recovered because their lease expired.
    pub expired: u64,
    /// Rows recovered because their owner was dead.
    pub dead_owner: u64,
    /// Of those, rows that ended instead of going back to `pending` (`lease_expired_exhausted`,
    /// or `cancelled` at their owner's request).
    pub exhausted: u64,
}

/// Releases what a previous incarnation of `owner_id` left `running`; returns how many rows.
///
/// # Errors
/// The database error of the statement.
pub async fn recover_own(
    client: &impl GenericClient,
    owner_id: &str,
) -> Result<u64, tokio_postgres::Error> {
    let rows = client
        .query_typed(RECOVER_OWN_SQL, &[(&owner_id, Type::TEXT)])
        .await?;
    Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
}

/// At start-up, releases what a previous incarnation of `owner_id` left `running` (on a
/// connection of `pool`) and logs how many; returns how many.
///
/// # Errors
/// A checkout or database error.
pub(crate) async fn release_previous_incarnation(
    pool: &db::Pool,
    owner_id: &str,
) -> Result<u64, Error> {
    let conn = db::checkout(pool).await?;
    let released = recover_own(&*conn, owner_id).await?;
    if released > 0 {
        tracing::info!(released, "released the previous incarnation's running jobs");
    }
    Ok(released)
}

/// Runs one recovery pass. A lock-backed owner whose lock is gone counts as dead only once its
/// leases have also gone unrenewed for `silence` (see [`owner_silence`]).
///
/// # Errors
/// The database error of the statement.
pub async fn recover(
    client: &impl GenericClient,
    silence: Duration,
) -> Result<Recovered, tokio_postgres::Error> {
    let rows = client
        .query_typed(RECOVER_SQL, &[(&millis(silence), Type::INT8)])
        .await?;
    let mut recovered = Recovered::default();
    for row in rows {
        if row.get::<_, bool>(0) {
            recovered.expired += 1;
        } else {
            recovered.dead_owner += 1;
        }
        if row.try_get::<_, crate::state::JobState>(1)? != crate::state::JobState::Pending {
            recovered.exhausted += 1;
        }
    }
    Ok(recovered)
}

/// Deletes the waiting rows nobody refreshed for ten minutes (twice the longest poll interval,
/// `presence::STALE_AFTER`): replicas that died while waiting (their rows would make every
/// enqueue notify). Returns how many.
///
/// # Errors
/// The database error of the statement.
pub async fn forget_stale_waiters(
    client: &impl GenericClient,
) -> Result<u64, tokio_postgres::Error> {
    let stale_after = millis(presence::STALE_AFTER);
    client
        .execute_typed(presence::FORGET_STALE_SQL, &[(&stale_after, Type::INT8)])
        .await
}

/// The rescuer role: runs a recovery pass every [`rescue_interval`] (at once, then on every tick)
/// until `stop`, and signals `catch_up` when a pass returned jobs to `pending`, so the producer
/// claims them without waiting for its poll.
pub(crate) async fn run(shared: Arc<Shared>, catch_up: Arc<Notify>, stop: CancellationToken) {
    let mut tick = ticker(rescue_interval(shared.config.poll_interval));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => match pass(&shared).await {
                Ok(r) if r.expired + r.dead_owner > r.exhausted => catch_up.notify_one(),
                Ok(_) => {}
                Err(e) => tracing::warn!(code = %e.code(), "recovery failed"),
            },
        }
    }
}

/// One recovery pass on the replica's pool, counted and logged by its figures only.
///
/// # Errors
/// Database errors, and [`Error::Unavailable`] when the statement outlives its client-side bound.
#[tracing::instrument(name = "recovery", skip_all)]
pub(crate) async fn pass(shared: &Shared) -> Result<Recovered, Error> {
    let conn = db::checkout(&shared.pool).await?;
    shared.stats.record_round_trips(1);
    let silence = owner_silence(shared.config.heartbeat_interval);
    // Pipelined with the recovery statement, in the same round trip.
    let (forgotten, recovered) = futures::join!(
        db::bounded(shared.statement_bound, forget_stale_waiters(&*conn)),
        db::bounded(shared.statement_bound, recover(&*conn, silence))
    );
    let recovered = recovered?;
    if let Err(e) = forgotten {
        tracing::warn!(code = %e.code(), "forgetting stale waiting replicas failed");
    }
    shared.stats.record_recovery(recovered);
    if recovered != Recovered::default() {
        tracing::info!(
            expired = recovered.expired,
            dead_owner = recovered.dead_owner,
            exhausted = recovered.exhausted,
            "recovered jobs"
        );
    }
    Ok(recovered)
}

/// How often a replica runs recovery: twice per poll interval. A SIGKILLed replica's lock goes
/// at once, but a row its dying backend still locks (mid-effects) is skipped until the server
/// ends that backend (`client_connection_check_interval`); the second look comes half a poll
/// later instead of a whole one.
pub(crate) fn rescue_interval(poll_interval: Duration) -> Duration {
    poll_interval / 2
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn recovery_runs_twice_per_poll_interval() {
        assert_eq!(
            super::rescue_interval(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn an_owner_is_silent_after_two_heartbeat_intervals() {
        assert_eq!(
            super::owner_silence(Duration::from_secs(4)),
            Duration::from_secs(8)
        );
    }
}
