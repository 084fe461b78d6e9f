//! ETL loads applied together (`Apply::apply_set`) against the same loads one by one: the
//! same target rows and the same ledger per job, with jobs that write each other's keys; and a
//! worker's batch mixing valid loads, an invalid one and two writing the same key.

use crate::etl::{etl_worker, new_job, owner, req, secret};
use crate::support::{count, first_column_of, insert_jobs, TestDb};
use durable_etl::job::handler::Output;
use durable_etl::kinds::etl::enqueue::enqueue_many;
use durable_etl::kinds::etl::load::{plan, Load};
use durable_etl::kinds::etl::{Ledger, KIND};
use durable_etl::worker::completer::Transition;
use durable_etl::{Apply, JobContext};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_postgres::Client;

/// The loads of `payloads`, planned for jobs inserted for them (so their rows' writers exist).
async fn loads(client: &Client, payloads: &[Value]) -> Vec<Load> {
    let ids = insert_jobs(client, KIND, payloads, 5).await;
    ids.iter()
        .zip(payloads)
        .map(|(&id, payload)| plan(&context(id), payload).unwrap())
        .collect()
}

/// The context of a claim of job `id`, owned by `alice`.
fn context(id: uuid::Uuid) -> JobContext {
    JobContext {
        id,
        kind: KIND.into(),
        lease_claim_id: uuid::Uuid::new_v4(),
        fencing_token: 1,
        attempt: 1,
        max_attempts: 5,
        owner_key: owner("alice").to_vec(),
        run_at: chrono::Utc::now(),
        lease_lost: durable_etl::job::handler::LeaseLost::default(),
        recorded: Default::default(),
    }
}

/// A load of `records` into dataset `d`, keyed by `id`.
fn payload(records: Value) -> Value {
    json!({"dataset": "d", "key": "id", "records": records})
}

/// Every target row: dataset, key, record and writer (not `updated_at`), in key order.
async fn rows(client: &impl tokio_postgres::GenericClient) -> Vec<String> {
    first_column_of(
        client
            .query(
                "SELECT concat_ws(' ', dataset, record_key, record::text, written_by_job::text)
                   FROM etl_target_rows ORDER BY dataset, record_key",
                &[],
            )
            .await
            .unwrap(),
    )
}

/// Applies `loads` one by one, then as one set, each in a transaction rolled back after; returns
/// (ledgers, rows) of each way.
async fn both_ways(client: &mut Client, loads: &[Load]) -> [(Vec<Option<Output>>, Vec<String>); 2] {
    let tx = client.transaction().await.unwrap();
    let mut alone = Vec::new();
    for load in loads {
        let job = context(uuid::Uuid::nil());
        load.clone().apply(&tx, &job).await.unwrap();
        alone.push(job.recorded.get());
    }
    let alone_rows = rows(&tx).await;
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let together = apply_set(&tx, loads).await.unwrap();
    let together_rows = rows(&tx).await;
    tx.rollback().await.unwrap();
    [(alone, alone_rows), (together, together_rows)]
}

/// Applies `loads` as one set on `tx`; returns what each recorded.
async fn apply_set(
    tx: &tokio_postgres::Transaction<'_>,
    loads: &[Load],
) -> Result<Vec<Option<Output>>, durable_etl::JobError> {
    let jobs: Vec<JobContext> = loads.iter().map(|_| context(uuid::Uuid::nil())).collect();
    let mut copies = loads.to_vec();
    Load::apply_set(tx, copies.iter_mut().zip(&jobs).collect()).await?;
    Ok(jobs.iter().map(|job| job.recorded.get()).collect())
}

#[tokio::test]
async fn loads_applied_together_write_the_same_rows_and_ledgers_as_one_by_one() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let batch = loads(
        &client,
        &[
            payload(json!([{"id": 1, "v": "a"}, {"id": 2, "v": "a"}, {"id": 8, "v": "x"}])),
            payload(json!([{"id": 3, "v": "a"}])),
            // Changes 2 (the first job's), leaves 1 as the first wrote it.
            payload(json!([{"id": 2, "v": "b"}, {"id": 1, "v": "a"}])),
            // Changes 2 again (after the third), and the rows already there.
            payload(json!([{"id": 2, "v": "c"}, {"id": 9, "v": "same"}, {"id": 10, "v": "new"}])),
            json!({"dataset": "e", "key": "id", "records": [{"id": 2, "v": "other dataset"}]}),
        ],
    )
    .await;
    // Rows already there: 9 as the fourth job writes it, 10 otherwise.
    let before = &loads(
        &client,
        &[payload(
            json!([{"id": 9, "v": "same"}, {"id": 10, "v": "old"}]),
        )],
    )
    .await[0];
    let tx = client.transaction().await.unwrap();
    before
        .clone()
        .apply(&tx, &context(uuid::Uuid::nil()))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let [(alone, alone_rows), (together, together_rows)] = both_ways(&mut client, &batch).await;
    assert_eq!(together, alone);
    assert_eq!(together_rows, alone_rows);
    let counts: Vec<(i32, i32, i32)> = together
        .iter()
        .map(|l| {
            let l: Ledger = serde_json::from_value(l.clone().unwrap()).unwrap();
            (l.rows_inserted, l.rows_updated, l.rows_unchanged)
        })
        .collect();
    assert_eq!(
        counts,
        [(3, 0, 0), (1, 0, 0), (0, 1, 1), (0, 2, 1), (1, 0, 0)]
    );
    for (ledger, load) in together.iter().zip(&batch) {
        let ledger: Ledger = serde_json::from_value(ledger.clone().unwrap()).unwrap();
        assert_eq!(ledger.checksum, hex::encode(load.checksum()));
    }
    // Nothing stayed of either way.
    assert_eq!(count(&client, "etl_target_rows").await, 2);
}

#[tokio::test]
async fn a_set_fails_whole_on_a_row_it_cannot_lock() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let loads = loads(
        &client,
        &[payload(json!([{"id": 1}])), payload(json!([{"id": 2}]))],
    )
    .await;

    // Another session holds row 2: the set's statement times out, for the worker's savepoint
    // to take back whole (row 1 included).
    let other = db.client().await;
    other
        .batch_execute(&format!(
            "BEGIN; INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             VALUES ('\\x{}', 'd', '2', '{{}}', '{}')",
            hex::encode(owner("alice")),
            insert_jobs(&client, KIND, &[json!({})], 5).await[0]
        ))
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '100ms'")
        .await
        .unwrap();
    let timed_out = apply_set(&tx, &loads).await;
    assert_eq!(
        timed_out.unwrap_err().to_string(),
        "database error in effects"
    );
}

#[tokio::test]
async fn a_workers_batch_of_valid_invalid_and_same_key_loads_ends_as_one_by_one() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let worker = etl_worker(&db, "sets", Duration::from_secs(5)).await;
    let requests = [
        req(
            json!({"dataset": "d", "key": "id", "records": [{"id": "a1", "n": "1"}, {"id": "a2", "n": "2"}],
                   "transform": {"cast": {"n": "integer"}}}),
        ),
        // Its second record fails its cast: the job fails alone and writes nothing.
        req(
            json!({"dataset": "d", "key": "id", "records": [{"id": "b1", "n": "1"}, {"id": "b2", "n": "x"}],
                   "transform": {"cast": {"n": "integer"}}}),
        ),
        // Writes a2 as the first job does: whichever runs second finds it unchanged.
        req(
            json!({"dataset": "d", "key": "id", "records": [{"id": "a2", "n": "2"}, {"id": "c1", "n": "3"}],
                   "transform": {"cast": {"n": "integer"}}}),
        ),
        req(
            json!({"dataset": "d", "key": "id", "records": [{"id": "d1", "n": "4"}],
                   "transform": {"cast": {"n": "integer"}}}),
        ),
    ];
    let jobs: Vec<_> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("k{i}"), r))
        .collect();
    let new_jobs: Vec<_> = jobs.iter().map(|(k, r)| new_job(k, r, 1)).collect();
    let enqueued = enqueue_many(&client, &secret(), &owner("alice"), &new_jobs)
        .await
        .unwrap();
    let mut ended = worker.step().await.unwrap();
    ended.sort_by_key(|(id, _)| enqueued.iter().position(|e| e.id == *id));
    let transitions: Vec<&Transition> = ended.iter().map(|(_, t)| t).collect();
    assert_eq!(
        transitions,
        [
            &Transition::Succeeded,
            &Transition::Failed(durable_etl::codes::Code::RecordInvalid),
            &Transition::Succeeded,
            &Transition::Succeeded
        ]
    );
    assert_eq!(
        rows(&client)
            .await
            .iter()
            .map(|r| r.split(' ').nth(1).unwrap())
            .collect::<Vec<_>>(),
        ["a1", "a2", "c1", "d1"]
    );
    let ledgers = client
        .query(
            "SELECT o.job_id, (o.output ->> 'rows_inserted')::int, (o.output ->> 'rows_updated')::int,
                    (o.output ->> 'rows_unchanged')::int, decode(o.output ->> 'checksum', 'hex')
               FROM etl_job_outcomes o WHERE o.status = 'succeeded'",
            &[],
        )
        .await
        .unwrap();
    let (mut inserted, mut unchanged) = (0, 0);
    for row in &ledgers {
        let at = enqueued
            .iter()
            .position(|e| e.id == row.get::<_, uuid::Uuid>(0))
            .unwrap();
        // The checksum the job's load would have had alone.
        let alone = plan(&context(enqueued[at].id), &requests[at].to_value()).unwrap();
        assert_eq!(row.get::<_, Vec<u8>>(4), alone.checksum(), "job {at}");
        assert_eq!(row.get::<_, i32>(2), 0, "job {at}: nothing to update");
        inserted += row.get::<_, i32>(1);
        unchanged += row.get::<_, i32>(3);
    }
    assert_eq!((ledgers.len(), inserted, unchanged), (3, 4, 1));
}
