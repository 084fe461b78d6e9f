//! Claim sessions behind poolers, on direct connections of the shared template harness: behind a
//! transaction-mode pooler nothing is prepared or set on the session and each claim sets its
//! planner switches in its own transaction; behind a session-mode pooler (which drops start-up
//! options) the session sets them itself.

use super::capped::CappedQueues;
use super::plan_check::*;
use super::session::*;
use super::statement::*;
use super::tests::{with_jobs, CLAIMANT};
use crate::config::Pooler;
use crate::db;
use crate::queue::DEFAULT_QUEUE;
use crate::worker::stats::WorkerStats;
use tokio_postgres::{Client, NoTls};

/// A claim session opened as behind `pooler`, on a new connection of `config`.
async fn session_behind(
    config: &tokio_postgres::Config,
    stats: &WorkerStats,
    pooler: Pooler,
) -> ClaimSession {
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    ClaimSession::open(client, stats, pooler).await.unwrap()
}

/// The session's value of the setting `name`.
async fn setting(client: &Client, name: &str) -> String {
    client
        .query_one("SELECT current_setting($1)", &[&name])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn behind_a_transaction_pooler_claims_set_their_switches_locally_and_prepare_nothing() {
    let (db, _) = with_jobs(3).await;
    // A connection without the claim's start-up options, as a transaction pooler gives.
    let config = db::pg_config(&db.config, "claimer").unwrap();
    let stats = WorkerStats::default();
    let session = session_behind(&config, &stats, Pooler::Transaction).await;
    assert!(!session.is_prepared());
    let capped = CappedQueues::default();
    let first = session
        .claim(CLAIMANT, &[(DEFAULT_QUEUE, 2)], &capped)
        .await;
    assert_eq!(first.unwrap().jobs.len(), 2);
    // A queue known to be capped takes the claim with permits, also in its own transaction.
    capped.learn([DEFAULT_QUEUE]);
    let second = session
        .claim(CLAIMANT, &[(DEFAULT_QUEUE, 5)], &capped)
        .await;
    assert_eq!(second.unwrap().jobs.len(), 1);
    let due = session.next_due(&[DEFAULT_QUEUE], &["test"]).await.unwrap();
    assert!(due.is_some_and(|d| d.as_secs() > 3000));
    let client = session.client();
    assert_eq!(
        crate::test_db::named_statements(client).await,
        0,
        "nothing prepared by name"
    );
    for (name, server_default) in [("enable_sort", "on"), ("jit", "on")] {
        assert_eq!(
            setting(client, name).await,
            server_default,
            "{name} left set"
        );
    }
    assert_eq!(
        setting(client, "transaction_isolation").await,
        "read committed"
    );
    assert_eq!(
        stats.snapshot().claim_plan_fallbacks,
        0,
        "its plan passed the check"
    );
}

#[tokio::test]
async fn a_failed_claim_in_its_own_transaction_rolls_back_and_leaves_the_session_usable() {
    let (db, _) = with_jobs(2).await;
    let short = crate::config::DatabaseConfig {
        lock_timeout: std::time::Duration::from_millis(100),
        ..db.config.clone()
    };
    let config = db::pg_config(&short, "claimer").unwrap();
    let stats = WorkerStats::default();
    let session = session_behind(&config, &stats, Pooler::Transaction).await;
    // Another session holds the job table: the claim gives up at its lock timeout.
    let mut holder = db.client().await;
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE etl_job_records IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let capped = CappedQueues::default();
    let refused = session
        .claim(CLAIMANT, &[(DEFAULT_QUEUE, 5)], &capped)
        .await;
    let code = refused.err().and_then(|e| e.code().cloned());
    assert_eq!(
        code,
        Some(tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
    );
    lock.rollback().await.unwrap();
    // Its transaction ended with it (not left aborted), and nothing was claimed.
    let again = session
        .claim(CLAIMANT, &[(DEFAULT_QUEUE, 5)], &capped)
        .await;
    assert_eq!(again.unwrap().jobs.len(), 2);
    assert_eq!(setting(session.client(), "enable_sort").await, "on");
}

#[tokio::test]
async fn behind_a_session_pooler_the_session_sets_its_switches_and_prepares_its_claims() {
    let (db, _) = with_jobs(2).await;
    // No start-up options, as a session pooler with `ignore_startup_parameters` gives.
    let config = db::pg_config(&db.config, "claimer").unwrap();
    let stats = WorkerStats::default();
    let session = session_behind(&config, &stats, Pooler::Session).await;
    assert!(session.is_prepared());
    let client = session.client();
    for name in ["enable_sort", "enable_bitmapscan", "enable_hashjoin", "jit"] {
        assert_eq!(setting(client, name).await, "off", "{name}");
    }
    assert_eq!(
        setting(client, "plan_cache_mode").await,
        "force_generic_plan"
    );
    let claimed = session
        .claim(CLAIMANT, &[(DEFAULT_QUEUE, 5)], &CappedQueues::default())
        .await
        .unwrap();
    assert_eq!(claimed.jobs.len(), 2);
    assert!(
        crate::test_db::named_statements(client).await >= 3,
        "the claims and next-due prepared"
    );
}

#[tokio::test]
async fn the_planned_claims_of_a_transaction_pooler_walk_the_pending_index() {
    let (db, _) = with_jobs(5).await;
    let config = db::pg_config(&db.config, "claimer").unwrap();
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    for sql in [CLAIM_SQL, CLAIM_UNCAPPED_SQL] {
        let plan = explain_planned(&client, sql).await.unwrap();
        assert!(walks_the_pending_index_in_order(&plan), "{plan}");
    }
    // The switches were LOCAL to the explain's transaction.
    assert_eq!(setting(&client, "enable_sort").await, "on");
}

#[tokio::test]
async fn behind_a_transaction_pooler_a_replica_registers_with_unnamed_presence_statements() {
    use crate::worker::liveness::presence::{self, Change};
    let (db, _) = with_jobs(0).await;
    let config = db::pg_config(&db.config, "claimer").unwrap();
    let stats = WorkerStats::default();
    let session = session_behind(&config, &stats, Pooler::Transaction).await;
    let (queues, kinds) = ([DEFAULT_QUEUE], ["test"]);
    let change = Change::Register(vec![DEFAULT_QUEUE.to_owned()]);
    let sent = presence::send(
        session.client(),
        session.presence(),
        &change,
        "waiting",
        (&queues, &kinds),
        42,
    );
    assert!(
        sent.await.unwrap().is_empty(),
        "no enqueue held the barrier"
    );
    let token: i64 = db
        .client()
        .await
        .query_one(
            "SELECT wake_token FROM etl_waiting_replicas WHERE owner_id = 'waiting'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(token, 42);
    assert_eq!(crate::test_db::named_statements(session.client()).await, 0);
}
