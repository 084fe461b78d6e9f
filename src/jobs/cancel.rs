//! An owner's cancellation of a job, and the requests recorded while a commit held the job.
//!
//! Invariants this module keeps:
//! - A cancellation is decided under the job's row lock: a pending job ends `cancelled` at once
//!   (payload cleared); a running job gets a cancel request on its live row (`cancel_code`),
//!   which its fenced commit, retry, release and recovery honour; a terminal job is left alone.
//!   A request on the live row and a commit can never both win.
//! - An owner's cancel (`cancelled`) never waits for a lock a commit holds: when a running job's
//!   row stays held (its group commit is applying its effects), the request is recorded in
//!   `etl_job_cancel_deferred` (migration 0031) and answered [`Cancel::Deferred`], which promises
//!   nothing about the commit: the job may still succeed. A request answered so is never lost:
//!   it stays recorded until it is applied to the live row (or ends the job if it went back to
//!   `pending`), or until the job has ended, whichever comes first; [`apply_deferred`] (a
//!   replica's retry and release, just before them, and every rescuer pass), [`await_deferred`]
//!   (the API, right after answering) and the owner's next cancel apply it.
//! - A replacement's cancel (`replaced`) waits for the job's row, as it must: the replacement is
//!   refused when the job it names ended meanwhile.

use crate::codes::Code;
use crate::error::Error;
use crate::jobs::backend::{Backend, CancelParams, Pg};
use crate::jobs::state::JobState;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// The first CTE of a cancellation: `target`, job `$1` of owner `$2` and its status in the
/// statement's snapshot. Locks: none (the job's intake row, and its live row or outcome, by
/// primary key).
macro_rules! cancel_target {
    () => {
        "
WITH target AS (
    SELECT i.id, coalesce(o.status, j.status) AS status
      FROM etl_job_intake i
      LEFT JOIN etl_job_records j ON j.id = i.id
      LEFT JOIN etl_job_outcomes o ON o.job_id = i.id
     WHERE i.id = $1 AND i.owner_key = $2
)"
    };
}

/// CTEs `cancelled` and `outcome`: job `target` ends `cancelled` with code `$3` if the snapshot
/// saw it `pending` and its row still is (row-locked, waiting for a claim's short transaction,
/// then re-checked on the row's current version).
macro_rules! cancel_pending {
    () => {
        concat!(
            ", cancelled AS (
    DELETE FROM etl_job_records AS j
     USING target t
     WHERE j.id = t.id AND t.status = 'pending' AND j.status = 'pending'
 RETURNING ",
            ended_columns!(),
            "
), outcome AS (
    ",
            outcome_of!("cancelled", "'cancelled'", "$3::text", "NULL::int4"),
            "
)"
        )
    };
}

/// Cancels job `$1` of owner `$2` with code `$3`, waiting for the job's row: a pending job ends
/// at once, a running job gets a cancel request (its live row's `cancel_code`; a job asked twice
/// keeps the first code). Returns the status the job had in the statement's snapshot, and whether
/// the statement did what that status calls for: when it did not, the job changed between the
/// snapshot and the row lock, and the caller looks again. Serves a replacement's cancel.
///
/// Locks: `target` takes none. `cancelled` (snapshot saw it `pending`) or `requested` (snapshot
/// saw it `running`) row-locks the live row, waiting for a claim's short transaction or a group
/// commit's effects (at most `lock_timeout`), then re-checks its status on the row's current
/// version: a job whose commit held the row is gone by then (it succeeded, and the request
/// answers so), and a job whose request holds the row makes the group commit wait and then see
/// the request.
pub const CANCEL_SQL: &str = concat!(
    cancel_target!(),
    cancel_pending!(),
    ", requested AS (
    UPDATE etl_job_records AS j
       SET cancel_code = coalesce(j.cancel_code, $3::text)
      FROM target t
     WHERE j.id = t.id AND t.status = 'running' AND j.status = 'running'
 RETURNING j.id
)
SELECT t.status, EXISTS (SELECT 1 FROM outcome) OR EXISTS (SELECT 1 FROM requested)
  FROM target t"
);

/// [`CANCEL_SQL`] that never waits for a running job's row: `held` locks it only if no other
/// session holds it (`SKIP LOCKED`), and only then is the request set on it (and any request
/// recorded before cleared). When the row is held and `$4` (the caller's last try), the request
/// is recorded in `etl_job_cancel_deferred` instead (the first code stays). A pending job is
/// cancelled as by [`CANCEL_SQL`]. Returns the snapshot's status and whether the pending job was
/// cancelled or the running job's request set on its row.
///
/// Locks: as [`CANCEL_SQL`] for a pending job; for a running one, its live row if free (`FOR NO
/// KEY UPDATE`, which the request's UPDATE needs, `SKIP LOCKED`), and the deferred request's row
/// (its foreign key: `FOR KEY SHARE` on the job's intake row, which nothing else conflicts with),
/// found by primary key.
pub const CANCEL_NOWAIT_SQL: &str = concat!(
    cancel_target!(),
    ", held AS (
    SELECT j.id FROM etl_job_records j JOIN target t ON t.id = j.id
     WHERE t.status = 'running' AND j.status = 'running'
       FOR NO KEY UPDATE OF j SKIP LOCKED
)",
    cancel_pending!(),
    ", requested AS (
    UPDATE etl_job_records AS j
       SET cancel_code = coalesce(j.cancel_code, $3::text)
      FROM held h
     WHERE j.id = h.id AND j.status = 'running'
 RETURNING j.id
), deferred AS (
    INSERT INTO etl_job_cancel_deferred (job_id, code)
    SELECT t.id, $3::text FROM target t
     WHERE $4 AND t.status = 'running' AND NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (job_id) DO NOTHING
), cleared AS (
    DELETE FROM etl_job_cancel_deferred AS d
     WHERE d.job_id = $1
       AND (EXISTS (SELECT 1 FROM requested) OR EXISTS (SELECT 1 FROM outcome))
)
SELECT t.status, EXISTS (SELECT 1 FROM outcome) OR EXISTS (SELECT 1 FROM requested)
  FROM target t"
);

/// Applies the deferred requests (`etl_job_cancel_deferred`) of job `$1`, or of any job when
/// `$1` is NULL (at most 100 per statement): a running job's live row gets the request (the
/// first code stays), a pending job ends `cancelled` with the request's code; the requests so
/// applied, and those of jobs that have no live row left (they ended), are cleared; a request
/// whose row `held` could not lock stays for the next pass. Returns how many requests it set on
/// running jobs, how many pending jobs it ended, and how many requests it cleared. `$lock` is
/// `SKIP LOCKED` (a sweep never waits) or empty (wait, at most `lock_timeout`, for the commit
/// holding the row; after the wait, `j.status` is re-checked on the row's new version, but a job
/// the snapshot saw running and finds given back to `pending` is left to the next look).
///
/// Locks: the live rows of the requested jobs (`FOR NO KEY UPDATE`; a pending one's DELETE then
/// takes `FOR UPDATE`, which only a foreign-key check of another session could delay), the
/// requests' rows.
macro_rules! apply_deferred_sql {
    ($lock:expr) => {
        concat!(
            "
WITH deferred AS (
    SELECT d.job_id, d.code FROM etl_job_cancel_deferred d
     WHERE $1::uuid IS NULL OR d.job_id = $1
     ORDER BY d.job_id LIMIT 100
), held AS (
    SELECT j.id, d.code FROM etl_job_records j JOIN deferred d ON d.job_id = j.id
       FOR NO KEY UPDATE OF j ",
            $lock,
            "
), requested AS (
    UPDATE etl_job_records AS j
       SET cancel_code = coalesce(j.cancel_code, h.code)
      FROM held h
     WHERE j.id = h.id AND j.status = 'running'
 RETURNING j.id
), cancelled AS (
    DELETE FROM etl_job_records AS j
     USING held h
     WHERE j.id = h.id AND j.status = 'pending'
 RETURNING ",
            ended_columns!(),
            ", h.code
), outcome AS (
    ",
            outcome_of!("cancelled", "'cancelled'", "code", "NULL::int4"),
            "
), cleared AS (
    DELETE FROM etl_job_cancel_deferred AS x
     USING deferred d
     WHERE x.job_id = d.job_id
       AND (d.job_id IN (SELECT id FROM requested) OR d.job_id IN (SELECT job_id FROM outcome)
            OR NOT EXISTS (SELECT 1 FROM etl_job_records j WHERE j.id = d.job_id))
 RETURNING x.job_id
)
SELECT (SELECT count(*) FROM requested), (SELECT count(*) FROM outcome),
       (SELECT count(*) FROM cleared)"
        )
    };
}

/// Applies deferred requests without waiting for any row. See `apply_deferred_sql!`.
pub const APPLY_DEFERRED_SQL: &str = apply_deferred_sql!("SKIP LOCKED");

/// Applies job `$1`'s deferred request, waiting for its row. See `apply_deferred_sql!`.
pub const AWAIT_DEFERRED_SQL: &str = apply_deferred_sql!("");

/// How many times a cancellation looks at a job: again when it stopped being `pending` between
/// the snapshot and the row lock (claimed meanwhile: the next look sees the claim), and, for an
/// owner's cancel, when a running job's row was held by another session (a heartbeat's renewal
/// or a claim holds it for a moment; a commit for as long as the job's effects take).
const CANCEL_ATTEMPTS: usize = 4;

/// The pause before an owner's cancel looks again at a running job whose row was held, doubled
/// each time: 10, 20 and 40 ms, so a held row is given 70 ms to come free before the request is
/// recorded for later (a commit of effects that do not wait on anything takes a few ms).
const HELD_PAUSE: Duration = Duration::from_millis(10);

/// What a cancellation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// The job was pending and is `cancelled` now.
    Cancelled,
    /// The job was running; it will end `cancelled` and its effects will not commit.
    Requested,
    /// The job was running and its commit held it (its effects were being applied): the request
    /// is recorded, and takes effect if that commit does not end the job (a retry, a release or
    /// a recovery ends it `cancelled` instead of running it again); the job may still succeed,
    /// or fail, with that commit. Its status tells which.
    Deferred,
    /// The job had already ended with this status.
    AlreadyEnded(String),
    /// The owner has no such job.
    NotFound,
}

/// Cancels job `id` of `owner`; `code` is `cancelled` (the owner's cancel, which never waits for
/// a commit: see [`Cancel::Deferred`]) or `replaced` (a replacement's, which waits for the job's
/// row, at most `lock_timeout`, and never answers `Deferred`). Applies any request recorded
/// earlier for the job when its row is free.
///
/// # Errors
/// Database errors; [`Error::Contended`] when a claim took the job between the snapshot and the
/// row lock on each of its tries (nothing was written).
pub async fn cancel(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
    code: Code,
) -> Result<Cancel, Error> {
    cancel_on(&mut Pg(client.client()), owner, id, code).await
}

/// [`cancel`] on any client the library takes ([`Backend`]: tokio-postgres, or sqlx with the
/// `sqlx` feature).
pub(crate) async fn cancel_on(
    client: &mut impl Backend,
    owner: &[u8; 32],
    id: Uuid,
    code: Code,
) -> Result<Cancel, Error> {
    let waits = code == Code::Replaced;
    let code = code.as_str();
    let mut pause = HELD_PAUSE;
    for attempt in 1..=CANCEL_ATTEMPTS {
        let last = attempt == CANCEL_ATTEMPTS;
        let (sql, last_param) = if waits {
            (CANCEL_SQL, None)
        } else {
            (CANCEL_NOWAIT_SQL, Some(last))
        };
        let params = CancelParams {
            id,
            owner,
            code,
            last: last_param,
        };
        let Some((status, done)) = client.cancel(sql, params).await? else {
            return Ok(Cancel::NotFound);
        };
        return Ok(match status {
            JobState::Pending if done => Cancel::Cancelled,
            JobState::Running if done => Cancel::Requested,
            // Held by a commit on the last try: the statement recorded the request.
            JobState::Running if !waits && last => Cancel::Deferred,
            JobState::Running if !waits => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                continue;
            }
            // Claimed, given back or ended between the snapshot and the row lock: look again.
            JobState::Pending | JobState::Running => continue,
            ended => Cancel::AlreadyEnded(ended.as_str().to_owned()),
        });
    }
    Err(Error::Contended)
}

/// What applying deferred requests did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Requests set on running jobs' live rows.
    pub requested: u64,
    /// Pending jobs ended `cancelled`.
    pub cancelled: u64,
    /// Requests cleared: those applied, and those of jobs that had ended.
    pub cleared: u64,
}

/// Runs one of the `apply_deferred_sql!` statements for job `id`.
async fn apply(client: &impl GenericClient, sql: &str, id: Uuid) -> Result<Applied, Error> {
    let row = client.query_typed_one(sql, &[(&id, Type::UUID)]).await?;
    Ok(applied(&row))
}

/// The counts of a row an `apply_deferred_sql!` statement returned.
fn applied(row: &Row) -> Applied {
    let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    Applied {
        requested: count(0),
        cancelled: count(1),
        cleared: count(2),
    }
}

/// Applies the deferred request of job `job` (of every job when `None`, at most 100) if the
/// job's row is free now, and clears those of ended jobs; never waits for a row. A replica sends
/// it for one job right before that job's retry (pipelined: the retry then sees the request),
/// for every job before a release, and in each rescuer pass. A schema before migration 0031 has
/// none to apply.
///
/// # Errors
/// Database errors.
pub async fn apply_deferred(
    client: &impl GenericClient,
    job: Option<Uuid>,
) -> Result<Applied, Error> {
    match client
        .query_typed_one(APPLY_DEFERRED_SQL, &[(&job, Type::UUID)])
        .await
    {
        Ok(row) => Ok(applied(&row)),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(Applied::default()),
        Err(e) => Err(e.into()),
    }
}

/// How many times [`await_deferred`] waits for a job's row: a look that waited sees the row's
/// new version only through its own snapshot's eyes (a job the commit ended, or that its retry
/// or release gave back meanwhile, is applied by the next look, with a new snapshot).
const AWAIT_LOOKS: usize = 3;

/// Applies job `id`'s deferred request as soon as the commit that holds its row lets go
/// (waiting at most the session's `lock_timeout` each time), looking again (at most three looks)
/// until the request is cleared: set on the row of a job that still runs, ending `cancelled` a
/// job that the commit's retry or release gave back to `pending` (which a retry's delay keeps
/// from running meanwhile), or cleared because the commit ended the job. Sent right after a
/// [`Cancel::Deferred`] answer, it queues for the row behind the commit, and often gets it before
/// the commit's own retry or release does, which then find the request on the row.
///
/// # Errors
/// Database errors, `lock_timeout` included (the request stays recorded for the rescuer passes).
pub async fn await_deferred(client: &impl GenericClient, id: Uuid) -> Result<Applied, Error> {
    let mut total = Applied::default();
    for _ in 0..AWAIT_LOOKS {
        let look = apply(client, AWAIT_DEFERRED_SQL, id).await?;
        total.requested += look.requested;
        total.cancelled += look.cancelled;
        total.cleared += look.cleared;
        if look.cleared > 0 {
            break;
        }
    }
    Ok(total)
}
