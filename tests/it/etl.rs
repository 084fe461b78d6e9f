//! The ETL path end to end on real PostgreSQL: transactional and idempotent enqueue, the atomic
//! load with its ledger, durable deduplication, record failures, and transient lock failures.

use crate::support::{count, eventually, job_row, TestDb, LEDGERS};
use durable_etl::codes::Code;
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::digest::{DigestKind, Secret};
use durable_etl::error::Error;
use durable_etl::intake::IntakeLimits;
use durable_etl::job::handler::Registry;
use durable_etl::kinds::etl::enqueue::{enqueue, enqueue_many, NewJob};
use durable_etl::kinds::etl::load::EtlLoad;
use durable_etl::kinds::etl::request::{self, EtlRequest};
use durable_etl::worker::completer::Transition;
use durable_etl::worker::Worker;
use serde_json::{json, Value};
use std::time::Duration;

/// The secret of these tests.
pub(crate) fn secret() -> Secret {
    Secret::new("etl-test-secret-0123456789").unwrap()
}

/// The owner digest of `name`.
pub(crate) fn owner(name: &str) -> [u8; 32] {
    secret().digest(DigestKind::Principal, name.as_bytes())
}

/// A validated request from a JSON document.
pub(crate) fn req(doc: Value) -> EtlRequest {
    request::parse(&doc, IntakeLimits::default()).unwrap()
}

/// A new job for `request` under `key`.
pub(crate) fn new_job<'a>(key: &'a str, request: &'a EtlRequest, max_attempts: i32) -> NewJob<'a> {
    NewJob {
        idempotency_key: key,
        request,
        max_attempts,
        retain: None,
    }
}

/// A worker running ETL loads, its sessions bounded by `lock_timeout`.
pub(crate) async fn etl_worker(db: &TestDb, owner_id: &str, lock_timeout: Duration) -> Worker {
    let db_config = DatabaseConfig {
        lock_timeout,
        ..db.config.clone()
    };
    let pool = durable_etl::db::connect_pool(&db_config, "test")
        .await
        .unwrap();
    let config = WorkerConfig {
        owner_id: owner_id.to_owned(),
        retry_min_delay: Duration::from_millis(50),
        retry_max_delay: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    Worker::start(
        pool,
        &db_config,
        config,
        Registry::new().perform(EtlLoad::default()),
    )
    .await
    .unwrap()
}

/// Makes every pending job due now (the test's clock moves instead of sleeping).
async fn make_due(client: &tokio_postgres::Client) {
    client
        .execute(
            "UPDATE etl_job_records SET run_at = now(), sort_at = now() WHERE status = 'pending'",
            &[],
        )
        .await
        .unwrap();
}

/// Every row of the three job tables as text, space-separated.
async fn dump_jobs(client: &tokio_postgres::Client) -> String {
    client
        .query_one(
            "SELECT concat_ws(' ', (SELECT string_agg(t::text, ' ') FROM etl_job_intake t),
                                   (SELECT string_agg(t::text, ' ') FROM etl_job_records t),
                                   (SELECT string_agg(t::text, ' ') FROM etl_job_outcomes t))",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// The ledger summary of job `id`: (inserted, updated, unchanged).
async fn ledger(client: &tokio_postgres::Client, id: uuid::Uuid) -> (i32, i32, i32) {
    let row = client
        .query_one(
            "SELECT (output ->> 'rows_inserted')::int, (output ->> 'rows_updated')::int,
                    (output ->> 'rows_unchanged')::int FROM etl_job_outcomes
              WHERE job_id = $1 AND status = 'succeeded'",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn enqueue_commits_and_rolls_back_with_the_callers_transaction() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await
        .unwrap();
    let request = req(json!({"dataset": "orders", "key": "id", "records": [{"id": 1}]}));

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    enqueue(&tx, &secret(), &owner("alice"), new_job("k1", &request, 5))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(count(&client, "orders").await, 0);
    assert_eq!(
        count(&client, "etl_jobs").await,
        0,
        "the rollback took the job too"
    );

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    let job = enqueue(&tx, &secret(), &owner("alice"), new_job("k1", &request, 5))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!job.replayed);
    assert_eq!(count(&client, "orders").await, 1);
    let stored: Value = client
        .query_one(
            "SELECT request_payload FROM etl_job_records WHERE id = $1",
            &[&job.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, request.to_value());
}

#[tokio::test]
async fn the_same_key_replays_and_a_different_request_is_refused() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let a = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1}]}));
    let b = req(json!({"dataset": "d", "key": "id", "records": [{"id": 2}]}));
    let first = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("idem-canary", &a, 5),
    )
    .await
    .unwrap();
    let again = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("idem-canary", &a, 5),
    )
    .await
    .unwrap();
    assert_eq!((again.id, again.replayed), (first.id, true));
    let err = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("idem-canary", &b, 5),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::IdempotencyKeyReused);
    let other_owner = enqueue(
        &client,
        &secret(),
        &owner("bob"),
        new_job("idem-canary", &b, 5),
    )
    .await
    .unwrap();
    assert_ne!(other_owner.id, first.id);
    let err = enqueue(&client, &secret(), &owner("alice"), new_job("", &a, 5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::IdempotencyKeyInvalid);
    let long = "k".repeat(256);
    assert!(matches!(
        enqueue(&client, &secret(), &owner("alice"), new_job(&long, &a, 5)).await,
        Err(Error::Rejected(_))
    ));
    // Keys and principals are stored only as digests.
    let dump = dump_jobs(&client).await;
    assert!(!dump.contains("idem-canary") && !dump.contains("alice"));
    assert_eq!(count(&client, "etl_jobs").await, 2);
}

#[tokio::test]
async fn a_batch_is_one_statement_one_notification_and_replays_whole() {
    let db = TestDb::migrated().await;
    let mut listener =
        crate::support::Listener::start(&db, &["durable_etl_jobs", "sentinel"]).await;
    let client = db.client().await;
    crate::support::register_waiting(&client, "listener").await;
    let requests: Vec<EtlRequest> = (0..3)
        .map(|i| req(json!({"dataset": "d", "key": "id", "records": [{"id": i}]})))
        .collect();
    let keys = ["b0", "b1", "b2"];
    let jobs: Vec<NewJob> = keys
        .iter()
        .zip(&requests)
        .map(|(k, r)| new_job(k, r, 5))
        .collect();
    let first = enqueue_many(&client, &secret(), &owner("alice"), &jobs)
        .await
        .unwrap();
    assert!(first.iter().all(|e| !e.replayed));
    let again = enqueue_many(&client, &secret(), &owner("alice"), &jobs)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|e| e.id).collect::<Vec<_>>(),
        first.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|e| e.replayed));
    client.batch_execute("NOTIFY sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("sentinel").await.len(),
        1,
        "the replayed batch inserted nothing"
    );
    assert_eq!(count(&client, "etl_jobs").await, 3);
}

/// A library enqueue on a plain transaction still wakes the replicas through the trigger; a
/// transaction that runs `skip_trigger_notify` does not, and the opt-out ends with it.
#[tokio::test]
async fn a_library_enqueue_notifies_through_the_trigger_unless_its_transaction_opts_out() {
    let db = TestDb::migrated().await;
    let mut listener =
        crate::support::Listener::start(&db, &["durable_etl_jobs", "sentinel"]).await;
    let mut client = db.client().await;
    crate::support::register_waiting(&client, "listener").await;
    let request = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1}]}));
    for (key, opt_out) in [
        ("plain", false),
        ("opted-out", true),
        ("plain-again", false),
    ] {
        let tx = client.transaction().await.unwrap();
        if opt_out {
            durable_etl::jobs::notifier::skip_trigger_notify(&tx)
                .await
                .unwrap();
        }
        enqueue(&tx, &secret(), &owner("alice"), new_job(key, &request, 5))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    client.batch_execute("NOTIFY sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("sentinel").await,
        vec![
            (
                "durable_etl_jobs".to_owned(),
                "t 1 default etl.load".to_owned()
            );
            2
        ],
        "the opted-out transaction sent nothing"
    );
    assert_eq!(count(&client, "etl_jobs").await, 3);
}

#[tokio::test]
async fn a_load_commits_rows_ledger_and_success_together_and_counts_changes() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "loader", Duration::from_secs(5)).await;
    let first = req(json!({
        "dataset": "orders", "key": "order_id",
        "records": [{"id": "A1", "amount": "10.50", "at": "2026-01-01T01:00:00+01:00"},
                    {"id": "A2", "amount": "3"}],
        "transform": {"rename": {"id": "order_id"}, "cast": {"amount": "decimal", "at": "timestamp"},
                      "defaults": {"status": "new"}, "required": ["order_id"],
                      "select": ["order_id", "amount", "at", "status"]}
    }));
    let a = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("load-1", &first, 5),
    )
    .await
    .unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(a.id, Transition::Succeeded)]
    );
    assert_eq!(ledger(&client, a.id).await, (2, 0, 0));
    let row: Value = client
        .query_one(
            "SELECT record FROM etl_target_rows WHERE record_key = 'A1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        row,
        json!({"order_id": "A1", "amount": "10.50", "at": "2026-01-01T00:00:00Z", "status": "new"})
    );
    let done = job_row(&client, a.id).await;
    assert!(!done.live && done.lease_cleared);

    // A second load: one row unchanged, one changed, one new.
    let second = req(json!({
        "dataset": "orders", "key": "order_id",
        "records": [{"order_id": "A1", "amount": "10.50", "at": "2026-01-01T00:00:00Z", "status": "new"},
                    {"order_id": "A2", "amount": "4"}, {"order_id": "A3"}]
    }));
    let b = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("load-2", &second, 5),
    )
    .await
    .unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(b.id, Transition::Succeeded)]
    );
    assert_eq!(ledger(&client, b.id).await, (1, 1, 1));
    assert_eq!(count(&client, "etl_target_rows").await, 3);
    assert_eq!(
        count(
            &client,
            &format!("etl_target_rows WHERE written_by_job = '{}'", a.id)
        )
        .await,
        1,
        "A1 kept its writer"
    );
}

#[tokio::test]
async fn a_duplicate_delivery_changes_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "dedup", Duration::from_secs(5)).await;
    let request = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1}, {"id": 2}]}));
    let job = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("dup", &request, 5),
    )
    .await
    .unwrap();
    let payload: Value = client
        .query_one(
            "SELECT request_payload FROM etl_job_records WHERE id = $1",
            &[&job.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(job.id, Transition::Succeeded)]
    );
    assert_eq!(ledger(&client, job.id).await, (2, 0, 0));
    let before: Vec<String> = client
        .query(
            "SELECT t::text FROM etl_target_rows t ORDER BY record_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Force a second delivery: the job's outcome is taken away and its live row, with its
    // payload, put back pending, as if the same request were delivered again.
    client
        .execute(
            "WITH gone AS (DELETE FROM etl_job_outcomes WHERE job_id = $1 RETURNING *)
             INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, attempts, max_attempts, run_at)
             SELECT i.id, i.owner_key, i.kind, $2, gone.attempts, i.max_attempts, now()
               FROM gone JOIN etl_job_intake i ON i.id = gone.job_id",
            &[&job.id, &payload],
        )
        .await
        .unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(job.id, Transition::Succeeded)]
    );
    assert_eq!(count(&client, LEDGERS).await, 1);
    assert_eq!(
        ledger(&client, job.id).await,
        (0, 0, 2),
        "the second delivery changed no row"
    );
    let after: Vec<String> = client
        .query(
            "SELECT t::text FROM etl_target_rows t ORDER BY record_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(after, before, "target rows untouched, updated_at included");
    assert_eq!(job_row(&client, job.id).await.attempts, 2);
}

#[tokio::test]
async fn a_record_that_fails_its_cast_fails_the_job_with_its_index_only() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "strict", Duration::from_secs(5)).await;
    let request = req(json!({
        "dataset": "d", "key": "id",
        "records": [{"id": 1, "n": "5"}, {"id": 2, "n": "canary-not-a-number"}],
        "transform": {"cast": {"n": "integer"}}
    }));
    let job = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("bad", &request, 5),
    )
    .await
    .unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(job.id, Transition::Failed(Code::RecordInvalid))]
    );
    let row = job_row(&client, job.id).await;
    assert_eq!(
        (row.failure_code.as_deref(), row.failure_record_index),
        (Some("record_invalid"), Some(1))
    );
    assert!(!row.live);
    assert_eq!(count(&client, "etl_target_rows").await, 0);
    assert!(
        !dump_jobs(&client).await.contains("canary"),
        "no value is kept"
    );
}

/// Holds a row lock on target row `key` of dataset `d` from another session until dropped.
async fn hold_row(db: &TestDb, key: &str) -> tokio_postgres::Client {
    let holder = db.client().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM etl_target_rows WHERE dataset = 'd' AND record_key = '{key}' FOR UPDATE"
        ))
        .await
        .unwrap();
    holder
}

#[tokio::test]
async fn a_locked_target_row_times_out_retries_with_backoff_and_succeeds_once_released() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "patient", Duration::from_millis(100)).await;
    let seed = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1, "v": 0}]}));
    let seeded = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("seed", &seed, 5),
    )
    .await
    .unwrap();
    worker.step().await.unwrap();
    let update = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1, "v": 1}]}));
    let job = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("upd", &update, 3),
    )
    .await
    .unwrap();
    let holder = hold_row(&db, "1").await;
    for attempt in 1..=2 {
        assert_eq!(
            worker.step().await.unwrap(),
            vec![(job.id, Transition::Retried)],
            "attempt {attempt}"
        );
        make_due(&client).await;
    }
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(job.id, Transition::Succeeded)]
    );
    assert_eq!(ledger(&client, job.id).await, (0, 1, 0));
    assert_eq!(job_row(&client, job.id).await.attempts, 3);
    assert_ne!(seeded.id, job.id);

    // With the lock held through every attempt, the bound ends it.
    let again = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1, "v": 2}]}));
    let doomed = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("doomed", &again, 2),
    )
    .await
    .unwrap();
    let _holder = hold_row(&db, "1").await;
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(doomed.id, Transition::Retried)]
    );
    make_due(&client).await;
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(doomed.id, Transition::Failed(Code::AttemptsExhausted))]
    );
    let row = job_row(&client, doomed.id).await;
    assert_eq!(row.failure_code.as_deref(), Some("attempts_exhausted"));
    assert!(!row.live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_with_another_session_is_retried() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // PostgreSQL looks for a deadlock once per wait, `deadlock_timeout` after it began, and the
    // session that finds the cycle is its victim. The worker's sessions look after 3 s (so the
    // other session surely waits by then, however slow the machine) and the other session never
    // in time: the load is the victim, whatever the scheduling.
    client
        .batch_execute(
            "DO $$ BEGIN
                 EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = %L',
                                current_database(), '3s');
             END $$",
        )
        .await
        .unwrap();
    let worker = etl_worker(&db, "deadlocked", Duration::from_secs(10)).await;
    let seed = req(json!({"dataset": "d", "key": "id", "records": [{"id": "a"}, {"id": "b"}]}));
    enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("seed", &seed, 5),
    )
    .await
    .unwrap();
    worker.step().await.unwrap();
    let update = req(
        json!({"dataset": "d", "key": "id", "records": [{"id": "a", "v": 1}, {"id": "b", "v": 1}]}),
    );
    let job = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("upd", &update, 3),
    )
    .await
    .unwrap();
    // The other session holds "b"; the load locks "a" (key order), then waits for "b"; then the
    // other session asks for "a": a cycle, and the load, which waited first, is the victim.
    let other = hold_row(&db, "b").await;
    other
        .batch_execute("SET deadlock_timeout = '60s'")
        .await
        .unwrap();
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    eventually("the load to wait for row b", || {
        let client = &client;
        async move {
            count(client, "pg_stat_activity WHERE application_name = 'durable-etl/worker' AND wait_event_type = 'Lock' AND datname = current_database()").await == 1
        }
    })
    .await;
    let other_wants_a = tokio::spawn(async move {
        let outcome = other
            .batch_execute(
                "SELECT 1 FROM etl_target_rows WHERE dataset = 'd' AND record_key = 'a' FOR UPDATE",
            )
            .await;
        (other, outcome)
    });
    assert_eq!(step.await.unwrap(), vec![(job.id, Transition::Retried)]);
    let (other, outcome) = other_wants_a.await.unwrap();
    assert!(
        outcome.is_ok(),
        "the other session got its lock once the load was rolled back"
    );
    other.batch_execute("ROLLBACK").await.unwrap();
    let row = job_row(&client, job.id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
    assert_eq!(count(&client, LEDGERS).await, 1, "only the seed committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_whose_connection_is_killed_before_commit_leaves_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "victim", Duration::from_secs(10)).await;
    let seed = req(json!({"dataset": "d", "key": "id", "records": [{"id": "z"}]}));
    enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("seed", &seed, 5),
    )
    .await
    .unwrap();
    worker.step().await.unwrap();
    let update =
        req(json!({"dataset": "d", "key": "id", "records": [{"id": "a"}, {"id": "z", "v": 1}]}));
    let job = enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("upd", &update, 3),
    )
    .await
    .unwrap();
    let holder = hold_row(&db, "z").await;
    let step = tokio::spawn(async move { (worker.step().await.unwrap(), worker) });
    let waiting =
        "pg_stat_activity WHERE application_name = 'durable-etl/worker' AND wait_event_type = 'Lock' AND datname = current_database()";
    eventually("the load to wait mid-transaction", || {
        let client = &client;
        async move { count(client, waiting).await == 1 }
    })
    .await;
    // Row "a" is written (uncommitted) and "z" is awaited: kill the load's session now.
    client
        .execute(
            &format!("SELECT pg_terminate_backend(pid) FROM {waiting}"),
            &[],
        )
        .await
        .unwrap();
    let (done, worker) = step.await.unwrap();
    assert_eq!(done, vec![(job.id, Transition::Retried)]);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        count(&client, "etl_target_rows WHERE record_key = 'a'").await,
        0,
        "nothing survived"
    );
    assert_eq!(
        count(&client, &format!("{LEDGERS} AND job_id = '{}'", job.id)).await,
        0
    );
    make_due(&client).await;
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(job.id, Transition::Succeeded)]
    );
    assert_eq!(ledger(&client, job.id).await, (1, 1, 0));
    assert_eq!(
        worker.recover().await.unwrap(),
        Default::default(),
        "recovery leaves it be"
    );
}
