//! Recovery: the role that, twice per poll interval, returns the jobs of dead owners and expired
//! leases to `pending` (or ends them
//! `failed` with `lease_expired_exhausted` when their attempts are spent). The owner lock that
//! tells live owners from dead ones is held by the replica's session (see `session`).
//!
//! Invariants this module keeps:
//! - Each live replica holds a session-level advisory lock keyed by
//!   `durable_etl_owner_lock_key(lease_owner_id)` on its long-lived owner session; a second
//!   process with the same owner id cannot take it and refuses to start.
//! - Every connection a replica opens for itself also holds its owner's shared alive lock
//!   (`worker::alive`), unless it runs behind a transaction-mode pooler.
//! - A `running` row claimed by a lock-backed owner is reclaimable before its lease expires only
//!   when the owner is dead by its own terms, which its claim stamped on the row: no backend holds
//!   its owner lock or its alive lock (one dropped session leaves the others' alive locks: a
//!   terminated backend, a reconnecting session, a cut to the direct URL never make a live
//!   replica dead); its last beat is older than its silence (`beat`: a live replica whose every
//!   connection was cut at once beats again as soon as it reconnects, and stops trusting its
//!   leases before its silence ends); and, for an owner without alive locks, its leases also went
//!   unrenewed for two of ITS heartbeat intervals (`lease_heartbeat_ms`), not the recovering
//!   replica's.
//! - When a pass finds an owner whose locks are gone but whose silence has not ended, the next
//!   pass runs right when it ends, so a dead replica's jobs come back within its silence (1.75 s)
//!   and a few milliseconds, not a rescue interval later.
//! - Recovery never counts time during which the recovering replica itself could not reach the
//!   database: it judges no owner until it has reached the database (since its own last loss of
//!   it, and since the server started) for [`RECONNECT_GRACE`] plus two of the owner's heartbeat
//!   intervals, so after a server restart or a failover every owner has that long to reconnect
//!   before anyone takes it for dead.
//! - At start-up a replica releases what its previous incarnation left `running`, unless it took
//!   the owner lock over from a silent holder (a node that may still run those jobs, cut off):
//!   then only the rows past that incarnation's own trust window, the rest left to their leases.
//! - A `running` row whose lease expired is reclaimable whatever its owner. Nothing else is
//!   touched: recovery re-checks `status = 'running'` in the statement that changes the row,
//!   skips rows locked by a live executor, and never sees ended jobs (they have no live row).
//! - Every path back to `pending` honours a cancel request (the job ends `cancelled`: its live
//!   row, payload included, is deleted and its outcome appended in the same statement) and clears
//!   the whole lease, `lease_owner_locked` included.
//! - Recovery charges the attempt (it was counted at claim and the job did not finish), so a job
//!   that kills its worker every time still stops at `max_attempts`, and records the owner it
//!   took the attempt from: a replica that was only cut off, not dead, gives the charge back
//!   when it reaches the database again (`refund`).
//! - A job on its last attempt is never taken from a dead-judged owner before its lease expires
//!   (unless its owner asked to cancel it): the judgement may be wrong, and ending it
//!   `lease_expired_exhausted` could not be undone; a replica that restarts under the owner id
//!   releases it at once, charged, at start-up.
//! - Where no direct session can hold the lock (a transaction-mode pooler), dead owners are found
//!   by lease expiry alone.
//! - Each pass also applies the owners' cancel requests recorded while a commit held their job's
//!   row (`jobs::apply_deferred`: on the live row, or ending a job back in `pending`), never
//!   waiting for a row; a schema without them (before migration 0031) has none.

use crate::db;
use crate::error::Error;
use crate::jobs;
use crate::worker::lease::millis;
use crate::worker::liveness::presence;
use crate::worker::liveness::session::Session;
use crate::worker::shared::Shared;
use crate::worker::timing::{sleep_until_opt, ticker};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// The diagnosis of an attempt recovery took back (`job::diagnosis`), built from the row
/// `$row` (a prefix: `s.`, or empty for an unqualified row) of a CTE with columns `started_at`
/// and `expired`: phase `recovery`, decision `$decision` (`$delay`: its `delay_ms` item, or
/// empty), how long the attempt ran until now, and whether its lease had expired (else its
/// replica was judged dead). No error: recovery knows none.
macro_rules! recovery_diagnosis {
    ($decision:expr, $delay:expr, $row:expr) => {
        concat!(
            "jsonb_build_object('phase', 'recovery', 'decision', '",
            $decision,
            "'",
            $delay,
            ", 'duration_ms', floor(extract(epoch FROM now() - coalesce(",
            $row,
            "started_at, now())) * 1000)::int8, 'lease_expired', ",
            $row,
            "expired)"
        )
    };
}

/// The tail of a recovery statement over CTE `stale` (columns `id`, `expired`, `cancel`, `again`,
/// its rows locked): each stale row goes back to `pending` with its lease cleared while attempts
/// remain and no cancel was asked; otherwise its live row is deleted and its outcome appended
/// (`cancelled`, or `failed` with `lease_expired_exhausted`). A row given back is appended to its
/// job's attempt history (`recovered`) with its diagnosis (`recovery_diagnosis`), and so is the
/// outcome of a job ended `failed` (a cancelled one's keeps none). The permits of the claims recovered are freed (`freed`). Returns, per recovered row, whether its lease had expired
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
 RETURNING stale.expired, j.status, stale.owner_id, ",
            attempt_columns!(),
            "
), history AS (
    ",
            attempt_ended!(
                "recovered",
                "recovered",
                "s.owner_id",
                diagnosis: recovery_diagnosis!("retry", ", 'delay_ms', 0", "s.")
            ),
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
                "NULL::int4",
                diagnosis: concat!(
                    "CASE WHEN cancel THEN NULL ELSE ",
                    recovery_diagnosis!("fail", "", ""),
                    " END"
                )
            ),
            "
), letter AS (
    ",
            dead_letters_of!("outcome"),
            "
), ",
            permits_freed!(
                "SELECT s.queue, s.permit_slot, s.claim_id FROM stale s
                  WHERE s.id IN (SELECT id FROM recovered UNION ALL SELECT id FROM ended)"
            ),
            "
SELECT expired, status, NULL::int8 AS judge_again_ms FROM recovered
UNION ALL
SELECT e.expired, o.status, NULL::int8 FROM ended e JOIN outcome o ON o.job_id = e.id"
        )
    };
}

/// Whether no backend of this database holds the owner lock or the alive lock of row `j`'s owner
/// (`live_owners`: the advisory locks held right now).
macro_rules! owner_lockless {
    () => {
        "NOT EXISTS (SELECT 1 FROM live_owners o
                     WHERE o.lock_key IN (durable_etl_owner_lock_key(j.lease_owner_id),
                                          durable_etl_owner_alive_key(j.lease_owner_id)))"
    };
}

/// Whether row `j`'s owner beat within its silence (`etl_owner_beats`, migration 0030; see
/// `beat`): then it is alive, whatever its locks say.
macro_rules! owner_beating {
    () => {
        "EXISTS (SELECT 1 FROM etl_owner_beats b
                  WHERE b.owner_id = j.lease_owner_id
                    AND b.beat_at >= now() - b.silence_ms * interval '1 millisecond')"
    };
}

/// Whether row `j` may be taken from a dead-judged owner before its lease expires: attempts
/// remain, or its owner asked to cancel it. A job on its last attempt waits for its lease: the
/// judgement may be wrong (an owner cut off, not dead), and ending the job
/// `lease_expired_exhausted` could not be undone when its owner comes back; by the lease's end
/// the owner has stopped trusting it, and has given it back uncharged if it reached the database.
macro_rules! judged_before_expiry {
    () => {
        concat!("(j.attempts < j.max_attempts OR ", cancel_requested!(), ")")
    };
}

/// What a stale row is to recovery, beside its id: whether its owner asked to cancel it, whether
/// attempts remain, the permit its claim holds, and the owner it is taken from (recorded with a
/// recovered attempt, migration 0032).
macro_rules! stale_columns {
    () => {
        concat!(
            cancel_requested!(),
            " AS cancel, j.attempts < j.max_attempts AS again, j.queue, j.permit_slot,
           j.lease_claim_id AS claim_id, j.lease_owner_id AS owner_id"
        )
    };
}

/// Recovers every `running` row whose lease expired, or whose lock-backed owner is dead
/// ([`Judgement`], its values in `$1..$3`).
///
/// An owner is dead when no backend of this database holds its owner lock or its alive lock
/// (`worker::alive`), its last beat (`etl_owner_beats`, see `beat`) is older than its silence
/// (an owner that never beat, a release before beats, is judged without it), this replica has reached the database for at least [`RECONNECT_GRACE`]
/// plus two of the owner's heartbeat intervals (counted from its own last loss of the database,
/// and from the server's start: `pg_postmaster_start_time()`), and, for an owner whose
/// connections do not all hold alive locks (`--poll-only`), its leases have also gone
/// unrenewed for two of its heartbeat intervals. The owner's interval is the row's
/// `lease_heartbeat_ms` (`$1`, this replica's own, for rows an older release claimed); `$2` is
/// how long this replica has reached the database, `$3` the grace, both in milliseconds.
///
/// Locks: `live_owners` reads `pg_locks` once (a brief look at the lock manager). `stale` walks
/// the small `status = 'running'` partial index and row-locks each candidate (`FOR UPDATE`: the
/// strongest row lock, which the DELETE of an ending row needs) with `SKIP LOCKED`, so rows an
/// executor or another rescuer holds are left alone; after locking, PostgreSQL re-checks the
/// candidate against the current row version. Returns, per recovered row, whether its lease had
/// expired (else its owner was dead) and its new status; and, in a row of its own, in how many
/// milliseconds the first running row of an owner whose locks are gone but which beat within its
/// silence becomes reclaimable (`beating`), so the rescuer judges again right then.
pub const RECOVER_SQL: &str = concat!(
    "
WITH live_owners AS MATERIALIZED (
    SELECT (l.classid::bigint << 32) | l.objid::bigint AS lock_key
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), seen AS MATERIALIZED (
    SELECT least($2 * interval '1 millisecond', now() - pg_postmaster_start_time()) AS reachable
),
stale AS (
    SELECT j.id, j.lease_expires_at < now() AS expired, ",
    stale_columns!(),
    "
      FROM etl_job_records j, seen
     WHERE j.status = 'running'
       AND (j.lease_expires_at < now()
            OR ((j.lease_owner_locked OR j.lease_owner_alive_locked)
                AND ",
    judged_before_expiry!(),
    "
                AND ",
    owner_lockless!(),
    "
                AND NOT ",
    owner_beating!(),
    "
                AND seen.reachable >= ($3 + 2 * coalesce(j.lease_heartbeat_ms, $1))
                                      * interval '1 millisecond'
                AND (j.lease_owner_alive_locked
                     OR coalesce(j.lease_renewed_at, '-infinity')
                        < now() - 2 * coalesce(j.lease_heartbeat_ms, $1) * interval '1 millisecond')))
       FOR UPDATE OF j SKIP LOCKED
), beating AS (
    SELECT min(b.beat_at + b.silence_ms * interval '1 millisecond') AS judged_at
      FROM etl_job_records j JOIN etl_owner_beats b ON b.owner_id = j.lease_owner_id
     WHERE j.status = 'running' AND (j.lease_owner_locked OR j.lease_owner_alive_locked)
       AND ",
    judged_before_expiry!(),
    "
       AND ",
    owner_lockless!(),
    "
       AND b.beat_at >= now() - b.silence_ms * interval '1 millisecond'",
    recover_stale!(),
    "
UNION ALL
SELECT NULL, NULL, ceil(extract(epoch FROM judged_at - now()) * 1000)::int8
  FROM beating WHERE judged_at IS NOT NULL"
);

/// Releases the `running` rows a previous incarnation of owner `$1` left behind; when `$2` (the
/// owner lock was taken over from a silent holder: the previous incarnation may be alive, cut
/// off from the database), only the rows past that incarnation's own trust window (it stops
/// trusting a lease a fifth of the lease before it expires, counted from its last renewal; see
/// `lease`), leaving the others to their leases.
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
       AND (NOT $2
            OR now() >= j.lease_expires_at - (j.lease_expires_at - j.lease_renewed_at) / 5)
       FOR UPDATE OF j SKIP LOCKED",
    recover_stale!()
);

/// Releases what a previous incarnation of `owner_id` left `running` (when `took_over`, only what
/// it no longer trusts; see [`RECOVER_OWN_SQL`]); returns how many rows.
///
/// # Errors
/// The database error of the statement.
pub async fn recover_own(
    client: &impl GenericClient,
    owner_id: &str,
    took_over: bool,
) -> Result<u64, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            RECOVER_OWN_SQL,
            &[(&owner_id, Type::TEXT), (&took_over, Type::BOOL)],
        )
        .await?;
    Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
}

/// At start-up, releases what a previous incarnation of `owner_id` left `running` (on a
/// connection of `pool`; when the replica's `session` took the owner lock over from a silent
/// holder, only what that incarnation no longer trusts) and logs how many; returns how many.
///
/// # Errors
/// A checkout or database error.
pub(crate) async fn release_previous_incarnation(
    pool: &db::Pool,
    owner_id: &str,
    session: &Option<Session>,
) -> Result<u64, Error> {
    let took_over = session.as_ref().is_some_and(Session::took_over);
    let conn = db::checkout(pool).await?;
    let released = recover_own(&*conn, owner_id, took_over).await?;
    if released > 0 {
        tracing::info!(released, "released the previous incarnation's running jobs");
    }
    Ok(released)
}

/// What a recovering replica brings to its judgement of other owners ([`RECOVER_SQL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    /// This replica's heartbeat interval: the owner's, for rows an older release claimed.
    pub heartbeat_interval: Duration,
    /// For how long this replica has reached the database without a loss it saw
    /// (`Duration::MAX`: it never lost it).
    pub reachable_for: Duration,
}

/// How long a replica that regained the database (or a server that restarted) gives every other
/// owner to reconnect its own connections, beyond two of the owner's heartbeat intervals: ten
/// times the longest pause between a session's reconnect attempts (its jitter included), for
/// owners whose reconnects a busy server or network slows.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(5);

/// [`RECONNECT_GRACE`] outlasts ten of a session's longest pauses between reconnect attempts.
const _: () = assert!(
    RECONNECT_GRACE.as_millis() >= 10 * 2 * crate::jobs::notifier::RECONNECT_MAX_DELAY.as_millis()
);

/// How long after an owner's silence ends a judgement scheduled for that moment runs: past the
/// end on the database's clock, whatever the rounding.
const JUDGE_AFTER_SILENCE: Duration = Duration::from_millis(5);

/// The longest reachability [`recover`] passes on (a year; `Duration::MAX` would overflow an
/// SQL interval).
const REACHABLE_CAP: Duration = Duration::from_secs(365 * 24 * 3600);

/// Runs one recovery pass, judging owners as `judgement` says (see [`RECOVER_SQL`]).
///
/// # Errors
/// The database error of the statement.
pub async fn recover(
    client: &impl GenericClient,
    judgement: Judgement,
) -> Result<Recovered, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            RECOVER_SQL,
            &[
                (&millis(judgement.heartbeat_interval), Type::INT8),
                // A year is as good as forever, and stays inside an interval's range.
                (
                    &millis(judgement.reachable_for.min(REACHABLE_CAP)),
                    Type::INT8,
                ),
                (&millis(RECONNECT_GRACE), Type::INT8),
            ],
        )
        .await?;
    let mut recovered = Recovered::default();
    for row in rows {
        let judge_again_ms: Option<i64> = row.try_get(2)?;
        match (row.try_get::<_, Option<bool>>(0)?, judge_again_ms) {
            (Some(true), _) => recovered.expired += 1,
            (Some(false), _) => recovered.dead_owner += 1,
            (None, Some(ms)) => {
                let ms = u64::try_from(ms).unwrap_or(0);
                recovered.judge_again_in = Some(Duration::from_millis(ms) + JUDGE_AFTER_SILENCE);
                continue;
            }
            (None, None) => continue,
        }
        if row.try_get::<_, crate::jobs::state::JobState>(1)?
            != crate::jobs::state::JobState::Pending
        {
            recovered.exhausted += 1;
        }
    }
    Ok(recovered)
}

/// Deletes the waiting rows of replicas that are gone (`presence::FORGET_STALE_SQL`): their
/// owner lock is free, or nobody refreshed them for ten minutes (twice the longest poll
/// interval, `presence::STALE_AFTER`). Returns how many.
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
    let mut judge_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = sleep_until_opt(judge_at) => {}
        }
        judge_at = None;
        match pass(&shared).await {
            Ok(r) => {
                if r.expired + r.dead_owner > r.exhausted {
                    catch_up.notify_one();
                }
                judge_at = r.judge_again_in.map(|d| tokio::time::Instant::now() + d);
            }
            Err(e) => tracing::warn!(code = %e.code(), "recovery failed"),
        }
    }
}

/// One recovery pass on the replica's pool, counted and logged by its figures only.
///
/// # Errors
/// Database errors, and [`Error::Unavailable`] when the statement outlives its client-side bound.
#[tracing::instrument(name = "recovery", skip_all)]
pub(crate) async fn pass(shared: &Shared) -> Result<Recovered, Error> {
    let passed = judged_pass(shared).await;
    if passed.is_err() {
        shared.lost_the_database();
    }
    passed
}

/// [`pass`], without noting a failure.
async fn judged_pass(shared: &Shared) -> Result<Recovered, Error> {
    let conn = db::checkout(&shared.pool).await?;
    shared.stats.record_round_trips(1);
    let judgement = Judgement {
        heartbeat_interval: shared.config.heartbeat_interval,
        reachable_for: shared.reachable_for(std::time::Instant::now()),
    };
    // Pipelined with the recovery statement, in the same round trip.
    let (forgotten, recovered, deferred) = futures::join!(
        db::bounded(shared.statement_bound, forget_stale_waiters(&*conn)),
        db::bounded(shared.statement_bound, recover(&*conn, judgement)),
        db::bounded(shared.statement_bound, jobs::apply_deferred(&*conn, None))
    );
    let recovered = recovered?;
    if let Err(e) = forgotten {
        tracing::warn!(code = %e.code(), "forgetting stale waiting replicas failed");
    }
    match deferred {
        Err(e) => tracing::warn!(code = %e.code(), "applying deferred cancel requests failed"),
        Ok(a) if a.requested + a.cancelled > 0 => tracing::info!(
            requested = a.requested,
            cancelled = a.cancelled,
            "applied deferred cancel requests"
        ),
        Ok(_) => {}
    }
    shared.stats.record_recovery(recovered);
    if recovered.any() {
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

pub mod recovered;
pub use recovered::Recovered;

#[cfg(test)]
mod tests;
