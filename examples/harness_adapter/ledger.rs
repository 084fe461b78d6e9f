//! The adapter's exact accounting: a ledger of every job it enqueued, marked by each job's
//! effects, so lost jobs and duplicate effects are counted, not estimated from rates.
//!
//! Invariants:
//! - A ledger row is written in the producer's transaction that enqueues its job, so a job is in
//!   the ledger if and only if its enqueue committed.
//! - A job's effects add 1 to its row's `applied` inside the fenced transaction that records the
//!   job's success (durable-etl's `Apply`), so `applied` counts the commits of its effects:
//!   0 not (yet) done, 1 done once, more is a duplicate. Effects for a sequence number the
//!   ledger does not hold insert a row without a job id, so they are counted too.
//! - Sequence numbers are unique across replicas and restarts: the high 32 bits are a producer
//!   number drawn from a database sequence at start, the low 32 bits count that producer's jobs.
//! - The count is one statement, so one snapshot: a job is counted once, as completed,
//!   unfinished (still pending or running in the queue: not lost, whatever any replica is doing)
//!   or lost (no effects, and its job ended otherwise or is gone).

use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Advisory-lock key that serialises the ledger's creation across replicas starting together.
const LEDGER_LOCK_KEY: i64 = 0x6861_726e_6573_7301;

/// Creates the ledger and the producer-number sequence if they are missing. Run under
/// [`LEDGER_LOCK_KEY`] (a concurrent `CREATE … IF NOT EXISTS` can fail on the catalog's unique
/// index).
const CREATE_SQL: &str = "
CREATE TABLE IF NOT EXISTS harness_adapter_ledger (
    seq     bigint  PRIMARY KEY,
    job_id  uuid,
    applied integer NOT NULL DEFAULT 0
);
CREATE SEQUENCE IF NOT EXISTS harness_adapter_producers";

/// Draws this process's producer number.
const PRODUCER_NUMBER_SQL: &str = "SELECT nextval('harness_adapter_producers')";

/// Records enqueued jobs `$2` under sequence numbers `$1`, in the enqueue's transaction.
///
/// Locks: inserts rows.
pub(crate) const RECORD_SQL: &str = "
INSERT INTO harness_adapter_ledger (seq, job_id)
SELECT * FROM unnest($1::int8[], $2::uuid[])";

/// Marks job `$1`'s effects applied once more; run by its `Apply`, inside the fence.
///
/// Locks: the ledger row, until the job's success commits.
pub(crate) const MARK_APPLIED_SQL: &str = "
INSERT INTO harness_adapter_ledger (seq, applied) VALUES ($1, 1)
ON CONFLICT (seq) DO UPDATE SET applied = harness_adapter_ledger.applied + 1";

/// Counts the ledger against the jobs' states (the public `etl_jobs` view), in one snapshot.
/// Only the rows without effects look their job up, each by its id.
///
/// Locks: none (reads).
const COUNT_SQL: &str = "
WITH missing AS (
    SELECT l.job_id, j.status
      FROM harness_adapter_ledger l
      LEFT JOIN LATERAL (SELECT status FROM etl_jobs WHERE id = l.job_id) j ON true
     WHERE l.applied = 0 AND l.job_id IS NOT NULL
)
SELECT (SELECT count(*) FROM harness_adapter_ledger WHERE job_id IS NOT NULL),
       (SELECT count(*) FROM harness_adapter_ledger WHERE job_id IS NOT NULL AND applied > 0),
       (SELECT coalesce(sum(applied - 1), 0)::int8 FROM harness_adapter_ledger WHERE applied > 1),
       (SELECT count(*) FROM harness_adapter_ledger WHERE job_id IS NULL),
       (SELECT count(*) FROM missing WHERE status IN ('pending', 'running')),
       (SELECT count(*) FROM missing WHERE status = 'succeeded'),
       (SELECT count(*) FROM missing WHERE status = 'failed'),
       (SELECT count(*) FROM missing WHERE status = 'cancelled'),
       (SELECT count(*) FROM missing WHERE status IS NULL)";

/// The ledger's count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Count {
    /// Jobs whose enqueue committed.
    pub(crate) enqueued: i64,
    /// Of those, jobs whose effects committed (once or more).
    pub(crate) completed: i64,
    /// Commits of effects beyond each job's first: duplicate executions that reached the
    /// database.
    pub(crate) duplicate_effects: i64,
    /// Effects committed for sequence numbers no enqueue recorded.
    pub(crate) unknown_effects: i64,
    /// Jobs without effects still pending or running: not lost, not done yet.
    pub(crate) unfinished: i64,
    /// Jobs without effects that will never get them: the sum of the four below.
    pub(crate) lost: i64,
    /// Lost: the job succeeded, but its effects did not commit with it.
    pub(crate) lost_succeeded_without_effects: i64,
    /// Lost: the job failed.
    pub(crate) lost_failed: i64,
    /// Lost: the job was cancelled.
    pub(crate) lost_cancelled: i64,
    /// Lost: the job is gone from the queue.
    pub(crate) lost_missing: i64,
}

impl Count {
    /// Whether no job was lost and no effect was committed twice or for an unknown job.
    pub(crate) fn is_exact(&self) -> bool {
        self.lost == 0 && self.duplicate_effects == 0 && self.unknown_effects == 0
    }
}

/// Creates the ledger if it is missing and draws this process's producer number.
///
/// # Errors
/// Database errors.
pub(crate) async fn prepare(
    client: &mut tokio_postgres::Client,
) -> Result<i64, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LEDGER_LOCK_KEY])
        .await?;
    tx.batch_execute(CREATE_SQL).await?;
    tx.commit().await?;
    Ok(client.query_one(PRODUCER_NUMBER_SQL, &[]).await?.get(0))
}

/// Records `ids` under sequence numbers `seqs` on `client` (the enqueue's transaction).
///
/// # Errors
/// Database errors.
pub(crate) async fn record(
    client: &impl GenericClient,
    seqs: &[i64],
    ids: &[Uuid],
) -> Result<(), tokio_postgres::Error> {
    client.execute(RECORD_SQL, &[&seqs, &ids]).await.map(|_| ())
}

/// Counts the ledger.
///
/// # Errors
/// Database errors.
pub(crate) async fn count(client: &impl GenericClient) -> Result<Count, tokio_postgres::Error> {
    let row = client.query_one(COUNT_SQL, &[]).await?;
    let (succeeded, failed, cancelled, missing): (i64, i64, i64, i64) =
        (row.get(5), row.get(6), row.get(7), row.get(8));
    Ok(Count {
        enqueued: row.get(0),
        completed: row.get(1),
        duplicate_effects: row.get(2),
        unknown_effects: row.get(3),
        unfinished: row.get(4),
        lost: succeeded + failed + cancelled + missing,
        lost_succeeded_without_effects: succeeded,
        lost_failed: failed,
        lost_cancelled: cancelled,
        lost_missing: missing,
    })
}
