//! Faults with real processes: replicas of the real binary are SIGKILLed and SIGSTOPped in the
//! middle of a load, and the invariants are checked from the database. The submodules add
//! network faults, PostgreSQL restarts, killed backends, racing migrations, cancellations racing
//! commits, and a job that crashes its replica every time.

mod backends;
mod crashloop;
mod migrate;
mod network;
mod owner;
mod races;
mod restart;

pub use crate::support::until_all_terminal;
use crate::support::{
    count, end_job, eventually, load_owner, signal, spawn_replica, Processes, TestDb, LEDGERS,
    LOAD_SECRET,
};
use durable_etl::digest::Secret;
use durable_etl::intake::IntakeLimits;
use durable_etl::kinds::etl::enqueue::{enqueue, NewJob};
use durable_etl::kinds::etl::request;
use serde_json::json;
use std::process::{Child, Command, Stdio};

/// Starts a worker replica of the real binary on `db` with `args`.
pub fn replica(db: &TestDb, owner: &str, args: &[&str]) -> Child {
    spawn_replica(&db.config.url, owner, args, Stdio::null())
}

/// Seeds target row `k` (through a first job) and returns a session holding it locked, and the
/// id of a second job (of 5 attempts) that updates it.
pub async fn locked_update(
    db: &TestDb,
    client: &tokio_postgres::Client,
) -> (tokio_postgres::Client, uuid::Uuid) {
    locked_update_with(db, client, 5).await
}

/// [`locked_update`] with the update job's `max_attempts`.
pub async fn locked_update_with(
    db: &TestDb,
    client: &tokio_postgres::Client,
    max_attempts: i32,
) -> (tokio_postgres::Client, uuid::Uuid) {
    let secret = Secret::new(LOAD_SECRET).unwrap();
    let owner = load_owner();
    let seed = request::parse(
        &json!({"dataset": "d", "key": "id", "records": [{"id": "k", "v": 0}]}),
        IntakeLimits::default(),
    )
    .unwrap();
    let update = request::parse(
        &json!({"dataset": "d", "key": "id", "records": [{"id": "k", "v": 1}]}),
        IntakeLimits::default(),
    )
    .unwrap();
    let seeded = enqueue(
        client,
        &secret,
        &owner,
        NewJob {
            idempotency_key: "seed",
            request: &seed,
            max_attempts: 5,
            retain: None,
        },
    )
    .await
    .unwrap();
    // The seed is written directly as its load would write it, so no replica is needed for it.
    client
        .execute(
            "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             VALUES ($1::bytea, 'd', 'k', '{\"id\": \"k\", \"v\": 0}', $2)",
            &[&owner.as_slice(), &seeded.id],
        )
        .await
        .unwrap();
    end_job(client, seeded.id, "cancelled", Some("cancelled"), None).await;
    let holder = db.client().await;
    holder
        .batch_execute("BEGIN; SELECT 1 FROM etl_target_rows WHERE record_key = 'k' FOR UPDATE")
        .await
        .unwrap();
    let job = enqueue(
        client,
        &secret,
        &owner,
        NewJob {
            idempotency_key: "update",
            request: &update,
            max_attempts,
            retain: None,
        },
    )
    .await
    .unwrap();
    (holder, job.id)
}

/// Waits until a worker backend waits for a row lock.
pub async fn until_load_waits(client: &tokio_postgres::Client) {
    eventually("a load to wait for the row lock", || async move {
        count(client, "pg_stat_activity WHERE application_name = 'durable-etl/worker' AND wait_event_type = 'Lock' AND datname = current_database()").await == 1
    })
    .await;
}

/// Asserts the job succeeded once: attempts, one ledger row, the row updated.
pub async fn assert_done_once(client: &tokio_postgres::Client, id: uuid::Uuid, attempts: i32) {
    eventually("the job to succeed", || async move {
        count(
            client,
            &format!("etl_jobs WHERE id = '{id}' AND status = 'succeeded'"),
        )
        .await
            == 1
    })
    .await;
    let row = client
        .query_one("SELECT attempts FROM etl_jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), attempts);
    assert_eq!(
        count(
            client,
            &format!("{LEDGERS} AND job_id = '{id}' AND (output ->> 'rows_updated')::int = 1")
        )
        .await,
        1
    );
    assert_eq!(
        count(
            client,
            "etl_target_rows WHERE record_key = 'k' AND record->>'v' = '1'"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_load_is_recovered_at_once_and_the_load_commits_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    // A long lease: only dead-owner detection can free the job quickly.
    let mut replicas = Processes(vec![replica(
        &db,
        "doomed",
        &[
            "--lease",
            "300s",
            "--heartbeat-interval",
            "10s",
            "--lock-timeout",
            "60s",
        ],
    )]);
    until_load_waits(&client).await;
    signal(&replicas.0[0], "KILL");
    let _ = replicas.0[0].wait();
    replicas
        .0
        .push(replica(&db, "survivor", &["--lock-timeout", "60s"]));
    eventually("the survivor to have the job", || {
        let client = &client;
        async move {
            count(client, &format!("etl_job_records WHERE id = '{id}' AND status = 'running' AND lease_owner_id = 'survivor'")).await == 1
        }
    })
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_done_once(&client, id, 2).await;
    signal(&replicas.0[1], "TERM");
    assert_eq!(replicas.0[1].wait().unwrap().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_loses_its_job_and_its_late_commit_matches_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    let frozen_args = [
        "--lease",
        "1s",
        "--heartbeat-interval",
        "300ms",
        "--lock-timeout",
        "60s",
        "--idle-in-transaction-timeout",
        "1s",
    ];
    let mut replicas = Processes(vec![replica(&db, "frozen", &frozen_args)]);
    until_load_waits(&client).await;
    signal(&replicas.0[0], "STOP");
    // The lock goes; the frozen replica's transaction takes it, writes, and then sits idle in
    // transaction until the session timeout ends it, which frees the row.
    holder.batch_execute("ROLLBACK").await.unwrap();
    eventually("the frozen transaction to be ended by the timeout", || {
        let client = &client;
        async move {
            count(client, "pg_stat_activity WHERE application_name = 'durable-etl/worker' AND state LIKE 'idle in transaction%' AND datname = current_database()").await == 0
                && count(client, "etl_job_records WHERE lease_expires_at < now()").await == 1
        }
    })
    .await;
    assert_eq!(
        count(&client, "etl_target_rows WHERE record->>'v' = '1'").await,
        0,
        "the frozen write never committed"
    );
    replicas.0.push(replica(&db, "thawed-peer", &[]));
    assert_done_once(&client, id, 2).await;
    signal(&replicas.0[0], "CONT");
    // The frozen replica wakes with a dead connection and a lost lease: nothing it does changes
    // the job any more. It stops cleanly.
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
    assert_done_once(&client, id, 2).await;
    signal(&replicas.0[1], "TERM");
    assert_eq!(replicas.0[1].wait().unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_second_replica_with_a_live_owner_id_refuses_to_start() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let _first = Processes(vec![replica(&db, "twin", &[])]);
    eventually("the first replica's session", || {
        let client = &client;
        async move {
            count(
                client,
                "pg_stat_activity WHERE application_name = 'durable-etl/session' AND datname = current_database()",
            )
            .await
                == 1
        }
    })
    .await;
    let second = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &db.config.url)
        .args(["work", "--owner-id", "twin"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&second.stderr).contains("[owner_id_in_use]"));
}

/// Waits until `n` replica sessions are connected to this test's database, each with its
/// start-up over: its replica reported (the reporter starts once the start-up release of the
/// previous incarnation's jobs is done) after its session connected. Faults injected earlier
/// would only make the replica fail to start, which is not what these tests are about. (The
/// session's own statements tell nothing: it beats every 100 ms from before the release on.)
pub async fn until_sessions(client: &tokio_postgres::Client, n: i64) {
    eventually(&format!("{n} replica session(s)"), || async move {
        count(
            client,
            "etl_replicas r
               JOIN pg_locks l
                 ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND ((l.classid::bigint << 32) | l.objid::bigint)
                    = durable_etl_owner_lock_key(r.owner_id)
               JOIN pg_stat_activity a
                 ON a.pid = l.pid AND a.application_name = 'durable-etl/session'
              WHERE r.reported_at >= a.backend_start",
        )
        .await
            == n
    })
    .await;
}
