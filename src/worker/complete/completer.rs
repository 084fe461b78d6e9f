//! Every fenced statement after the claim, in one place: the group commit's fenced lock and its
//! ledger check, success (inside the execution transaction or on its own), retry, failure and
//! release.
//!
//! Invariants this module keeps:
//! - Every statement carries the lease fence (`id`, `lease_claim_id`, `status = 'running'`); zero
//!   rows matched means the lease was lost, reported as [`Transition::LeaseLost`], never success.
//!   A statement over a batch fences with `id = ANY(ids) AND lease_claim_id = ANY(claims)`: a
//!   claim id belongs to one claim of one job, so that is the pairwise fence, and it plans as
//!   primary-key probes whatever the batch's size (a join with the pairs made the planner hash
//!   the whole table for batches of a few hundred).
//! - Every terminal transition deletes the job's live row under its fence and appends its outcome
//!   row in the same statement (the ledger, for a success): the payload and the lease leave with
//!   the live row, and a stale claim, which deletes nothing, writes nothing.
//! - A retry goes back to `pending` only while `attempts < max_attempts`; otherwise the same
//!   statement ends the job `failed` with `attempts_exhausted`. The decision is made on the row's
//!   values under this claim (attempts cannot change while the claim holds), and the write
//!   re-checks the fence under the row lock, not on what the worker remembers.
//! - A release (shutdown, or a prefetched job that waited too long for a slot) gives the attempt
//!   back: `attempts - 1`, since the job never ran to an end.
//! - Only stored codes from [`Code`] are written, with the attempt's diagnosis (type names,
//!   enumerated values and numbers: `job::diagnosis`) in the same statement; never error text.
//! - A completion of a capped queue's job frees its permits and wakes nobody (migration 0023):
//!   its caller claims again or calls [`wake_waiting`] after the commit.

use crate::codes::Code;
use crate::job::diagnosis::Diagnosis;
use crate::job::handler::Output;
use crate::jobs::state::JobState;
use crate::worker::lease::{self, millis, Lease};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Statement};

pub(crate) use crate::worker::complete::transition::Failure;
pub use crate::worker::complete::transition::Transition;

/// The statement that ends every job of a group `succeeded`: it deletes each fenced live row and
/// appends its outcome with its kind's recorded output (`$1` job ids, `$2` claim ids, `$3` the
/// outputs, NULL for none, pairwise), with `$fence` appended to each job's lease fence. Returns the `(id, claim
/// id)` pairs it succeeded.
///
/// The fence is `id = ANY($1) AND lease_claim_id = ANY($2)`, not a join with the pairs: a claim
/// id is unique to one claim of one job, so a row whose claim is among the batch's is that
/// lease's own (a stale claim of the same job in the batch matches nothing, and its pair is not
/// returned). Every plan of it, custom or generic (the commit sessions prepare it), probes the
/// primary key with the id array; joined with the pairs instead, the generic plan, which cannot
/// know the batch's size, hashed the whole live table on every batch (a sixth of the
/// throughput). The outputs join the deleted rows by claim id, off any table.
///
/// Locks: the DELETE row-locks each fenced live row (already locked when an execution transaction
/// checked the fence first) and removes it; no foreign key points at the live table, so the
/// delete fires nothing. A cancel request changes the live row, so a DELETE that reaches a row
/// the request holds waits for it and re-checks the row's new version (the request wins; see
/// [`SUCCEED_SQL`]), and a request that reaches a row this DELETE holds waits for the commit and
/// finds the job ended. The INSERT takes the outcomes' primary-key entries. `finished_at` is the
/// statement's time (the last statement of its transaction), not the transaction's start.
macro_rules! succeed_sql {
    ($fence:expr) => {
        concat!(
            "
WITH held AS (
    SELECT *
      FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS h(id, claim_id, output)
), done AS (
    DELETE FROM etl_job_records AS j
     WHERE j.id = ANY($1::uuid[]) AND j.lease_claim_id = ANY($2::uuid[])
       AND j.status = 'running'",
            $fence,
            "
 RETURNING j.id, j.lease_claim_id, j.owner_key, j.attempts, j.run_at, j.started_at, j.queue,
           j.permit_slot
), ",
            permits_freed!(claimed_by_freer: "SELECT queue, permit_slot, lease_claim_id AS claim_id FROM done"),
            "
INSERT INTO etl_job_outcomes
       (job_id, owner_key, status, attempts, run_at, lease_claim_id, output, started_at,
        finished_at)
SELECT d.id, d.owner_key, 'succeeded', d.attempts, d.run_at, d.lease_claim_id, h.output,
       d.started_at, statement_timestamp()
  FROM done d
  JOIN held h ON h.claim_id = d.lease_claim_id
RETURNING job_id, lease_claim_id"
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
 WHERE j.id = ANY($1::uuid[]) AND j.lease_claim_id = ANY($2::uuid[])
   AND j.status = 'running' AND ",
    cancel_requested!()
);

/// Succeeds the jobs of an execution transaction whose rows [`LOCK_FENCED_SQL`] already locked
/// and checked for cancel requests: no request can be recorded after that check (a request
/// updates the live row, so it waits for this transaction's row lock and then finds the job
/// ended), so it need not look again. See `succeed_sql` for the parameters and locks.
pub const SUCCEED_LOCKED_SQL: &str = succeed_sql!("");

/// What the success statement of a batch that writes nothing found a fenced job to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// It is `succeeded`.
    Succeeded,
    /// Its lease holds, but its owner asked to cancel it: left running for the fenced cancel.
    CancelRequested,
}

/// Writes the success transition and output of every `(lease, output)` entry on its own
/// ([`SUCCEED_SQL`]). Returns what became of each lease whose fence held (by lease, not by id:
/// a stale claim of the same job in the same group must never read as the live one's success);
/// a lease it does not return is lost. Only when some lease did not succeed does a second
/// statement ([`CANCEL_REQUESTED_SQL`]) tell a cancel request from a lost lease.
///
/// # Errors
/// The database error of a statement.
pub async fn succeed_many(
    client: &impl GenericClient,
    entries: &[(Lease, Option<Output>)],
) -> Result<HashMap<Lease, Fenced>, tokio_postgres::Error> {
    succeed_many_with(client, None, entries).await
}

/// [`succeed_many`], running [`SUCCEED_SQL`] as `prepared` (that statement prepared on this
/// connection, [`SUCCESS_PARAMS`] typed) when given: planned once per connection instead of
/// once per batch.
///
/// # Errors
/// The database error of a statement.
pub(crate) async fn succeed_many_with(
    client: &impl GenericClient,
    prepared: Option<&Statement>,
    entries: &[(Lease, Option<Output>)],
) -> Result<HashMap<Lease, Fenced>, tokio_postgres::Error> {
    let succeeded = succeed(client, (SUCCEED_SQL, prepared), entries).await?;
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

/// Writes the success of every `(lease, output)` entry inside an execution transaction that
/// locked the rows and checked their cancel requests first, running [`SUCCEED_LOCKED_SQL`] as
/// `prepared` (that statement prepared on this connection, [`SUCCESS_PARAMS`] typed); returns
/// the leases that succeeded (every fenced one).
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn succeed_locked(
    tx: &tokio_postgres::Transaction<'_>,
    prepared: Option<&Statement>,
    entries: &[(Lease, Option<Output>)],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    succeed(tx, (SUCCEED_LOCKED_SQL, prepared), entries).await
}

/// The types of the success statements' parameters, in order.
pub(crate) const SUCCESS_PARAMS: [Type; 3] =
    [Type::UUID_ARRAY, Type::UUID_ARRAY, Type::JSONB_ARRAY];

/// Runs success statement `sql` for `entries` (as `prepared`, when given: the same statement
/// prepared on this connection); returns the leases it succeeded.
async fn succeed(
    client: &impl GenericClient,
    (sql, prepared): (&str, Option<&Statement>),
    entries: &[(Lease, Option<Output>)],
) -> Result<HashSet<Lease>, tokio_postgres::Error> {
    let leases: Vec<Lease> = entries.iter().map(|e| e.0).collect();
    let (ids, claims) = lease::unzip(&leases);
    // A kind that records nothing stores NULL.
    let outputs: Vec<Option<&Output>> = entries.iter().map(|e| e.1.as_ref()).collect();
    let params: [&(dyn ToSql + Sync); 3] = [&ids, &claims, &outputs];
    let rows = match prepared {
        Some(statement) => client.query(statement, &params).await?,
        None => {
            let typed: Vec<_> = params.into_iter().zip(SUCCESS_PARAMS).collect();
            client.query_typed(sql, &typed).await?
        }
    };
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
/// ended `failed` with `attempts_exhausted` (`$1` id, `$2` claim id). A job whose owner asked to
/// cancel it ends `cancelled` instead of retrying. A retried attempt is appended to the job's
/// attempt history (`retried`, with the time it is due again) with its diagnosis `$4` (NULL for
/// none); a job that ends `failed` keeps that diagnosis on its outcome, its decision `fail` and
/// without a delay (the database decides, on the row's attempts); a cancelled one keeps none. The retried row's virtual deadline
/// moves with its due time (`durable_etl_sort_at`, [`crate::queue`]), keeping its priority.
/// Returns the job's new status.
///
/// Locks: `decided` row-locks the fenced row (`FOR NO KEY UPDATE`), so it reads the row's current
/// version: a cancel request that committed while it waited is seen, and one that comes later
/// waits for this statement and finds the job `pending` (which it cancels at once) or ended.
/// `retried` or `ended` (never both: their conditions exclude each other) then updates or deletes
/// the row it holds; waits at most `lock_timeout` for an executor's or a request's lock.
/// `history` takes `FOR KEY SHARE` on the job's intake row (its foreign key; see
/// `attempt_ended!`).
pub const RETRY_SQL: &str = concat!(
    "
WITH decided AS (
    SELECT j.id, j.queue, j.permit_slot, ",
    cancel_requested!(),
    " AS cancel,
           j.attempts < j.max_attempts AS again
      FROM etl_job_records j
     WHERE j.id = $1 AND j.lease_claim_id = $2 AND j.status = 'running'
       FOR NO KEY UPDATE OF j
), retried AS (
    UPDATE etl_job_records AS j
       SET status = 'pending', run_at = now() + $3 * interval '1 millisecond',
           sort_at = durable_etl_sort_at(now() + $3 * interval '1 millisecond', j.priority),
           updated_at = now(),
           ",
    lease_cleared!(),
    "
      FROM decided d
     WHERE j.id = d.id AND d.again AND NOT d.cancel AND j.lease_claim_id = $2 AND j.status = 'running'
 RETURNING j.status, ",
    attempt_columns!(),
    "
), history AS (
    ",
    attempt_ended!("retried", "retried", "NULL", diagnosis: "$4::jsonb"),
    "
), ended AS (
    DELETE FROM etl_job_records AS j
     USING decided d
     WHERE j.id = d.id AND NOT (d.again AND NOT d.cancel) AND j.lease_claim_id = $2 AND j.status = 'running'
 RETURNING ",
    ended_columns!(),
    ", d.cancel
), outcome AS (
    ",
    outcome_of!(
        "ended",
        "CASE WHEN cancel THEN 'cancelled' ELSE 'failed' END",
        "CASE WHEN cancel THEN cancel_code ELSE 'attempts_exhausted' END",
        "NULL::int4",
        diagnosis: "CASE WHEN cancel THEN NULL
            ELSE ($4::jsonb - 'delay_ms') || '{\"decision\": \"fail\"}'::jsonb END"
    ),
    "
), letter AS (
    ",
    dead_letters_of!("outcome"),
    "
), ",
    permits_freed!(
        claimed_by_freer: "SELECT d.queue, d.permit_slot, $2::uuid AS claim_id FROM decided d
          WHERE d.id IN (SELECT id FROM retried UNION ALL SELECT id FROM ended)"
    ),
    "
SELECT status FROM retried UNION ALL SELECT status FROM outcome"
);

/// Schedules a retry after `delay` (or ends the job `attempts_exhausted`), recording no
/// diagnosis.
///
/// # Errors
/// The database error of the statement.
pub async fn retry(
    client: &impl GenericClient,
    lease: Lease,
    delay: Duration,
) -> Result<Transition, tokio_postgres::Error> {
    retry_diagnosed(client, lease, delay, None).await
}

/// [`retry`], recording `diagnosis` with the attempt (or with the outcome, when the job ends
/// `attempts_exhausted`).
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn retry_diagnosed(
    client: &impl GenericClient,
    lease: Lease,
    delay: Duration,
    diagnosis: Option<&Diagnosis>,
) -> Result<Transition, tokio_postgres::Error> {
    let diagnosis = diagnosis.map(Diagnosis::to_json);
    let row = client
        .query_typed_opt(
            RETRY_SQL,
            &[
                (&lease.job_id, Type::UUID),
                (&lease.claim_id, Type::UUID),
                (&millis(delay), Type::INT8),
                (&diagnosis, Type::JSONB),
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

/// Ends the job `failed` with code `$3` (and record index `$4`, diagnosis `$5`, each NULL for
/// none) — or `cancelled` when `$3` is `cancelled`, with the code its owner's request gave
/// (`cancelled`, or `replaced` for a job a newer one replaced), and no diagnosis — deleting its
/// fenced live row and appending its outcome.
///
/// Locks: row-locks and deletes the one fenced live row.
pub const FAIL_SQL: &str = concat!(
    "
WITH ended AS (
    DELETE FROM etl_job_records AS j
     WHERE j.id = $1 AND j.lease_claim_id = $2 AND j.status = 'running'
 RETURNING ",
    ended_columns!(),
    "
), ",
    permits_freed!(claimed_by_freer: "SELECT queue, permit_slot, lease_claim_id AS claim_id FROM ended"),
    ", outcome AS (
    ",
    outcome_of!(
        "ended",
        "CASE WHEN $3::text = 'cancelled' THEN 'cancelled' ELSE 'failed' END",
        "CASE WHEN $3::text = 'cancelled' THEN coalesce(cancel_code, $3::text) ELSE $3::text END",
        "$4::int4",
        diagnosis: "CASE WHEN $3::text = 'cancelled' THEN NULL ELSE $5::jsonb END"
    ),
    "
), letter AS (
    ",
    dead_letters_of!("outcome"),
    "
)
SELECT job_id FROM outcome"
);

/// Ends the job `failed` with `code` (a stored code) and the optional record index, recording
/// no diagnosis.
///
/// # Errors
/// The database error of the statement.
pub async fn fail(
    client: &impl GenericClient,
    lease: Lease,
    code: Code,
    record_index: Option<i32>,
) -> Result<Transition, tokio_postgres::Error> {
    fail_stored(client, lease, (code, code.as_str()), (record_index, None)).await
}

/// [`fail`], recording `diagnosis` with the outcome.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn fail_diagnosed(
    client: &impl GenericClient,
    lease: Lease,
    (code, record_index): (Code, Option<i32>),
    diagnosis: Option<&Diagnosis>,
) -> Result<Transition, tokio_postgres::Error> {
    fail_stored(
        client,
        lease,
        (code, code.as_str()),
        (record_index, diagnosis),
    )
    .await
}

/// Ends the job `failed` with `stored`, a code its kind declares (see
/// [`crate::job::handler::Handler::codes`]), recording `diagnosis` with the outcome; the
/// transition counts it as `handler_failed`.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn fail_with_kind_code(
    client: &impl GenericClient,
    lease: Lease,
    stored: &str,
    diagnosis: Option<&Diagnosis>,
) -> Result<Transition, tokio_postgres::Error> {
    fail_stored(
        client,
        lease,
        (Code::HandlerFailed, stored),
        (None, diagnosis),
    )
    .await
}

/// Ends the job `failed`, storing `stored` (with the record index and the diagnosis given) and
/// counting the transition as `code`.
async fn fail_stored(
    client: &impl GenericClient,
    lease: Lease,
    (code, code_str): (Code, &str),
    (record_index, diagnosis): (Option<i32>, Option<&Diagnosis>),
) -> Result<Transition, tokio_postgres::Error> {
    let diagnosis = diagnosis.map(Diagnosis::to_json);
    let n = client
        .execute_typed(
            FAIL_SQL,
            &[
                (&lease.job_id, Type::UUID),
                (&lease.claim_id, Type::UUID),
                (&code_str, Type::TEXT),
                (&record_index, Type::INT4),
                (&diagnosis, Type::JSONB),
            ],
        )
        .await?;
    Ok(match (n, code) {
        (1, Code::Cancelled) => Transition::Cancelled,
        (1, _) => Transition::Failed(code),
        _ => Transition::LeaseLost,
    })
}

/// Locks the batch's live job rows under their fences, in id order, at the start of the
/// execution transaction, and tells for each one still held whether its owner asked to cancel it
/// (its effects must never commit). `$1` job ids, `$2` claim ids, pairwise. A fenced live row is
/// itself the proof that no effects of the job committed: a commit deletes it.
///
/// Locks: a row lock (`FOR NO KEY UPDATE`, which conflicts with every other writer and with the
/// `FOR UPDATE` of recovery and heartbeats) on each fenced job row, taken in id order (the lock
/// step runs above the sort) and held until the transaction ends; this is what makes recovery
/// and heartbeats skip the rows while their effects commit. A cancel request updates the live
/// row, so the two serialize on the row lock: a request that holds the row makes this statement
/// wait, and the row it then locks and returns is the request's new version, so the request wins
/// (nothing of the job commits); a request that comes after this lock waits until the
/// transaction ends and finds the job ended (its answer says so). A cancel and a commit never
/// both win. Rows whose claim changed are not returned and not locked.
pub const LOCK_FENCED_SQL: &str = concat!(
    "
SELECT j.id, j.lease_claim_id, ",
    cancel_requested!(),
    "
  FROM etl_job_records j
 WHERE j.id = ANY($1::uuid[]) AND j.lease_claim_id = ANY($2::uuid[])
   AND j.status = 'running'
 ORDER BY j.id
   FOR NO KEY UPDATE OF j"
);

/// The `(job id, claim id)` leases in `$1`/`$2` that succeeded under that claim (their outcome,
/// with its ledger, was committed).
///
/// Locks: none (a snapshot read of the outcomes' primary key).
pub const LEDGER_BY_CLAIM_SQL: &str = "
SELECT o.job_id, o.lease_claim_id
  FROM etl_job_outcomes o
 WHERE o.job_id = ANY($1::uuid[]) AND o.lease_claim_id = ANY($2::uuid[])
   AND o.status = 'succeeded'";

/// Locks the fenced rows of `leases`; returns, per `(job id, claim id)` still held, whether its
/// owner asked to cancel it. Keyed by the lease: when a batch holds a stale claim and the live
/// claim of the same job (the replica lost the job, then claimed it again), only the live one
/// is fenced.
pub(crate) async fn lock_fenced(
    tx: &tokio_postgres::Transaction<'_>,
    leases: &[Lease],
) -> Result<HashMap<Lease, bool>, tokio_postgres::Error> {
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
        .filter_map(|r| Some((*by_ids.get(&(r.get(0), r.get(1)))?, r.get(2))))
        .collect())
}

/// The leases of `leases` whose success (outcome and ledger) was committed under their claim (a COMMIT whose
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

pub(crate) mod release;
mod wake;
pub use release::{release, RELEASE_SQL, RELEASE_TIMEOUT};
pub use wake::{wake_waiting, WAKE_WAITING_SQL};
