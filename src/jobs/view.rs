//! Owner-scoped views of jobs: status and listing (with a submission window).
//!
//! Invariants this module keeps:
//! - Every query is scoped by the owner digest: a job of another owner is indistinguishable from
//!   a job that does not exist.
//! - A status view never contains the request (records, dataset, key) or any stored error text:
//!   only ids, states, counts, times, the stable failure code and the kind's recorded output.

use crate::error::Error;
use crate::jobs::state::JobState;
use crate::time::canonical_utc;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// Why a job failed or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
pub struct JobFailure {
    /// The stable failure code.
    pub code: String,
    /// For `record_invalid`: the index of the first bad record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_index: Option<i32>,
}

/// A job's status: the representation the status monitor serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
pub struct JobStatus {
    /// The job id.
    pub id: Uuid,
    /// `pending`, `running`, `succeeded`, `failed` or `cancelled`.
    #[cfg_attr(feature = "service", schema(value_type = String))]
    pub status: JobState,
    /// Attempts started so far.
    pub attempts: i32,
    /// The attempt bound.
    pub max_attempts: i32,
    /// When the job is (or was) due, canonical UTC.
    pub run_at: String,
    /// When the job was accepted, canonical UTC.
    pub created_at: String,
    /// When the job last changed, canonical UTC.
    pub updated_at: String,
    /// When the latest attempt started, canonical UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the job ended, canonical UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Whether a cancel was requested while the job was running.
    pub cancel_requested: bool,
    /// The job this one replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Uuid>,
    /// Why it failed or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<JobFailure>,
    /// What its kind recorded, once succeeded (the ETL kind: its
    /// [`Ledger`](crate::kinds::etl::Ledger)); absent for a kind that records nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "service", schema(value_type = Option<Object>))]
    pub result: Option<serde_json::Value>,
    /// The job's kind.
    pub kind: String,
    /// The queue it waits (or waited) in.
    pub queue: String,
    /// Its priority within the queue: 0 (the most urgent) to 9.
    pub priority: i16,
}

impl JobStatus {
    /// Whether the job is still to run or running.
    pub fn is_active(&self) -> bool {
        !self.status.is_terminal()
    }

    /// The status from a row of `status_select!`'s columns.
    ///
    /// # Errors
    /// A `status` that is not a [`JobState`] (the table's CHECK constraint admits none).
    fn from_row(row: &Row) -> Result<JobStatus, tokio_postgres::Error> {
        let time = |i: usize| canonical_utc(row.get::<_, DateTime<Utc>>(i));
        let opt_time = |i: usize| row.get::<_, Option<DateTime<Utc>>>(i).map(canonical_utc);
        let failure = row.get::<_, Option<String>>(9).map(|code| JobFailure {
            code,
            record_index: row.get(10),
        });
        let status: JobState = row.try_get(1)?;
        Ok(JobStatus {
            id: row.get(0),
            // A retry-waiting pending job keeps no failure; only ended jobs report one.
            failure: failure.filter(|_| matches!(status, JobState::Failed | JobState::Cancelled)),
            status,
            attempts: row.get(2),
            max_attempts: row.get(3),
            run_at: time(4),
            created_at: time(5),
            updated_at: time(6),
            started_at: opt_time(7),
            finished_at: opt_time(8),
            cancel_requested: row.get(11),
            replaces: row.get(12),
            result: row.get(16),
            kind: row.get(13),
            queue: row.get(14),
            priority: row.get(15),
        })
    }
}

/// The columns of a status view, in [`JobStatus::from_row`] order, read from the `etl_jobs` view
/// (migrations 0007 to 0033), the one definition of what a job looks like from outside: its
/// intake, its live row or its outcome (with its recorded output) and its cancel request, in one
/// statement's snapshot.
macro_rules! status_select {
    () => {
        "SELECT j.id, j.status, j.attempts, j.max_attempts, j.run_at, j.created_at, j.updated_at,
                j.started_at, j.finished_at, j.failure_code, j.failure_record_index,
                j.cancel_requested, j.replaces_job_id,
                j.kind, j.queue, j.priority, j.output
           FROM etl_jobs j"
    };
}

/// One job of one owner (`$1` id, `$2` owner digest). Locks: none.
pub const STATUS_SQL: &str = concat!(status_select!(), " WHERE j.id = $1 AND j.owner_key = $2");

/// An owner's jobs, newest first, with ids below `$2` and at or above `$5` (a [`Window`]; NULL
/// is open), optionally of status `$3` (NULL here: a known status has a statement of its own,
/// and [`list`] answers an unknown one without a statement), at most `$4`. Locks: none; walks
/// `etl_job_intake_owner_listing_idx` backwards between the two bounds and probes the live row
/// and the outcome of each job by primary key. The owner is matched as
/// `= ANY (ARRAY[$1])` and the order is `(owner_key, id)`: an equality with one value, so the
/// index stops at both id bounds, but no equivalence to a constant, so the planner keeps
/// `owner_key` in the order, which only the owner's index gives. Written as `owner_key = $1 …
/// ORDER BY id`, the planner walked the primary key backwards and filtered by owner whenever one
/// owner held most jobs, reading every newer job of the others first (the `claim_plan` test puts
/// 5,000 of them above its owner's history); written as row comparisons on `(owner_key, id)`, a
/// backward scan stopped only at the owner's oldest job (34 ms for a window in the middle of
/// 1,000,000). [`list`] sends it unnamed, so it is planned with its parameters and the `IS NULL`
/// tests of open bounds fold away (the widest ids in their place made a never-analyzed table's
/// plan sort the owner's whole history). Serves the listing of every job; a status picks
/// [`LIST_LIVE_SQL`] or [`LIST_ENDED_SQL`].
pub const LIST_SQL: &str = concat!(
    status_select!(),
    " WHERE j.owner_key = ANY (ARRAY[$1::bytea])
        AND ($2::uuid IS NULL OR j.id < $2) AND ($5::uuid IS NULL OR j.id >= $5)
        AND ($3::text IS NULL OR j.status = $3)
      ORDER BY j.owner_key DESC, j.id DESC LIMIT $4"
);

/// An owner's live jobs of status `$3` (`pending` or `running`), newest first, with ids below
/// `$2` and at or above `$5` (NULL: open), at most `$4`. Locks: none; picks the page's ids
/// from `etl_job_records`, which holds only live jobs (migration 0008), then reads each job of
/// the page through the view by primary key, so the owner's ended history is never read: an
/// empty page reads no intake row and no outcome (filtering the owner's jobs one by one, newest
/// first, walked the owner's whole history to answer an empty `?status=running` page: 1.1 s and
/// about 4 M buffer hits at 1,000,000 ended jobs). Pending ids come from
/// `etl_job_records_pending_owner_idx` (migration 0016) between the two bounds, the owner matched
/// as in [`LIST_SQL`], whatever backlog other owners have (the primary key walked backwards read
/// every newer live job of any owner first); running ones through
/// `etl_job_records_running_owner_idx`, which the replicas' slots bound. The ids are an array
/// (`= ANY (ARRAY(…))`), not an `IN` subquery: once analyzed, the planner merged an `IN` with
/// the intake's primary key walked backwards from the newest job of any owner (5,051 rows read
/// for a page of 50 in the `claim_plan` test).
pub const LIST_LIVE_SQL: &str = concat!(
    status_select!(),
    " WHERE j.id = ANY (ARRAY(SELECT r.id FROM etl_job_records r
                               WHERE r.owner_key = ANY (ARRAY[$1::bytea]) AND r.status = $3
                                 AND ($2::uuid IS NULL OR r.id < $2)
                                 AND ($5::uuid IS NULL OR r.id >= $5)
                               ORDER BY r.owner_key DESC, r.id DESC LIMIT $4))
      ORDER BY j.id DESC"
);

/// An owner's ended jobs of status `$3`, newest first, with ids below `$2` and at or above `$5`
/// (NULL: open), at most `$4`. Locks: none; walks `etl_job_outcomes_owner_status_listing_idx`
/// backwards between the two bounds (the owner matched as in [`LIST_SQL`]),
/// whatever the history holds, then reads each job of the page through the view by primary key.
pub const LIST_ENDED_SQL: &str = concat!(
    status_select!(),
    " WHERE j.id IN (SELECT o.job_id FROM etl_job_outcomes o
                       WHERE o.owner_key = ANY (ARRAY[$1::bytea]) AND o.status = $3
                         AND ($2::uuid IS NULL OR o.job_id < $2)
                         AND ($5::uuid IS NULL OR o.job_id >= $5)
                       ORDER BY o.owner_key DESC, o.status DESC, o.job_id DESC LIMIT $4)
      ORDER BY j.id DESC"
);

/// The status of job `id` for `owner`, if that owner has it.
///
/// # Errors
/// Database errors.
pub async fn status(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
) -> Result<Option<JobStatus>, Error> {
    let owner: &[u8] = owner;
    let row = client
        .query_typed_opt(STATUS_SQL, &[(&id, Type::UUID), (&owner, Type::BYTEA)])
        .await?;
    Ok(row.as_ref().map(JobStatus::from_row).transpose()?)
}

/// Which of an owner's jobs a listing covers, as bounds on their ids. Job ids are UUIDv7, which
/// begin with the millisecond they were made at intake, so a range of submission times is a
/// range of ids, and the listing's index serves both bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Only ids below this one (a page's cursor, or the end of a submission range).
    pub before: Option<Uuid>,
    /// Only ids at or above this one (the start of a submission range).
    pub from: Option<Uuid>,
}

impl Window {
    /// The jobs submitted from `from` (inclusive) to `to` (exclusive), either bound open.
    pub fn submitted(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Window {
        Window {
            before: to.map(first_id_at),
            from: from.map(first_id_at),
        }
    }

    /// This window, below `cursor` too (the next page after the job `cursor`).
    pub fn after(self, cursor: Option<Uuid>) -> Window {
        let before = match (self.before, cursor) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Window { before, ..self }
    }
}

/// The largest millisecond a UUIDv7 can hold (48 bits: the year 10889).
const LAST_V7_MILLI: u128 = 0xffff_ffff_ffff;

/// The smallest UUIDv7 of the millisecond `at` (every id made in that millisecond or later is at
/// least this; every id made before is less). Times before 1970 map to the nil id, times past
/// what a UUIDv7 holds to the largest millisecond it holds.
fn first_id_at(at: DateTime<Utc>) -> Uuid {
    let millis = u128::try_from(at.timestamp_millis()).unwrap_or(0);
    Uuid::from_u128(millis.min(LAST_V7_MILLI) << 80)
}

/// A page of `owner`'s jobs in `window`, newest first.
///
/// # Errors
/// Database errors.
pub async fn list(
    client: &impl GenericClient,
    owner: &[u8; 32],
    window: Window,
    status: Option<&str>,
    limit: i64,
) -> Result<Vec<JobStatus>, Error> {
    let owner: &[u8] = owner;
    let Window { before, from } = window;
    let sql = match status.map(JobState::parse) {
        None => LIST_SQL,
        // No job has a status that is no job state.
        Some(None) => return Ok(Vec::new()),
        Some(Some(state)) if state.is_terminal() => LIST_ENDED_SQL,
        Some(Some(_)) => LIST_LIVE_SQL,
    };
    let rows = client
        .query_typed(
            sql,
            &[
                (&owner, Type::BYTEA),
                (&before, Type::UUID),
                (&status, Type::TEXT),
                (&limit, Type::INT8),
                (&from, Type::UUID),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(JobStatus::from_row)
        .collect::<Result<_, _>>()?)
}

/// One page of an owner's jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The jobs of the page, newest first.
    pub jobs: Vec<JobStatus>,
    /// The id to continue after (the page's last job), when older jobs follow.
    pub next: Option<Uuid>,
}

/// A page of at most `size` of `owner`'s jobs in `window`, newest first, and where the next page
/// starts: one more job is read to tell whether one follows.
///
/// # Errors
/// Database errors.
pub async fn page(
    client: &impl GenericClient,
    owner: &[u8; 32],
    window: Window,
    status: Option<&str>,
    size: i64,
) -> Result<Page, Error> {
    let mut jobs = list(client, owner, window, status, size.saturating_add(1)).await?;
    let size = usize::try_from(size).unwrap_or(0);
    let next = if jobs.len() > size {
        jobs.truncate(size);
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    Ok(Page { jobs, next })
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
