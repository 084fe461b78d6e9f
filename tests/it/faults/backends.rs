//! Killed backends: PostgreSQL terminates a replica's connections (an operator's
//! `pg_terminate_backend`, a failover proxy), the session and the pool alike, or the one backend
//! of an execution transaction.

use super::{
    assert_done_once, locked_update, replica, until_all_terminal, until_load_waits, until_sessions,
};
use crate::support::{
    assert_settled_once, count, enqueue_loads, eventually, job_row, signal, Processes, TestDb,
    LEDGERS,
};

/// Terminates every backend of this test's database whose `application_name` is `app` (a SQL
/// LIKE pattern); returns how many.
pub async fn terminate(client: &tokio_postgres::Client, app: &str) -> i64 {
    client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0)
}

/// The pid of this test database's replica session, if one is connected.
async fn session(client: &tokio_postgres::Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'durable-etl/session'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Three times over, every backend of a replica (session and pool) is terminated; each time,
/// jobs enqueued after its new session appears are picked up and run once, with the poll
/// interval far beyond the test's bound, so only the re-established LISTEN (or the catch-up
/// claim after the reconnect) can find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_backends_are_all_terminated_reconnects_and_picks_up_new_jobs() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut replicas = Processes(vec![replica(
        &db,
        "terminated",
        &["--poll-interval", "120s"],
    )]);
    until_sessions(&client, 1).await;
    for round in 0..3 {
        let old = session(&client).await;
        assert!(terminate(&client, "durable-etl/%").await >= 1);
        eventually("a new session", || {
            let client = &client;
            async move { session(client).await.is_some_and(|pid| Some(pid) != old) }
        })
        .await;
        enqueue_loads(&client, &format!("round{round}"), 10, 2, 5).await;
        until_all_terminal(&client).await;
    }
    assert_settled_once(&client, 60).await;
    assert_eq!(
        count(&client, "etl_jobs WHERE attempts <> 1").await,
        0,
        "every job ran once"
    );
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
}

/// The backend of an execution transaction, blocked on a row lock, is terminated: nothing it
/// wrote commits, the attempt is not charged (the infrastructure's fault, not the job's), and the
/// computed load commits again under the same claim, once, when the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_backend_terminated_mid_transaction_loses_nothing_and_duplicates_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    let mut replicas = Processes(vec![replica(
        &db,
        "bereaved",
        &["--lock-timeout", "60s", "--retry-min-delay", "50ms"],
    )]);
    until_load_waits(&client).await;
    let claim = job_row(&client, id).await.lease_claim_id;
    let killed: i64 = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'durable-etl/worker'
                AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1);
    // The load commits again under the same claim, on a new backend, and waits for the same lock.
    until_load_waits(&client).await;
    let row = job_row(&client, id).await;
    assert_eq!(
        (row.status.as_str(), row.attempts, row.lease_claim_id),
        ("running", 1, claim)
    );
    assert_eq!(count(&client, LEDGERS).await, 0);
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_done_once(&client, id, 1).await;
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
}
