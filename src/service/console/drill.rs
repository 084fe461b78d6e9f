//! The operator's drill-downs: the jobs behind a queue's counts and behind a failure code, as job
//! metadata only.
//!
//! Invariants this module keeps:
//! - A statement selects a job's metadata only: id, kind, queue, priority, state, times,
//!   attempts and failure code. None reads a payload, an owner digest, an idempotency digest or a
//!   request fingerprint, so no page built on them can show one.
//! - Every read is bounded whatever the history holds. A queue's jobs are its running jobs (the
//!   fleet's slots bound them) and its first pending jobs in the claim index's order, at most
//!   [`JOBS_SHOWN`] of each, from the live table only. A code's jobs are the newest
//!   [`JOBS_SHOWN`] of those accepted in the last [`CODE_WINDOW`], read along the outcomes'
//!   primary key over that window only (job ids are time-ordered UUIDv7, so the window is the ids
//!   at or above its first possible id), never below it.

use crate::jobs::state::JobState;
use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// The most jobs a drill-down shows of each part (a queue's running and pending jobs; a code's
/// ended jobs).
pub(crate) const JOBS_SHOWN: i64 = 50;

/// How far back, by acceptance, a code's drill-down looks.
pub(crate) const CODE_WINDOW: chrono::Duration = chrono::Duration::hours(24);

/// The live jobs of queue `$1`: its running jobs by id, then its pending ones by kind and, within
/// a kind, in the order a replica claims them (`sort_at`, then id), at most `$2` of each; each
/// with whether it is pending and not due yet.
///
/// Locks: none. The running part reads `etl_job_records_running_owner_idx`'s rows (one per
/// running job of the fleet); the pending part walks `etl_job_records_claim_idx`
/// (`(queue, kind, sort_at, id) WHERE status = 'pending'`) in its own order and stops at `$2`; the
/// intake is probed by primary key for each job's acceptance time.
pub(crate) const QUEUE_JOBS_SQL: &str = "
WITH picked AS (
    (SELECT id, 0 AS part, kind, sort_at FROM etl_job_records
      WHERE status = 'running' AND queue = $1 ORDER BY id LIMIT $2)
    UNION ALL
    (SELECT id, 1 AS part, kind, sort_at FROM etl_job_records
      WHERE status = 'pending' AND queue = $1 ORDER BY kind, sort_at, id LIMIT $2)
)
SELECT r.id, r.kind, r.queue, r.priority, r.status, r.attempts, r.max_attempts, r.run_at,
       i.created_at, r.started_at, NULL::timestamptz, NULL::text,
       r.status = 'pending' AND r.run_at > now()
  FROM picked p
  JOIN etl_job_records r ON r.id = p.id
  JOIN etl_job_intake i ON i.id = p.id
 ORDER BY p.part, p.kind, p.sort_at, p.id";

/// The newest `$3` ended jobs with failure code `$1` among those with ids at or above `$2` (the
/// first possible id of the window), newest first.
///
/// Locks: none. Reads `etl_job_outcomes`' primary key over the window only (ids at or above
/// `$2`): backwards from the newest, stopping at `$3` matches, or as a bitmap of the window then a
/// sort, as the planner prefers; either way never an outcome below the window. Probes the intake
/// by primary key for each job shown.
pub(crate) const CODE_JOBS_SQL: &str = "
SELECT o.job_id, i.kind, i.queue, i.priority, o.status, o.attempts, i.max_attempts, o.run_at,
       i.created_at, o.started_at, o.finished_at, o.failure_code, false
  FROM etl_job_outcomes o
  JOIN etl_job_intake i ON i.id = o.job_id
 WHERE o.failure_code = $1 AND o.job_id >= $2
 ORDER BY o.job_id DESC
 LIMIT $3";

/// A job's metadata, as a drill-down shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobMeta {
    /// The job's id.
    pub(crate) id: Uuid,
    /// Its kind.
    pub(crate) kind: String,
    /// Its queue.
    pub(crate) queue: String,
    /// Its priority, 0 to 9.
    pub(crate) priority: i16,
    /// Its state.
    pub(crate) status: JobState,
    /// Whether it is pending and not due yet.
    pub(crate) deferred: bool,
    /// Attempts started so far.
    pub(crate) attempts: i32,
    /// Its attempt bound.
    pub(crate) max_attempts: i32,
    /// When it is (or was) due.
    pub(crate) run_at: DateTime<Utc>,
    /// When it was accepted.
    pub(crate) created_at: DateTime<Utc>,
    /// When its latest attempt started.
    pub(crate) started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub(crate) finished_at: Option<DateTime<Utc>>,
    /// Its failure code, once it failed or was cancelled.
    pub(crate) failure_code: Option<String>,
}

impl JobMeta {
    /// The metadata of a row of [`QUEUE_JOBS_SQL`]'s or [`CODE_JOBS_SQL`]'s columns.
    ///
    /// # Errors
    /// A `status` that is not a [`JobState`] (the tables' CHECK constraints admit none).
    fn from_row(row: &Row) -> Result<JobMeta, tokio_postgres::Error> {
        Ok(JobMeta {
            id: row.try_get(0)?,
            kind: row.try_get(1)?,
            queue: row.try_get(2)?,
            priority: row.try_get(3)?,
            status: row.try_get(4)?,
            attempts: row.try_get(5)?,
            max_attempts: row.try_get(6)?,
            run_at: row.try_get(7)?,
            created_at: row.try_get(8)?,
            started_at: row.try_get(9)?,
            finished_at: row.try_get(10)?,
            failure_code: row.try_get(11)?,
            deferred: row.try_get(12)?,
        })
    }
}

/// The metadata of `rows`.
///
/// # Errors
/// See [`JobMeta::from_row`].
fn metadata(rows: &[Row]) -> Result<Vec<JobMeta>, tokio_postgres::Error> {
    rows.iter().map(JobMeta::from_row).collect()
}

/// The live jobs of `queue` (see [`QUEUE_JOBS_SQL`]).
///
/// # Errors
/// Database errors.
pub(crate) async fn queue_jobs(
    client: &impl GenericClient,
    queue: &str,
) -> Result<Vec<JobMeta>, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            QUEUE_JOBS_SQL,
            &[(&queue, Type::TEXT), (&JOBS_SHOWN, Type::INT8)],
        )
        .await?;
    metadata(&rows)
}

/// The first UUIDv7 a job accepted at `at` or later can have: `at`'s Unix milliseconds, then
/// zeros (UUIDs compare bytewise, and a UUIDv7 opens with its milliseconds, big-endian).
pub(crate) fn first_id_since(at: DateTime<Utc>) -> Uuid {
    let millis = u128::try_from(at.timestamp_millis()).unwrap_or(0);
    Uuid::from_u128(millis << 80)
}

/// The newest ended jobs with failure `code` accepted in the [`CODE_WINDOW`] before `now` (see
/// [`CODE_JOBS_SQL`]).
///
/// # Errors
/// Database errors.
pub(crate) async fn code_jobs(
    client: &impl GenericClient,
    code: &str,
    now: DateTime<Utc>,
) -> Result<Vec<JobMeta>, tokio_postgres::Error> {
    let first = first_id_since(now - CODE_WINDOW);
    let rows = client
        .query_typed(
            CODE_JOBS_SQL,
            &[
                (&code, Type::TEXT),
                (&first, Type::UUID),
                (&JOBS_SHOWN, Type::INT8),
            ],
        )
        .await?;
    metadata(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_id_of_a_window_sorts_at_or_below_every_uuidv7_of_that_millisecond_on() {
        let at = DateTime::parse_from_rfc3339("2026-12-01T12:00:00.123Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default();
        let first = first_id_since(at);
        let ts = uuid::Timestamp::from_unix(uuid::NoContext, 1_796_126_400, 123_000_000);
        let same_ms = Uuid::new_v7(ts);
        assert!(first <= same_ms && first.as_bytes()[..6] == same_ms.as_bytes()[..6]);
        let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_796_126_400,
            122_000_000,
        ));
        assert!(earlier < first);
        assert_eq!(first_id_since(DateTime::<Utc>::MIN_UTC), Uuid::nil());
    }
}
