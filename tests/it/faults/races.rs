//! A cancellation racing the commit, in-process with `Worker::step` so the order is chosen by
//! the test: exactly one of them wins, never both.

use super::{assert_done_once, locked_update, until_load_waits};
use crate::handlers::{Scripted, SCRIPTED};
use crate::support::{count, eventually, insert_jobs, job_row, TestDb, LEDGERS};
use durable_etl::codes::Code;
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::job::handler::Registry;
use durable_etl::jobs::{self, Cancel};
use durable_etl::kinds::etl::load::EtlLoad;
use durable_etl::worker::completer::Transition;
use durable_etl::worker::Worker;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Starts an in-process replica on `db` running `registry`, whose statements wait up to a
/// minute for row locks (the test decides when they are released).
async fn worker(db: &TestDb, registry: Registry) -> Worker {
    let patient = DatabaseConfig {
        lock_timeout: Duration::from_secs(60),
        ..db.config.clone()
    };
    let pool = durable_etl::db::connect_pool(&patient, "worker")
        .await
        .unwrap();
    let config = WorkerConfig {
        owner_id: "racer".to_owned(),
        slots: 1,
        ..WorkerConfig::default()
    };
    Worker::start(pool, &patient, config, registry)
        .await
        .unwrap()
}

/// Starts `worker.step()` on a task.
fn spawn_step(worker: &Arc<Worker>) -> JoinHandle<Vec<(uuid::Uuid, Transition)>> {
    let worker = Arc::clone(worker);
    tokio::spawn(async move { worker.step().await.unwrap() })
}

/// Races a cancel against the commit of a load that blocks on a target row the test holds.
/// The effects transaction locks the job row under the fence (and checks for cancel requests)
/// before its load blocks, so: with `cancel_first`, the cancel arrives while the load waits,
/// finds the job's row held by the commit and answers at once that its request is recorded and
/// the job may still succeed (`Deferred`), then the target row is released, the commit lands,
/// and the recorded request, applied next, finds the job ended and is cleared; otherwise the
/// target row is released, the commit lands, and the cancel comes after and answers that the
/// job succeeded. Either way the commit wins and the cancel never says `Requested` for a job
/// whose effects commit: succeeded, one ledger row, the target row updated once, no request left.
async fn commit_against_cancel(cancel_first: bool) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    let worker = Arc::new(worker(&db, Registry::new().perform(EtlLoad::default())).await);
    let stepping = spawn_step(&worker);
    until_load_waits(&client).await;
    let canceller = db.client().await;
    let cancel = async move {
        jobs::cancel(
            &canceller,
            &crate::support::load_owner(),
            id,
            Code::Cancelled,
        )
        .await
        .unwrap()
    };
    if cancel_first {
        let answer = tokio::time::timeout(Duration::from_secs(1), cancel)
            .await
            .expect("the cancel answers without waiting for the commit");
        assert_eq!(answer, Cancel::Deferred);
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(stepping.await.unwrap(), vec![(id, Transition::Succeeded)]);
        let applied = jobs::apply_deferred(&client, None).await.unwrap();
        assert_eq!((applied.requested, applied.cleared), (0, 1));
    } else {
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(stepping.await.unwrap(), vec![(id, Transition::Succeeded)]);
        assert_eq!(cancel.await, Cancel::AlreadyEnded("succeeded".to_owned()));
    }
    assert_done_once(&client, id, 1).await;
    assert!(!job_row(&client, id).await.live);
    assert_eq!(count(&client, "etl_jobs WHERE cancel_requested").await, 0);
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
}

/// Order A: the cancel comes while the commit holds the job's row: it answers at once that the
/// request is recorded and the job may still succeed, which it then does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_committing_jobs_effects_answers_at_once_that_it_may_still_succeed() {
    commit_against_cancel(true).await;
}

/// Order B: the lock goes and the commit lands, then the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_commit_finds_the_job_ended() {
    commit_against_cancel(false).await;
}

/// The cancel wins when it lands before the effects transaction locks the row (while the
/// handler computes): the commit is refused, the job ends cancelled with no ledger row and no
/// target row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_the_effects_transaction_wins_and_nothing_commits() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let gate = Arc::new(Semaphore::new(0));
    let scripted = Scripted {
        gate: Some(Arc::clone(&gate)),
        ..Scripted::default()
    };
    let worker = Arc::new(worker(&db, Registry::new().register(scripted.clone())).await);
    let stepping = spawn_step(&worker);
    eventually("the handler to compute", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    let owner: [u8; 32] = [0xab; 32];
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    gate.add_permits(1);
    assert_eq!(stepping.await.unwrap(), vec![(id, Transition::Cancelled)]);
    let row = job_row(&client, id).await;
    assert_eq!(
        (row.status.as_str(), row.failure_code.as_deref(), row.live),
        ("cancelled", Some("cancelled"), false)
    );
    assert_eq!(count(&client, LEDGERS).await, 0);
    assert_eq!(count(&client, "etl_target_rows").await, 0);
}
