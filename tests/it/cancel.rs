//! Cancel requests of running jobs: a request and the job's commit serialize on the job's row, so
//! the request is honoured (nothing of the job commits) or answers that the job ended, never
//! both; and every path that ends an attempt or gives the job back (retry, shutdown release,
//! recovery) honours it, with the request's code (`cancelled` or `replaced`).

use crate::handlers::{Scripted, SCRIPTED};
use crate::support::{count, eventually, insert_jobs, job_row, pool, TestDb, LEDGERS};
use durable_etl::codes::Code;
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use durable_etl::jobs::{self, Cancel};
use durable_etl::shutdown::{self, Stage};
use durable_etl::worker::completer::Transition;
use durable_etl::worker::Worker;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use uuid::Uuid;

/// A test configuration: fast timers, a short grace.
fn config(owner: &str) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots: 4,
        poll_interval: Duration::from_secs(60),
        lease: Duration::from_secs(10),
        heartbeat_interval: Duration::from_millis(200),
        execution_timeout: Duration::from_secs(30),
        shutdown_grace: Duration::from_millis(200),
        ..WorkerConfig::default()
    }
}

/// One `SCRIPTED` job doing `action`, and a worker whose handler waits at `gate` first.
async fn gated_job(
    db: &TestDb,
    client: &tokio_postgres::Client,
    owner: &str,
    action: &str,
) -> (Uuid, [u8; 32], Worker, Scripted, Arc<Semaphore>) {
    let [id] = insert_jobs(client, SCRIPTED, &[json!({ "do": action })], 3).await[..] else {
        unreachable!()
    };
    let owner_key: Vec<u8> = client
        .query_one(
            "SELECT owner_key FROM etl_job_records WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    let (gate, scripted) = Scripted::gated();
    let worker = Worker::start(
        pool(db).await,
        &db.config,
        config(owner),
        Registry::new().register(scripted.clone()),
    )
    .await
    .unwrap();
    (id, owner_key.try_into().unwrap(), worker, scripted, gate)
}

/// The task of a worker's step: it returns the step's transitions.
type Stepping = tokio::task::JoinHandle<Vec<(Uuid, Transition)>>;

/// A `gated_job` whose handler has started, on a step of its worker's own (its task returns the
/// step's transitions): the job is running, computing until `gate` lets its handler finish.
async fn computing_job(
    db: &TestDb,
    client: &tokio_postgres::Client,
    owner: &str,
    action: &str,
) -> (Uuid, [u8; 32], Stepping, Arc<Semaphore>) {
    let (id, owner_key, worker, scripted, gate) = gated_job(db, client, owner, action).await;
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    until_prepared(&scripted, 1).await;
    (id, owner_key, step, gate)
}

/// A replica that runs no kind, for its recovery passes.
async fn rescuer(db: &TestDb) -> Worker {
    Worker::start(
        pool(db).await,
        &db.config,
        config("rescuer"),
        Registry::new(),
    )
    .await
    .unwrap()
}

/// Waits until `scripted` has started `n` handlers.
async fn until_prepared(scripted: &Scripted, n: usize) {
    eventually("the handler to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == n }
    })
    .await;
}

/// Asserts that job `id` ended `cancelled` by its owner (no live row, so no payload, is left),
/// no effect written.
async fn assert_cancelled(client: &tokio_postgres::Client, id: Uuid) {
    let row = job_row(client, id).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.failure_code.as_deref(),
            row.live,
            row.lease_cleared
        ),
        ("cancelled", Some("cancelled"), false, true)
    );
    assert_eq!(count(client, "etl_target_rows").await, 0);
    assert_eq!(count(client, LEDGERS).await, 0);
}

/// Waits until `n` sessions of the test's database wait for a lock (the lock waits of other
/// databases on the shared server are not counted).
async fn until_lock_waits(client: &tokio_postgres::Client, n: i64) {
    eventually("sessions to wait for row locks", || async move {
        count(
            client,
            "pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_holds_the_job_row_first_wins_over_its_commit() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, step, gate) = computing_job(&db, &client, "second", "write").await;
    // The request is recorded in a transaction still open when the job's commit comes.
    let mut canceller = db.client().await;
    let request = canceller.transaction().await.unwrap();
    assert_eq!(
        jobs::cancel(&request, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    gate.add_permits(1);
    until_lock_waits(&client, 1).await;
    request.commit().await.unwrap();
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    assert_cancelled(&client, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_that_is_replaced_ends_replaced() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, worker, scripted, gate) = gated_job(&db, &client, "replaced", "write").await;
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    until_prepared(&scripted, 1).await;
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Replaced)
            .await
            .unwrap(),
        Cancel::Requested
    );
    // A second request keeps the first one's code.
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    gate.add_permits(1);
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    let row = job_row(&client, id).await;
    assert_eq!(
        (row.status.as_str(), row.failure_code.as_deref()),
        ("cancelled", Some("replaced"))
    );
    assert_eq!(count(&client, "etl_target_rows").await, 0);
}

/// A running job whose owner cancels it while its handler computes, then its replica shuts down
/// with the job unfinished (the handler never returns: the grace runs out and the job is
/// released). With `recorded`, another session holds the job's row when the cancel comes, so the
/// request is recorded (`Deferred`) and the release applies it first (the next rescuer pass is
/// 30 s away). Either way the job ends `cancelled`, its one attempt charged, no request left.
async fn released_after_a_cancel(recorded: bool) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, worker, scripted, _gate) = gated_job(&db, &client, "leaving", "write").await;
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    until_prepared(&scripted, 1).await;
    if recorded {
        let holder = crate::support::hold_job_row(&db, id).await;
        assert_eq!(prompt_cancel(&client, &owner, id).await.0, Cancel::Deferred);
        holder.batch_execute("ROLLBACK").await.unwrap();
    } else {
        assert_eq!(
            jobs::cancel(&client, &owner, id, Code::Cancelled)
                .await
                .unwrap(),
            Cancel::Requested
        );
    }
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    assert_cancelled(&client, id).await;
    assert_eq!(job_row(&client, id).await.attempts, 1);
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_released_at_shutdown_after_a_cancel_request_ends_cancelled() {
    released_after_a_cancel(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_released_at_shutdown_after_a_recorded_cancel_ends_cancelled() {
    released_after_a_cancel(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_after_a_cancel_request_ends_cancelled() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, worker, scripted, gate) =
        gated_job(&db, &client, "retrying", "write_then_transient").await;
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    until_prepared(&scripted, 1).await;
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    gate.add_permits(1);
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    assert_cancelled(&client, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_job_with_a_cancel_request_ends_cancelled() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, worker, scripted, _gate) = gated_job(&db, &client, "expiring", "write").await;
    let step = tokio::spawn(async move { worker.step().await });
    until_prepared(&scripted, 1).await;
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 hour'",
            &[],
        )
        .await
        .unwrap();
    let recovered = rescuer(&db).await.recover().await.unwrap();
    assert_eq!((recovered.expired, recovered.exhausted), (1, 1));
    assert_cancelled(&client, id).await;
    step.abort();
}

#[tokio::test]
async fn a_pending_job_is_cancelled_at_once_and_an_ended_one_is_refused() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let owner: [u8; 32] = client
        .query_one(
            "SELECT owner_key FROM etl_job_records WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get::<_, Vec<u8>>(0)
        .try_into()
        .unwrap();
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Cancelled
    );
    assert_cancelled(&client, id).await;
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::AlreadyEnded("cancelled".into())
    );
    assert_eq!(
        jobs::cancel(&client, &[7; 32], id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::NotFound
    );
}

/// A replacement that comes while the job it replaces is committing waits for that commit, and
/// is refused (`conflict`: the job it names has ended) instead of being accepted and then
/// overwritten by the stale data of the job it was told it replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_races_the_commit_of_the_job_it_replaces_is_never_overwritten() {
    use crate::etl::{etl_worker, new_job, owner, req, secret};
    use durable_etl::kinds::etl::enqueue::enqueue;
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let owner = owner("replacing");
    let old = req(json!({"dataset": "tests", "key": "id", "records": [{"id": "k", "v": "OLD"}]}));
    let replaced = enqueue(&client, &secret(), &owner, new_job("old", &old, 5))
        .await
        .unwrap()
        .id;
    // A session holds the target row, so the old job's commit locks its live row and waits.
    let mut blocker = db.client().await;
    let tx = blocker.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record)
         VALUES ($1::bytea, 'tests', 'k', '{}'::jsonb)",
        &[&owner.to_vec()],
    )
    .await
    .unwrap();
    let worker = etl_worker(&db, "replaced", Duration::from_secs(30)).await;
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    until_lock_waits(&client, 1).await;
    let mut submitter = db.client().await;
    let replacing = tokio::spawn(async move {
        let new = req(json!({
            "dataset": "tests", "key": "id", "records": [{"id": "k", "v": "NEW"}],
            "replaces": replaced.to_string(),
        }));
        let tx = submitter.transaction().await.unwrap();
        let accepted = enqueue(&tx, &secret(), &owner, new_job("new", &new, 5)).await;
        tx.commit().await.unwrap();
        accepted.map(|job| job.id)
    });
    until_lock_waits(&client, 2).await;
    tx.rollback().await.unwrap();
    assert_eq!(step.await.unwrap(), vec![(replaced, Transition::Succeeded)]);
    let refused = replacing.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::Conflict);
    assert_eq!(
        count(&client, "etl_jobs").await,
        1,
        "no replacement accepted"
    );
    let record: serde_json::Value = client
        .query_one(
            "SELECT record FROM etl_target_rows WHERE record_key = 'k'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(record["v"], "OLD");
    assert_eq!(job_row(&client, replaced).await.status, "succeeded");
}

/// A job whose commit is under way and held open: its handler returned, its group commit holds
/// its live row and waits for a target row that the returned session holds in an open
/// transaction (until the test sends it `ROLLBACK`). The step's task returns its transitions.
async fn committing_job(
    db: &TestDb,
    client: &tokio_postgres::Client,
    owner: &str,
    action: &str,
) -> (Uuid, [u8; 32], Stepping, tokio_postgres::Client) {
    let (id, owner_key, step, gate) = computing_job(db, client, owner, action).await;
    let blocker = db.client().await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record)
             VALUES ($1::bytea, 'tests', $2, '{}'::jsonb)",
            &[&owner_key.to_vec(), &id.to_string()],
        )
        .await
        .unwrap();
    gate.add_permits(1);
    until_lock_waits(client, 1).await;
    (id, owner_key, step, blocker)
}

/// An owner's cancel of job `id` that must answer within a second (a cancel that waited for the
/// commit would wait for as long as the test holds it), and how long it took.
async fn prompt_cancel(
    client: &tokio_postgres::Client,
    owner: &[u8; 32],
    id: Uuid,
) -> (Cancel, Duration) {
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(1),
        jobs::cancel(client, owner, id, Code::Cancelled),
    )
    .await
    .expect("the cancel answers without waiting for the commit that holds the job")
    .unwrap();
    (answer, started.elapsed())
}

/// A [`committing_job`] whose owner cancels it while the commit holds it: answered at once,
/// `Deferred`, and recorded. Returns its id, its step's task and the session holding the commit.
async fn cancelled_while_committing(
    db: &TestDb,
    client: &tokio_postgres::Client,
    owner: &str,
    action: &str,
) -> (Uuid, Stepping, tokio_postgres::Client) {
    let (id, owner, step, blocker) = committing_job(db, client, owner, action).await;
    let (answer, took) = prompt_cancel(client, &owner, id).await;
    eprintln!("deferred cancel answered in {took:?}");
    assert_eq!(answer, Cancel::Deferred);
    assert_eq!(count(client, "etl_job_cancel_deferred").await, 1);
    (id, step, blocker)
}

/// What the API does after answering `Deferred`: waits for job `id`'s row behind its commit, on
/// a session of its own; returned once it waits.
async fn settling(
    db: &TestDb,
    client: &tokio_postgres::Client,
    id: Uuid,
) -> tokio::task::JoinHandle<jobs::Applied> {
    let waiter = db.client().await;
    let settling = tokio::spawn(async move { jobs::await_deferred(&waiter, id).await.unwrap() });
    until_lock_waits(client, 2).await;
    settling
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_commit_holds_the_job_answers_at_once_and_the_job_may_still_succeed() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, step, blocker) = cancelled_while_committing(&db, &client, "committing", "write").await;
    let settling = settling(&db, &client, id).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Succeeded)]);
    let applied = settling.await.unwrap();
    assert_eq!(
        (applied.requested, applied.cancelled, applied.cleared),
        (0, 0, 1),
        "the commit ended the job: the request is only cleared"
    );
    assert_eq!(job_row(&client, id).await.status, "succeeded");
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
    assert_eq!(count(&client, "etl_jobs WHERE cancel_requested").await, 0);
}

/// A cancel recorded while the commit of a job whose effects then fail transiently holds it.
/// The job's retry applies the request first (in the same round trip) and ends the job
/// `cancelled`, whether or not the API's wait for the row (`waited`) got there first; without
/// that wait (the API that answered went away) nothing else is needed. Either way the job ends
/// `cancelled` after its one attempt, and no request is left.
async fn recorded_cancel_of_a_retried_job(waited: bool) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, step, blocker) =
        cancelled_while_committing(&db, &client, "retrying", "write_then_transient").await;
    let settling = if waited {
        Some(settling(&db, &client, id).await)
    } else {
        None
    };
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    if let Some(settling) = settling {
        settling.await.unwrap();
    }
    assert_cancelled(&client, id).await;
    assert_eq!(job_row(&client, id).await.attempts, 1, "never ran again");
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_recorded_during_a_commit_that_retries_the_job_ends_it_cancelled() {
    recorded_cancel_of_a_retried_job(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_cancel_that_nobody_waited_for_is_applied_by_the_retry() {
    recorded_cancel_of_a_retried_job(false).await;
}

/// A cancel recorded while another session held the running job's row (as a commit does), then
/// left alone: the next rescuer pass sets it on the row, and the job's commit is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_cancel_is_applied_by_the_rescuer_pass_while_the_job_runs() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, step, gate) = computing_job(&db, &client, "swept", "write").await;
    let holder = crate::support::hold_job_row(&db, id).await;
    assert_eq!(prompt_cancel(&client, &owner, id).await.0, Cancel::Deferred);
    holder.batch_execute("ROLLBACK").await.unwrap();
    rescuer(&db).await.recover().await.unwrap();
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
    assert_eq!(count(&client, "etl_jobs WHERE cancel_requested").await, 1);
    gate.add_permits(1);
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    assert_cancelled(&client, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cancel_applies_a_recorded_request_once_the_row_is_free() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (id, owner, step, gate) = computing_job(&db, &client, "again", "write").await;
    // A session holds the running job's row, as a commit would.
    let holder = crate::support::hold_job_row(&db, id).await;
    assert_eq!(prompt_cancel(&client, &owner, id).await.0, Cancel::Deferred);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        jobs::cancel(&client, &owner, id, Code::Cancelled)
            .await
            .unwrap(),
        Cancel::Requested
    );
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 0);
    gate.add_permits(1);
    assert_eq!(step.await.unwrap(), vec![(id, Transition::Cancelled)]);
    assert_cancelled(&client, id).await;
}
