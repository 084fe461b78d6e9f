//! The transactions a group commit writes: how a batch's own failure settles its jobs, how many
//! jobs' savepoints one transaction holds, when outcomes are stamped, and effects dropped
//! unapplied.

use super::tests::{ready, Scratch, SUCCEEDED};
use super::*;
use crate::job::handler::{Effects, JobError};
use crate::worker::complete::completer::Transition;
use futures::future::BoxFuture;
use std::time::Duration;
use tokio_postgres::Transaction;
use uuid::Uuid;

#[tokio::test]
async fn a_batch_whose_own_statement_fails_leaves_its_jobs_to_retry_on_a_new_session() {
    let (db, jobs) = Scratch::with_claimed(2).await;
    // Every outcome is refused as a read-only standby refuses a write after a failover: 25006,
    // the infrastructure's fault, never the jobs'.
    db.client
        .batch_execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'read only' USING ERRCODE = '25006'; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON etl_job_outcomes
                 FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .await
        .unwrap();
    let (outcomes, stats) = db.commit_without_effects(&jobs).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(Failure::Infrastructure))),
        "the replica's own failure must not fail the jobs, nor charge them"
    );
    assert_eq!(stats.snapshot().commit_failures, 1);
    assert_eq!(db.pool.state().statistics.connections_closed_broken, 1);
    assert_eq!(db.count("etl_job_outcomes").await, 0);
    assert_eq!(
        db.count("etl_job_records WHERE status = 'running'").await,
        2
    );
    db.client
        .batch_execute("DROP TRIGGER refuse ON etl_job_outcomes")
        .await
        .unwrap();
    let (outcomes, stats) = db.commit_without_effects(&jobs).await;
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Ok(Transition::Succeeded))));
    assert_eq!(stats.snapshot().commit_failures, 0);
}

/// Effects that wait `pause` on the server, then write target row `key` for the job, stamped
/// with the transaction (top-level id) they ran in and the time they wrote.
struct Stamped {
    /// The job.
    job: Uuid,
    /// Its target row's key.
    key: String,
    /// How long the server sleeps first.
    pause: Duration,
}

impl Effects for Stamped {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async move {
            tx.execute("SELECT pg_sleep($1)", &[&self.pause.as_secs_f64()])
                .await?;
            tx.execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES (decode(repeat('ab', 32), 'hex'), 'd', $1,
                         jsonb_build_object('xact', pg_current_xact_id()::text,
                                            'at', clock_timestamp()), $2)",
                &[&self.key, &self.job],
            )
            .await?;
            Ok(Some(serde_json::json!({ "rows_inserted": 1 })))
        })
    }
}

/// `n` claimed jobs, each with [`Stamped`] effects pausing `pause`, committed as one batch.
async fn commit_stamped(n: usize, pause: Duration) -> Scratch {
    let (db, jobs) = Scratch::with_claimed(n).await;
    let batch = jobs
        .iter()
        .enumerate()
        .map(|(i, &pair)| {
            let effects = Stamped {
                job: pair.0,
                key: format!("k{i}"),
                pause,
            };
            ready(pair, Box::new(effects), Duration::from_secs(30))
        })
        .collect();
    let outcomes = db.commit(batch).await;
    assert!(outcomes.iter().all(|o| o == "Succeeded"), "{outcomes:?}");
    assert_eq!(db.count(SUCCEEDED).await, i64::try_from(n).unwrap());
    db
}

#[tokio::test]
async fn a_large_writing_batch_never_holds_more_than_64_savepoints_in_one_transaction() {
    let db = commit_stamped(130, Duration::ZERO).await;
    assert_eq!(db.rows_per_transaction().await, [64, 64, 2]);
    assert_eq!(
        i64::try_from(MAX_JOBS_PER_TRANSACTION).unwrap(),
        64,
        "PostgreSQL caches 64 subtransactions per backend"
    );
}

#[tokio::test]
async fn an_outcome_is_stamped_when_its_statement_ran_not_when_its_transaction_began() {
    let db = commit_stamped(2, Duration::from_millis(300)).await;
    let late: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM etl_job_outcomes o
               JOIN etl_target_rows t ON t.written_by_job = o.job_id
              WHERE o.finished_at >= (t.record->>'at')::timestamptz",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(late, 2, "each outcome finished after its effects wrote");
}

/// Effects that panic when dropped, for jobs whose fence fails: never applied.
struct DropPanics;

impl Effects for DropPanics {
    fn apply<'a>(
        self: Box<Self>,
        _tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async { Err(JobError::transient("applied although its fence failed")) })
    }
}

impl Drop for DropPanics {
    fn drop(&mut self) {
        panic!("effects panicked when dropped");
    }
}

#[tokio::test]
async fn effects_dropped_unapplied_in_a_lane_never_unwind_into_it() {
    // Three stale claims in one batch: their fences fail, so the lane drops their effects
    // unapplied, one after another; a panic unwinding from one drop through the next would
    // abort the process.
    let (db, jobs) = Scratch::with_claimed(3).await;
    let batch = jobs
        .iter()
        .map(|&(id, _)| {
            let stale = (id, Uuid::new_v4());
            ready(stale, Box::new(DropPanics), Duration::from_secs(9))
        })
        .collect();
    assert_eq!(db.commit(batch).await, ["lease lost"; 3]);
    assert_eq!(
        db.count("etl_job_records WHERE status = 'running'").await,
        3
    );
}
