//! The claim cooldown (`WorkerConfig::claim_cooldown`): wakes that come sooner than the cooldown
//! after the last claim wait and are claimed together, and a backlog never waits for it.

use crate::handlers::{Noop, NOOP};
use crate::support::{count, eventually, first_column, insert_jobs, TestDb};
use crate::wake::{config, until_succeeded, Replica};
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A replica running no-op jobs with `slots`, no prefetch, a 60 s poll and `cooldown`, once its
/// start-up claim is back.
async fn started(db: &TestDb, owner: &str, slots: usize, cooldown: Duration) -> Replica {
    let config = WorkerConfig {
        claim_cooldown: cooldown,
        prefetch: 0,
        ..config(owner, Duration::from_secs(60), slots)
    };
    let replica = Replica::start_with(db, config, Registry::new().register(Noop)).await;
    let stats = Arc::clone(&replica.stats);
    eventually("the start-up claim", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().claims >= 1 }
    })
    .await;
    replica
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_enqueued_one_by_one_within_the_cooldown_are_claimed_by_one_claim() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // The start-up claim came back short: the claim that registers the replica as waiting now
    // waits out the cooldown, and every job enqueued meanwhile waits for it.
    let replica = started(&db, "cooling", 16, Duration::from_secs(5)).await;
    for _ in 0..5 {
        insert_jobs(&client, NOOP, &[json!({})], 3).await;
    }
    until_succeeded(&client, 5).await;
    let stats = replica.stats.snapshot();
    replica.stop().await.unwrap();
    let starts: Vec<i64> = first_column(
        &client,
        "SELECT count(DISTINCT started_at) FROM etl_jobs WHERE status = 'succeeded'",
    )
    .await;
    assert_eq!(starts, vec![1], "five enqueues, one claim: {stats:?}");
    assert_eq!(stats.claimed, 5);
    assert_eq!(
        stats.claims - stats.empty_claims,
        1,
        "one claim took jobs: {stats:?}"
    );
    assert_eq!(stats.claimed_by_poll, 0, "the 60 s poll never fired");
    // Every enqueue named the replica (registered by its start-up claim, and still waiting):
    // the first wake's claim waited out the cooldown, and the others joined it.
    assert_eq!(
        (stats.notifications, stats.claims_held),
        (5, 1),
        "{stats:?}"
    );
    assert_eq!(count(&client, "etl_jobs WHERE attempts <> 1").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_as_slots_free_without_waiting_out_the_cooldown() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    insert_jobs(&client, NOOP, &vec![json!({}); 200], 3).await;
    // A cooldown as long as the poll: were a backlog's claims to wait for it, 200 jobs through 4
    // slots would take 50 minutes, far past `until_succeeded`'s bound.
    let replica = started(&db, "draining", 4, Duration::from_secs(60)).await;
    until_succeeded(&client, 200).await;
    let stats = replica.stats.snapshot();
    replica.stop().await.unwrap();
    assert_eq!(stats.claimed, 200, "{stats:?}");
    assert!(
        stats.claims_by_drain >= 200 / 4 - 1,
        "drained as slots freed: {stats:?}"
    );
    assert_eq!(count(&client, "etl_jobs WHERE attempts <> 1").await, 0);
}
