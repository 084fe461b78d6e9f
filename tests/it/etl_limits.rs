//! The ETL request's bounds and exactness on real PostgreSQL (#14): a request that would
//! allocate without bound fails its job, never the process; execution does not re-apply the
//! intake record limit; numbers load exactly as sent; a past `run_at` cannot jump the queue;
//! concurrent identical replacements replay.

use crate::etl::{etl_worker, new_job, owner, req, secret};
use crate::support::{count, eventually, job_row, TestDb};
use durable_etl::codes::Code;
use durable_etl::intake::IntakeLimits;
use durable_etl::kinds::etl::enqueue::{enqueue, Enqueued};
use durable_etl::kinds::etl::request::{self, EtlRequest};
use durable_etl::kinds::etl::transform::Transform;
use durable_etl::worker::completer::Transition;
use durable_etl::worker::Worker;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Enqueues `request` for alice under `key`, lets `worker` take one step, and returns the job's
/// id and what the step did to it.
async fn run_one(
    client: &tokio_postgres::Client,
    worker: &Worker,
    key: &str,
    request: &EtlRequest,
) -> (uuid::Uuid, Transition) {
    let job = enqueue(client, &secret(), &owner("alice"), new_job(key, request, 5))
        .await
        .unwrap();
    let steps = worker.step().await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].0, job.id);
    (job.id, steps[0].1)
}

/// `n` records `{"id": i}`.
fn numbered(n: usize) -> Vec<Map<String, Value>> {
    (0..n)
        .map(|i| json!({ "id": i }).as_object().unwrap().clone())
        .collect()
}

#[tokio::test]
async fn a_stored_request_whose_output_exceeds_the_budget_fails_its_job_invalid_payload() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "budget", Duration::from_secs(5)).await;
    // Built directly, so intake's bounds are bypassed (as a library caller or an older release
    // could): 2,000 records x 200 defaults is 400,000 output fields.
    let defaults = (0..200)
        .map(|i| (format!("f{i}"), json!("0123456789")))
        .collect();
    let runaway = EtlRequest {
        dataset: "d".into(),
        key: "id".into(),
        records: numbered(2_000),
        transform: Transform {
            defaults,
            ..Transform::default()
        },
        run_at: None,
        replaces: None,
    };
    let (id, done) = run_one(&client, &worker, "runaway", &runaway).await;
    assert_eq!(done, Transition::Failed(Code::InvalidPayload));
    assert_eq!(job_row(&client, id).await.attempts, 1);
    assert_eq!(count(&client, "etl_target_rows").await, 0);
}

#[tokio::test]
async fn execution_accepts_what_a_larger_intake_record_limit_accepted() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "many", Duration::from_secs(5)).await;
    let doc = json!({"dataset": "d", "key": "id", "records": numbered(10_001)});
    let limits = IntakeLimits {
        max_records: 20_000,
        ..IntakeLimits::default()
    };
    let many = request::parse(&doc, limits).unwrap();
    let (_, done) = run_one(&client, &worker, "many", &many).await;
    assert_eq!(done, Transition::Succeeded);
    assert_eq!(count(&client, "etl_target_rows").await, 10_001);
}

#[tokio::test]
async fn numbers_load_exactly_as_sent_cast_or_not() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "exact", Duration::from_secs(5)).await;
    let doc: Value = serde_json::from_str(
        r#"{"dataset": "d", "key": "id",
            "records": [{"id": 1, "amount": 12345678901234567.89, "big": 123456789012345678901234567890,
                         "d1": 1e21, "d2": 1e-7, "i1": 1.0, "i2": 1e2, "f": 1.50}],
            "transform": {"cast": {"amount": "decimal", "d1": "decimal", "d2": "decimal",
                                   "i1": "integer", "i2": "integer"}}}"#,
    )
    .unwrap();
    let exact = req(doc);
    let (_, done) = run_one(&client, &worker, "exact", &exact).await;
    assert_eq!(done, Transition::Succeeded);
    let fields: Vec<(String, String)> = client
        .query(
            "SELECT f.key, f.value::text FROM etl_target_rows, jsonb_each(record) f ORDER BY f.key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected = [
        ("amount", "\"12345678901234567.89\""),
        ("big", "123456789012345678901234567890"),
        ("d1", "\"1000000000000000000000\""),
        ("d2", "\"0.0000001\""),
        ("f", "1.50"),
        ("i1", "1"),
        ("i2", "100"),
        ("id", "1"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(fields, expected);
}

#[tokio::test]
async fn a_past_run_at_is_due_now_and_jumps_no_queue() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ancient = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1}],
                             "run_at": "0001-01-01T00:00:00Z"}));
    enqueue(
        &client,
        &secret(),
        &owner("alice"),
        new_job("ancient", &ancient, 5),
    )
    .await
    .unwrap();
    let clamped: bool = client
        .query_one(
            "SELECT bool_and(run_at >= created_at) FROM etl_job_intake",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(clamped, "a past run_at is stored as the enqueue time");
}

#[tokio::test]
async fn concurrent_identical_replacements_with_one_key_replay() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let old = req(json!({"dataset": "d", "key": "id", "records": [{"id": 1}]}));
    let old = enqueue(&client, &secret(), &owner("alice"), new_job("old", &old, 5))
        .await
        .unwrap();
    let replacement = req(json!({"dataset": "d", "key": "id", "records": [{"id": 2}],
                                 "replaces": old.id.to_string()}));
    let mut first_client = db.client().await;
    let first_tx = first_client.transaction().await.unwrap();
    let first = enqueue(
        &first_tx,
        &secret(),
        &owner("alice"),
        new_job("new", &replacement, 5),
    )
    .await
    .unwrap();
    let second_client = db.client().await;
    let second = tokio::spawn(async move {
        let mut second_client = second_client;
        let tx = second_client.transaction().await.unwrap();
        let job = new_job("new", &replacement, 5);
        let done = enqueue(&tx, &secret(), &owner("alice"), job).await;
        tx.commit().await.unwrap();
        done.map_err(|e| e.code())
    });
    eventually("the second submission waits on the first", || async {
        // A wait for a transaction's lock names no database: scoped by the waiting backend's.
        count(
            &client,
            "pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE NOT l.granted AND a.datname = current_database()",
        )
        .await
            > 0
    })
    .await;
    first_tx.commit().await.unwrap();
    assert_eq!(
        second.await.unwrap(),
        Ok(Enqueued {
            id: first.id,
            replayed: true
        })
    );
    assert_eq!(count(&client, "etl_jobs").await, 2);
    assert_eq!(
        job_row(&client, old.id).await.failure_code.as_deref(),
        Some("replaced")
    );
}

#[tokio::test]
async fn intake_writes_numbers_exactly_as_postgresql_stores_them() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let texts = [
        "0",
        "-0",
        "-0.00",
        "7",
        "-7",
        "1.0",
        "1.50",
        "-1.50",
        "1e2",
        "1E+2",
        "1e-2",
        "1.5e1",
        "1.50e1",
        "100e-2",
        "0.00e-2",
        "0.001e3",
        "0.0e5",
        "12345678901234567.89",
        "123456789012345678901234567890",
        "1e21",
        "1e-7",
        "-2.5E-3",
        "9.99e38",
        "1e39",
        "1e-38",
        "123.456e-10",
        "5e0",
        "5e-0",
        "18446744073709551616",
    ];
    let stored: Vec<String> = client
        .query(
            "SELECT t::jsonb::text FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
            &[&texts.to_vec()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let ours: Vec<String> = texts
        .iter()
        .map(|t| durable_etl::kinds::etl::transform::canonical_number(t).unwrap())
        .collect();
    assert_eq!(ours, stored);
}
