//! Every fenced statement after the claim, in one place: the group commit's fenced lock and its
//! ledger check, success (inside the execution transaction or on its own), retry, failure and
//! release.
//!
//! Invariants this module keeps:
//! - Every statement carries the lease fence (`id`, `lease_claim_id`, `status = 'running'`); zero
//!   rows matched means the lease was lost, reported as [`Transition::LeaseLost`], never success.
//! - Every terminal transition clears `request_payload` and the lease in the same statement.
//! - A retry goes back to `pending` only while `attempts < max_attempts`; otherwise the same
//!   statement ends the job `failed` with `attempts_exhausted`. The decision is made on the row's
//!   current values, under its row lock, not on what the worker remembers.
//! - A release (shutdown) gives the attempt back: `attempts - 1`, since the job never ran to an end.
//! - Only stored codes from [`Code`] are written; never error text.

use crate::codes::Code;
use crate::db;
use crate::handler::{JobError, LedgerEntry};
use crate::state::JobState;
use crate::worker::held::HeldJobs;
use crate::worker::lease::{self, millis, Lease};
use crate::worker::shared::Shared;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// What a fenced transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The job is `succeeded`.
    Succeeded,
    /// The job is `pending` again, due after the retry delay.
    Retried,
    /// The job is `failed` with this code.
    Failed(Code),
    /// The job is `cancelled`: its owner asked, and its effects never committed.
    Cancelled,
    /// The fence matched no row: another claim (or a cancellation, or recovery) owns the job now.
    LeaseLost,
    /// The transition could not be written (the database did not answer); the lease will expire
    /// and recovery will return the job.
    Unwritten,
}

/// Why an attempt ended without committing, before the transition is written.
pub(crate) enum Failure {
    /// The handler or the database said so.
    Job(JobError),
    /// A stored code decided by the executor or the group commit itself.
    Code(Code),
    /// The lease was gone when the effects transaction checked it.
    LeaseLost,
    /// The effects overran their own budget; cut and rolled back, they are tried again.
    EffectsOverrun,
    /// The owner asked to cancel the job.
    Cancelled,
}

/// The statement that marks every job of a group `succeeded` and writes its response-ledger row
/// (`$1` job ids, `$2` claim ids, `$3..$6` the ledger summaries, pairwise), with `$fence`
/// appended to each job's lease fence. Returns the `(id, claim id)` pairs it succeeded.
///
/// Locks: the UPDATE row-locks each fenced job row (already locked when an execution transaction
/// checked the fence first); the INSERT takes the ledger's primary-key entries, so a second
/// ledger row for a job cannot exist (an existing one, from a commit whose status write was
/// somehow lost, is kept as it is).
macro_rules! succeed_sql {
    ($fence:expr) => {
        concat!(
            "
WITH held AS (
    SELECT *
      FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::int4[], $5::int4[], $6::bytea[])
           AS h(id, claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum)
), done AS (
    UPDATE etl_job_records AS j
       SET status = 'succeeded', request_payload = NULL, failure_code = NULL,
           failure_record_index = NULL, finished_at = now(), updated_at = now(), ",
            lease_cleared!(),
            "
      FROM held
     WHERE j.id = held.id AND j.lease_claim_id = held.claim_id AND j.status = 'running'",
            $fence,
            "
 RETURNING held.*
), ledger AS (
    INSERT INTO etl_job_responses
           (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum)
    SELECT id, claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum FROM done
        ON CONFLICT (job_id) DO NOTHING
)
SELECT id, claim_id FROM done"
        )
    };
}

/// Succeeds a group of jobs that write nothing, in one statement of its own: a job whose owner
/// asked to cancel it is left as it is (the caller cancels it through [`FAIL_SQL`]). See
/// `succeed_sql` for the parameters and locks.
pub const SUCCEED_SQL: &str = succeed_sql!(concat!(" AND NOT ", cancel_requested!()));

/// Of the `(job id, claim id)` leases in `$1`/`$2`, those still held (the fence matches) whose
/// owner asked to cancel the job: read after [`SUCCEED_SQL`] for the leases it did not succeed
/// (rarely any), to tell a cancel request from a lost lease.
///
/// Locks: none (a snapshot read through the primary keys).
pub const CANCEL_REQUESTED_SQL: &str = concat!(
    "
SELECT j.id, j.lease_claim_id
  FROM etl_job_records j
  JOIN unnest($1::uuid[], $2::uuid[]) AS held(id, claim_id)
    ON j.id = held.id AND j.lease_claim_id = held.claim_id
 WHERE j.status = 'running' AND ",
    cancel_requested!()
);

/// Succeeds the jobs of an execution transaction whose rows [`LOCK_FENCED_SQL`] already locked
/// and checked for cancel requests: it must not look again, since a request recorded after that
/// check (requests never wait for the row) would leave the job's applied effects in the
/// transaction without their success. See `succeed_sql` for the parameters and locks.
pub const SUCCEED_LOCKED_SQL: &str = succeed_sql!("");

/// What the success statement of a batch that writes nothing found a fenced job to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// It is `succeeded`.
    Succeeded,
    /// Its lease holds, but its owner asked to cancel it: left running for the fenced cancel.
    CancelRequested,
}

/// Writes the success transition and ledger row of every `(lease, ledger)` entry on its own
/// ([`SUCCEED_SQL`]). Returns what became of each lease whose fence held (by lease, not by id:
/// a stale claim of the same job in the same group must never read as the live one's success);
/// a lease it does not return is lost. Only when some lease did not succeed does a second
/// statement ([`CANCEL_REQUESTED_SQL`]) tell a cancel request from a lost lease.
///
/// # Errors
/// The database error of a statement.
pub async fn succeed_many(
    client: &impl GenericClient,
    entries: &[(Lease, LedgerEntry)],
) -> Result<HashMap<Lease, Fenced>, tokio_postgres::Error> {
    let succeeded = succeed(client, SUCCEED_SQL, entries).await?;
    let missing: Vec<Lease> = entries
        .iter()
        .map(|e| e.0)
        .filter(|lease| !succeeded.contains(lease))
        .collect();
    let cancel_requested = if missing.is_empty() {
        HashSet::new()
    } else {
        leases_returned(client, CANCEL_REQUESTED_SQL, &missing).await?
    };
    Ok(succeeded
        .into_iter()
        .map(|lease| (lease, Fenced::Succeeded))
        .chain(
            cancel_requested
                .into_iter()
                .map(|lease| (lease, Fenced::CancelRequested)),
        )
        .collect())
}

/// Writes the success of every `(lease, ledger)` entry inside an execution transaction that
/// locked the rows and checked their cancel requests first ([`SUCCEED_LOCKED_SQL`]); returns the
/// leases that succeeded (every fenced one).
///
/// # Errors
/// The database error of the statement.
pub async fn succeed_locked(
    tx: &tokio_postgres::Transaction<'_>,
    entries: &[(Lease, LedgerEntry)],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    succeed(tx, SUCCEED_LOCKED_SQL, entries).await
}

/// Runs success statement `sql` for `entries`; returns the leases it succeeded.
async fn succeed(
    client: &impl GenericClient,
    sql: &str,
    entries: &[(Lease, LedgerEntry)],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    let leases: Vec<Lease> = entries.iter().map(|e| e.0).collect();
    let (ids, claims) = lease::unzip(&leases);
    let inserted: Vec<i32> = entries.iter().map(|e| e.1.rows_inserted).collect();
    let updated: Vec<i32> = entries.iter().map(|e| e.1.rows_updated).collect();
    let unchanged: Vec<i32> = entries.iter().map(|e| e.1.rows_unchanged).collect();
    let checksums: Vec<&[u8]> = entries.iter().map(|e| &e.1.data_checksum[..]).collect();
    let rows = client
        .query_typed(
            sql,
            &[
                (&ids, Type::UUID_ARRAY),
                (&claims, Type::UUID_ARRAY),
                (&inserted, Type::INT4_ARRAY),
                (&updated, Type::INT4_ARRAY),
                (&unchanged, Type::INT4_ARRAY),
                (&checksums, Type::BYTEA_ARRAY),
            ],
        )
        .await?;
    Ok(leases_of(&leases, &rows))
}

/// The leases of `leases` whose `(id, claim id)` the `rows` return (in their first two columns).
fn leases_of(leases: &[Lease], rows: &[tokio_postgres::Row]) -> HashSet<Lease> {
    let by_ids = lease::by_ids(leases);
    rows.iter()
        .filter_map(|r| by_ids.get(&(r.get(0), r.get(1))).copied())
        .collect()
}

/// Runs `sql` (parameters: the ids and claim ids of `leases`) and returns the leases whose
/// `(id, claim id)` it returns.
async fn leases_returned(
    client: &impl GenericClient,
    sql: &str,
    leases: &[Lease],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    let (ids, claims) = lease::unzip(leases);
    let rows = client
        .query_typed(
            sql,
            &[(&ids, Type::UUID_ARRAY), (&claims, Type::UUID_ARRAY)],
        )
        .await?;
    Ok(leases_of(leases, &rows))
}

/// After a transient failure: back to `pending` due in `$3` ms while attempts remain, else
/// `failed` with `attempts_exhausted` and the payload cleared (`$1` id, `$2` claim id). A job
/// whose owner asked to cancel it ends `cancelled` instead of retrying.
///
/// Locks: row-locks the one fenced row; waits at most `lock_timeout` for an executor's lock.
pub const RETRY_SQL: &str = concat!(
    "
UPDATE etl_job_records AS j
   SET (status, failure_code, request_payload, finished_at, run_at) =
       (SELECT CASE WHEN c.cancel THEN 'cancelled' WHEN c.again THEN 'pending' ELSE 'failed' END,
               CASE WHEN c.cancel THEN 'cancelled' WHEN c.again THEN NULL
                    ELSE 'attempts_exhausted' END,
               CASE WHEN c.again AND NOT c.cancel THEN j.request_payload END,
               CASE WHEN c.again AND NOT c.cancel THEN NULL ELSE now() END,
               CASE WHEN c.again AND NOT c.cancel THEN now() + $3 * interval '1 millisecond'
                    ELSE j.run_at END
          FROM (SELECT ",
    cancel_requested!(),
    " AS cancel, j.attempts < j.max_attempts AS again) AS c),
       updated_at = now(), ",
    lease_cleared!(),
    "
 WHERE j.id = $1 AND j.lease_claim_id = $2 AND j.status = 'running'
RETURNING j.status"
);

/// Schedules a retry after `delay` (or ends the job `attempts_exhausted`).
///
/// # Errors
/// The database error of the statement.
pub async fn retry(
    client: &impl GenericClient,
    lease: Lease,
    delay: Duration,
) -> Result<Transition, tokio_postgres::Error> {
    let row = client
        .query_typed_opt(
            RETRY_SQL,
            &[
                (&lease.job_id, Type::UUID),
                (&lease.claim_id, Type::UUID),
                (&millis(delay), Type::INT8),
            ],
        )
        .await?;
    let state = row.map(|r| r.try_get::<_, JobState>(0)).transpose()?;
    Ok(match state {
        None => Transition::LeaseLost,
        Some(JobState::Pending) => Transition::Retried,
        Some(JobState::Cancelled) => Transition::Cancelled,
        Some(_) => Transition::Failed(Code::AttemptsExhausted),
    })
}

/// Ends the job `failed` with code `$3` (and record index `$4`) — or `cancelled` when `$3` is
/// `cancelled` — clearing payload and lease.
///
/// Locks: row-locks the one fenced row.
pub const FAIL_SQL: &str = concat!(
    "
UPDATE etl_job_records
   SET status = CASE WHEN $3 = 'cancelled' THEN 'cancelled' ELSE 'failed' END,
       failure_code = $3, failure_record_index = $4, request_payload = NULL,
       finished_at = now(), updated_at = now(), ",
    lease_cleared!(),
    "
 WHERE id = $1 AND lease_claim_id = $2 AND status = 'running'"
);

/// Ends the job `failed` with `code` (a stored code) and the optional record index.
///
/// # Errors
/// The database error of the statement.
pub async fn fail(
    client: &impl GenericClient,
    lease: Lease,
    code: Code,
    record_index: Option<i32>,
) -> Result<Transition, tokio_postgres::Error> {
    let code_str = code.as_str();
    let n = client
        .execute_typed(
            FAIL_SQL,
            &[
                (&lease.job_id, Type::UUID),
                (&lease.claim_id, Type::UUID),
                (&code_str, Type::TEXT),
                (&record_index, Type::INT4),
            ],
        )
        .await?;
    Ok(match (n, code) {
        (1, Code::Cancelled) => Transition::Cancelled,
        (1, _) => Transition::Failed(code),
        _ => Transition::LeaseLost,
    })
}

/// Gives unfinished jobs back on shutdown: `pending`, attempt not charged, lease cleared, for
/// every `(id, claim id)` pair in `$1`/`$2` still running under that claim; a job whose owner
/// asked to cancel it ends `cancelled` (payload cleared) instead of running again.
///
/// Locks: row-locks each fenced row; rows whose claim changed are not touched.
pub const RELEASE_SQL: &str = concat!(
    "
UPDATE etl_job_records AS j
   SET (status, failure_code, request_payload, finished_at, attempts) =
       (SELECT CASE WHEN c.cancel THEN 'cancelled' ELSE 'pending' END,
               CASE WHEN c.cancel THEN 'cancelled' ELSE j.failure_code END,
               CASE WHEN c.cancel THEN NULL ELSE j.request_payload END,
               CASE WHEN c.cancel THEN now() END,
               CASE WHEN c.cancel THEN j.attempts ELSE j.attempts - 1 END
          FROM (SELECT ",
    cancel_requested!(),
    " AS cancel) AS c),
       updated_at = now(), ",
    lease_cleared!(),
    "
  FROM unnest($1::uuid[], $2::uuid[]) AS held(id, claim_id)
 WHERE j.id = held.id AND j.lease_claim_id = held.claim_id AND j.status = 'running'"
);

/// Releases the given `(id, claim id)` leases; returns how many were still held.
///
/// # Errors
/// The database error of the statement.
pub async fn release(
    client: &impl GenericClient,
    held: &[Lease],
) -> Result<u64, tokio_postgres::Error> {
    let (ids, claims) = lease::unzip(held);
    client
        .execute_typed(
            RELEASE_SQL,
            &[(&ids, Type::UUID_ARRAY), (&claims, Type::UUID_ARRAY)],
        )
        .await
}

/// Locks the batch's job rows under their fences, in id order, at the start of the execution
/// transaction, and tells for each one still held whether a ledger row exists for it (its effects
/// committed before: they must not run again) and whether its owner asked to cancel it (its
/// effects must never commit). `$1` job ids, `$2` claim ids, pairwise.
///
/// Locks: a row lock (`FOR NO KEY UPDATE`, which conflicts with every other writer and with the
/// `FOR UPDATE` of recovery and heartbeats) on each fenced job row, taken in id order (the lock
/// step runs above the sort) and held until the transaction ends; this is what makes recovery
/// and heartbeats skip the rows while their effects commit. A cancel request never waits for
/// them: one recorded before this statement's snapshot is seen here and wins (nothing commits);
/// one recorded after loses to the commit ([`SUCCEED_LOCKED_SQL`] does not look again), so a
/// cancel and a commit never both win. Rows whose claim changed are not returned and not locked.
pub const LOCK_FENCED_SQL: &str = concat!(
    "
SELECT j.id, held.claim_id,
       EXISTS (SELECT 1 FROM etl_job_responses r WHERE r.job_id = j.id),
       ",
    cancel_requested!(),
    "
  FROM etl_job_records j
  JOIN unnest($1::uuid[], $2::uuid[]) AS held(id, claim_id)
    ON j.id = held.id AND j.lease_claim_id = held.claim_id
 WHERE j.status = 'running'
 ORDER BY j.id
   FOR NO KEY UPDATE OF j"
);

/// The `(job id, claim id)` leases in `$1`/`$2` whose ledger row was committed under that claim.
///
/// Locks: none (a snapshot read of the ledger's primary key).
pub const LEDGER_BY_CLAIM_SQL: &str = "
SELECT r.job_id, r.lease_claim_id
  FROM etl_job_responses r
  JOIN unnest($1::uuid[], $2::uuid[]) AS held(id, claim_id)
    ON r.job_id = held.id AND r.lease_claim_id = held.claim_id";

/// Locks the fenced rows of `leases`; returns, per `(job id, claim id)` still held, `(ledger
/// exists, cancel requested)`. Keyed by the lease: when a batch holds a stale claim and the live
/// claim of the same job (the replica lost the job, then claimed it again), only the live one
/// is fenced.
pub(crate) async fn lock_fenced(
    tx: &tokio_postgres::Transaction<'_>,
    leases: &[Lease],
) -> Result<HashMap<Lease, (bool, bool)>, tokio_postgres::Error> {
    let (ids, claims) = lease::unzip(leases);
    let rows = tx
        .query_typed(
            LOCK_FENCED_SQL,
            &[(&ids, Type::UUID_ARRAY), (&claims, Type::UUID_ARRAY)],
        )
        .await?;
    let by_ids = lease::by_ids(leases);
    Ok(rows
        .iter()
        .filter_map(|r| Some((*by_ids.get(&(r.get(0), r.get(1)))?, (r.get(2), r.get(3)))))
        .collect())
}

/// The leases of `leases` whose ledger row was committed under their claim (a COMMIT whose
/// outcome is unknown is resolved by this, never by running a job again).
///
/// # Errors
/// The database error of the query.
pub(crate) async fn ledger_by_claim(
    client: &impl GenericClient,
    leases: &[Lease],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    leases_returned(client, LEDGER_BY_CLAIM_SQL, leases).await
}

/// How long the shutdown release may wait (for a row lock, say) before the replica exits anyway
/// and leaves the unreleased leases to expire.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Releases, at shutdown, the leases of the jobs still `held` after the grace period, within
/// [`RELEASE_TIMEOUT`]; a release that fails or times out is logged by code, and those leases
/// expire instead.
pub(crate) async fn release_held(shared: &Shared, held: &HeldJobs) {
    if tokio::time::timeout(RELEASE_TIMEOUT, release_now(shared, held))
        .await
        .is_err()
    {
        tracing::warn!("release timed out; leases will expire");
    }
}

/// [`release_held`] without its time bound.
async fn release_now(shared: &Shared, held: &HeldJobs) {
    let leases = held.leases();
    if leases.is_empty() {
        return;
    }
    crash_point!("release");
    shared.stats.record_round_trips(1);
    let released = match db::checkout(&shared.pool).await {
        Ok(conn) => db::bounded(shared.statement_bound, release(&*conn, &leases)).await,
        Err(e) => Err(e),
    };
    match released {
        Ok(n) => {
            shared.stats.record_released(n);
            tracing::info!(released = n, "released unfinished jobs");
        }
        Err(e) => tracing::warn!(code = %e.code(), "release failed; leases will expire"),
    }
}
