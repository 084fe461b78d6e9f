//! The batch paths, driven directly against a database of the shared template harness so that
//! each batch's composition is exact (through a replica it depends on timing).

use super::*;
use crate::job::handler::{Effects, JobError};
use crate::test_db::TestDb;
use crate::worker::claim::claimer::{self, Claimant};
use crate::worker::complete::completer::Transition;
use futures::future::BoxFuture;
use std::time::Duration;
use tokio_postgres::Transaction;
use uuid::Uuid;

/// The rows of succeeded outcomes (each carries its job's ledger), for `count`.
pub(super) const SUCCEEDED: &str = "etl_job_outcomes WHERE status = 'succeeded'";

/// Effects that write one target row, fail, panic or overrun their deadline.
pub(super) enum Scripted {
    /// Inserts target row `key` for the job.
    Write(Uuid, &'static str),
    /// Writes its row, then fails permanently.
    WriteThenFail(Uuid),
    /// Panics.
    Panic,
    /// Sleeps past any deadline.
    Hang,
}

impl Effects for Scripted {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async move {
            let (job, key, fail) = match *self {
                Scripted::Write(job, key) => (job, key, false),
                Scripted::WriteThenFail(job) => (job, "failing", true),
                Scripted::Panic => panic!("scripted panic"),
                Scripted::Hang => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return Ok(None);
                }
            };
            tx.execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES (decode(repeat('ab', 32), 'hex'), 'd', $1, '{}', $2)",
                &[&key, &job],
            )
            .await?;
            if fail {
                return Err(JobError::permanent(Code::RecordInvalid));
            }
            Ok(Some(serde_json::json!({ "rows_inserted": 1 })))
        })
    }
}

/// A database of the shared template harness with claimed jobs, and a commit pool and a client
/// on it.
pub(super) struct Scratch {
    /// The database (dropped with the guard).
    pub(super) db: TestDb,
    /// Commit sessions on it, as the lanes have.
    pub(super) pool: sessions::CommitPool,
    /// A plain client on it.
    pub(super) client: tokio_postgres::Client,
}

impl Scratch {
    /// A fresh database with `n` due jobs (payload `{}`), all claimed by one owner. Returns the
    /// scratch database and the claimed `(id, claim id)` pairs.
    pub(super) async fn with_claimed(n: usize) -> (Scratch, Vec<(Uuid, Uuid)>) {
        Scratch::waiting_for_locks(n, Duration::from_millis(200)).await
    }

    /// [`Scratch::with_claimed`], whose sessions wait up to `lock_timeout` for a lock.
    pub(super) async fn waiting_for_locks(
        n: usize,
        lock_timeout: Duration,
    ) -> (Scratch, Vec<(Uuid, Uuid)>) {
        let mut db = TestDb::migrated().await;
        db.config.lock_timeout = lock_timeout;
        let client = crate::db::connect(&db.config, "test").await.unwrap();
        client
            .execute(
                "WITH intake AS (
                     INSERT INTO etl_job_intake
                         (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                          max_attempts, run_at)
                     SELECT gen_random_uuid(), decode(repeat('ab', 32), 'hex'),
                            sha256(g::text::bytea), sha256(g::text::bytea), 'test', 5,
                            now() - interval '1 second'
                       FROM generate_series(1, $1::int4) g
                     RETURNING id, owner_key, kind, max_attempts, run_at
                 )
                 INSERT INTO etl_job_records
                     (id, owner_key, kind, request_payload, max_attempts, run_at)
                 SELECT id, owner_key, kind, '{}', max_attempts, run_at FROM intake",
                &[&i32::try_from(n).unwrap()],
            )
            .await
            .unwrap();
        let claimant = Claimant {
            owner_id: "unit",
            owner_locked: false,
            lease: Duration::from_secs(60),
            heartbeat_interval: std::time::Duration::from_secs(4),
            alive_locked: false,
            kinds: &["test"],
        };
        let mut claimed: Vec<(Uuid, Uuid)> = claimer::claim(&client, claimant, n)
            .await
            .unwrap()
            .iter()
            .map(|j| (j.id(), j.claim_id()))
            .collect();
        claimed.sort();
        let pool = sessions::connect_commit_pool(&db.config, None)
            .await
            .unwrap();
        (Scratch { db, pool, client }, claimed)
    }

    /// Runs one batch of `jobs` whose effects write nothing; returns the outcomes and the
    /// batch's counters.
    pub(super) async fn commit_without_effects(
        &self,
        jobs: &[(Uuid, Uuid)],
    ) -> (Vec<Outcome>, WorkerStats) {
        let batch = jobs
            .iter()
            .map(|&j| {
                ready(
                    j,
                    Box::new(crate::job::handler::NoEffects),
                    Duration::from_secs(9),
                )
            })
            .collect();
        let stats = WorkerStats::default();
        let outcomes = commit_batch(&self.pool, &stats, batch, (&InFlight::default(), 0)).await;
        (outcomes, stats)
    }

    /// Runs one batch of `jobs`, and names each outcome.
    pub(super) async fn commit(&self, jobs: Vec<Ready>) -> Vec<String> {
        let stats = WorkerStats::default();
        commit_batch(&self.pool, &stats, jobs, (&InFlight::default(), 0))
            .await
            .into_iter()
            .map(|o| match o {
                Ok(t) => format!("{t:?}"),
                Err(Failure::Job(e)) => format!("job error: {e}"),
                Err(Failure::Code(code) | Failure::Batch(code, _)) => format!("code: {code}"),
                Err(Failure::LeaseLost) => "lease lost".to_owned(),
                Err(Failure::EffectsOverrun) => "effects overrun".to_owned(),
                Err(Failure::Cancelled) => "cancel".to_owned(),
                Err(Failure::Infrastructure) => "infrastructure".to_owned(),
            })
            .collect()
    }

    /// `SELECT count(*)` of `from`.
    pub(super) async fn count(&self, from: &str) -> i64 {
        self.client
            .query_one(&format!("SELECT count(*) FROM {from}"), &[])
            .await
            .unwrap()
            .get(0)
    }

    /// Gives job `id`'s lease to another claim.
    pub(super) async fn steal_lease(&self, id: Uuid) {
        self.client
            .execute(
                "UPDATE etl_job_records SET lease_claim_id = gen_random_uuid() WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
    }

    /// How many target rows each transaction wrote (by the `xact` each row's record is stamped
    /// with), most first.
    pub(super) async fn rows_per_transaction(&self) -> Vec<i64> {
        self.client
            .query(
                "SELECT count(*) FROM etl_target_rows GROUP BY record->>'xact' ORDER BY 1 DESC",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// The keys of the target rows, sorted.
    pub(super) async fn target_keys(&self) -> Vec<String> {
        self.client
            .query("SELECT record_key FROM etl_target_rows ORDER BY 1", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// A ready job with `effects` and an effects budget of `budget`.
pub(super) fn ready(pair: (Uuid, Uuid), effects: Box<dyn Effects>, budget: Duration) -> Ready {
    Ready {
        lease: Lease {
            job_id: pair.0,
            claim_id: pair.1,
            fencing_token: 1,
        },
        writes: effects.writes(),
        effects: OwnedEffects::new(effects),
        budget,
        span: tracing::Span::none(),
    }
}

#[tokio::test]
async fn a_lane_that_panics_is_restarted_until_it_ends() {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    restarting(move || {
        let run = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            assert!(run >= 2, "lane run {run} dies");
        }
    })
    .await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn each_job_of_a_batch_commits_or_fails_on_its_own() {
    let (db, jobs) = Scratch::with_claimed(7).await;
    let minute = Duration::from_secs(60);
    // Job 3's owner asked to cancel it; job 4's lease went to another claim.
    db.client
        .execute(
            "UPDATE etl_job_records SET cancel_code = 'cancelled' WHERE id = $1",
            &[&jobs[3].0],
        )
        .await
        .unwrap();
    db.steal_lease(jobs[4].0).await;
    let batch = vec![
        ready(jobs[0], Box::new(Scripted::Write(jobs[0].0, "a")), minute),
        ready(
            jobs[1],
            Box::new(Scripted::WriteThenFail(jobs[1].0)),
            minute,
        ),
        ready(jobs[2], Box::new(Scripted::Panic), minute),
        ready(jobs[3], Box::new(Scripted::Write(jobs[3].0, "c")), minute),
        ready(jobs[4], Box::new(Scripted::Write(jobs[4].0, "l")), minute),
        ready(jobs[5], Box::new(Scripted::Hang), Duration::from_millis(50)),
        ready(jobs[6], Box::new(Scripted::Write(jobs[6].0, "b")), minute),
    ];
    assert_eq!(
        db.commit(batch).await,
        [
            "Succeeded",
            "job error: permanent failure: record_invalid",
            "code: handler_panicked",
            "cancel",
            "lease lost",
            "effects overrun",
            "Succeeded"
        ]
    );
    // Only the two successes' writes and ledger rows committed.
    assert_eq!(db.target_keys().await, ["a", "b"]);
    assert_eq!(db.count(SUCCEEDED).await, 2);
    // The failures are still running under their claims (their fenced writes follow); the
    // successes have no live row (their payload left with it).
    assert_eq!(
        db.count("etl_job_records WHERE status = 'running'").await,
        5
    );
    assert_eq!(db.count("etl_job_records").await, 5);
}

#[tokio::test]
async fn effects_queued_behind_a_blocked_job_get_their_own_budget() {
    let (db, jobs) = Scratch::waiting_for_locks(3, Duration::from_secs(60)).await;
    // Another session inserted target row `k` and has not committed: job 0's insert of `k`
    // waits for it (a minute, by the lock timeout), then for ever by its budget.
    let holder = crate::db::connect(&db.db.config, "test").await.unwrap();
    holder
        .batch_execute(&format!(
            "BEGIN; INSERT INTO etl_target_rows
                      (owner_key, dataset, record_key, record, written_by_job)
                    VALUES (decode(repeat('ab', 32), 'hex'), 'd', 'k', '{{}}', '{}')",
            jobs[0].0
        ))
        .await
        .unwrap();
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let release = tokio::spawn({
        let released = Arc::clone(&released);
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            holder.batch_execute("ROLLBACK").await.unwrap();
        }
    });
    let budget = Duration::from_millis(500);
    let batch = jobs
        .iter()
        .zip(["k", "b", "c"])
        .map(|(&j, key)| ready(j, Box::new(Scripted::Write(j.0, key)), budget))
        .collect();
    // Job 0's effects overran their own budget: cut (the statement cancelled), rolled back
    // to their savepoint, and retried (never terminal); the jobs behind it ran with budgets
    // of their own and committed.
    assert_eq!(
        db.commit(batch).await,
        ["effects overrun", "Succeeded", "Succeeded"]
    );
    // The batch did not wait for the row lock to go: job 0's statement was cancelled.
    assert!(!released.load(std::sync::atomic::Ordering::SeqCst));
    release.await.unwrap();
    assert_eq!(db.target_keys().await, ["b", "c"]);
    assert_eq!(db.count(SUCCEEDED).await, 2);
}

#[tokio::test]
async fn a_batch_that_writes_nothing_is_one_statement_and_skips_cancelled_jobs() {
    let (db, jobs) = Scratch::with_claimed(3).await;
    db.client
        .execute(
            "UPDATE etl_job_records SET cancel_code = 'cancelled' WHERE id = $1",
            &[&jobs[1].0],
        )
        .await
        .unwrap();
    let (outcomes, stats) = db.commit_without_effects(&jobs).await;
    assert!(matches!(
        outcomes.as_slice(),
        [
            Ok(Transition::Succeeded),
            Err(Failure::Cancelled),
            Ok(Transition::Succeeded)
        ]
    ));
    // One statement succeeded the batch; one more told the job it skipped (cancel requested)
    // from a lost lease.
    assert_eq!(stats.snapshot().round_trips, 2);
    assert_eq!(db.count(SUCCEEDED).await, 2);
    // A batch where every job succeeds is one statement.
    let (db2, jobs2) = Scratch::with_claimed(3).await;
    let (outcomes, stats) = db2.commit_without_effects(&jobs2).await;
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Ok(Transition::Succeeded))));
    assert_eq!(stats.snapshot().round_trips, 1);
}

#[tokio::test]
async fn a_lone_failure_rolls_back_and_a_batch_of_failures_commits_nothing() {
    let (db, jobs) = Scratch::with_claimed(1).await;
    let minute = Duration::from_secs(60);
    // A lone job: no savepoint; its failure rolls the whole transaction back.
    let lone = vec![ready(
        jobs[0],
        Box::new(Scripted::WriteThenFail(jobs[0].0)),
        minute,
    )];
    assert_eq!(
        db.commit(lone).await,
        ["job error: permanent failure: record_invalid"]
    );
    assert_eq!(db.count("etl_target_rows").await, 0);
    assert_eq!(
        db.count("etl_job_records WHERE status = 'running'").await,
        1
    );
    // A batch where every job fails commits nothing at all.
    let (db2, jobs2) = Scratch::with_claimed(2).await;
    let batch = vec![
        ready(
            jobs2[0],
            Box::new(Scripted::WriteThenFail(jobs2[0].0)),
            minute,
        ),
        ready(jobs2[1], Box::new(Scripted::Panic), minute),
    ];
    assert_eq!(
        db2.commit(batch).await,
        [
            "job error: permanent failure: record_invalid",
            "code: handler_panicked"
        ]
    );
    assert_eq!(db2.count("etl_target_rows").await, 0);
    assert_eq!(db2.count(SUCCEEDED).await, 0);
}

#[tokio::test]
async fn a_stale_claim_beside_the_live_claim_of_the_same_job_is_fenced_out() {
    // The replica lost the job (claim `stale`) and claimed it again: both tasks reach the
    // same batch. Only the live claim may apply effects and succeed.
    let (db, jobs) = Scratch::with_claimed(1).await;
    let (id, live) = jobs[0];
    let stale = (id, Uuid::new_v4());
    let minute = Duration::from_secs(60);
    let batch = vec![
        ready(stale, Box::new(Scripted::Write(id, "k")), minute),
        ready(jobs[0], Box::new(Scripted::Write(id, "k")), minute),
    ];
    assert_eq!(db.commit(batch).await, ["lease lost", "Succeeded"]);
    assert_eq!(db.count("etl_target_rows").await, 1);
    let ledger_claim: Uuid = db
        .client
        .query_one(
            "SELECT lease_claim_id FROM etl_job_outcomes WHERE status = 'succeeded'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ledger_claim, live);
    // The same without effects: the stale claim is not reported as succeeded.
    let (db2, jobs2) = Scratch::with_claimed(1).await;
    let stale2 = (jobs2[0].0, Uuid::new_v4());
    let none = || -> Box<dyn Effects> { Box::new(crate::job::handler::NoEffects) };
    let batch = vec![
        ready(stale2, none(), minute),
        ready(jobs2[0], none(), minute),
    ];
    assert_eq!(db2.commit(batch).await, ["lease lost", "Succeeded"]);
    assert_eq!(db2.count(SUCCEEDED).await, 1);
}

#[tokio::test]
async fn a_failure_of_the_batch_itself_fails_every_job_transiently() {
    let (db, jobs) = Scratch::with_claimed(2).await;
    // Another session holds job 1's row lock past the lock timeout.
    let mut holder = crate::db::connect(&db.db.config, "test").await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM etl_job_records WHERE id = $1 FOR UPDATE",
        &[&jobs[1].0],
    )
    .await
    .unwrap();
    let minute = Duration::from_secs(60);
    let effects = |i: usize| -> Box<dyn Effects> { Box::new(Scripted::Write(jobs[i].0, "x")) };
    let batch = vec![
        ready(jobs[0], effects(0), minute),
        ready(jobs[1], effects(1), minute),
    ];
    assert_eq!(
        db.commit(batch).await,
        ["code: transient_database", "code: transient_database"]
    );
    // The same for a batch that writes nothing.
    let batch = jobs
        .iter()
        .map(|&j| ready(j, Box::new(crate::job::handler::NoEffects), minute))
        .collect();
    assert_eq!(
        db.commit(batch).await,
        ["code: transient_database", "code: transient_database"]
    );
    tx.rollback().await.unwrap();
    drop(holder);
    assert_eq!(db.count(SUCCEEDED).await, 0);
}
