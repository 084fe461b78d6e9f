//! Tests of the rescuer: its cadence, and the reachability it judges by.

use crate::config::WorkerConfig;
use crate::job::handler::Registry;
use crate::test_db::TestDb;
use crate::worker::liveness::session::Signals;
use crate::worker::shared::Shared;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn recovery_runs_twice_per_poll_interval() {
    assert_eq!(
        super::rescue_interval(Duration::from_secs(1)),
        Duration::from_millis(500)
    );
}

/// A replica's reachability is whole until a recovery pass of its own fails, and then counts
/// from that failure; a pass that succeeds does not reset it (only time does).
#[tokio::test]
async fn reachability_shrinks_only_when_a_recovery_pass_of_the_replica_fails() {
    let db = TestDb::migrated().await;
    let shared = crate::worker::shared::for_tests(&db.config, "reachability").await;
    let now = Instant::now();
    assert_eq!(shared.reachable_for(now), Duration::MAX);
    super::pass(&shared).await.unwrap();
    assert_eq!(shared.reachable_for(Instant::now()), Duration::MAX);

    let client = crate::db::connect(&db.config, "test").await.unwrap();
    client
        .batch_execute("ALTER TABLE etl_job_records RENAME TO gone")
        .await
        .unwrap();
    let before = Instant::now();
    assert!(super::pass(&shared).await.is_err());
    let after = Instant::now();
    let later = after + Duration::from_secs(7);
    let reachable = shared.reachable_for(later);
    assert!(reachable >= Duration::from_secs(7), "{reachable:?}");
    assert!(reachable <= later - before, "{reachable:?}");

    client
        .batch_execute("ALTER TABLE gone RENAME TO etl_job_records")
        .await
        .unwrap();
    super::pass(&shared).await.unwrap();
    assert!(shared.reachable_for(later) <= later - before);
}

/// The session's loss counts as the replica's own: the later of the two bounds reachability.
#[tokio::test]
async fn a_lost_session_shrinks_reachability_too() {
    let db = TestDb::migrated().await;
    let pool = crate::db::connect_pool(&db.config, "test").await.unwrap();
    let signals = Arc::new(Signals::default());
    let shared = Shared::open(
        pool,
        &db.config,
        WorkerConfig::default(),
        Registry::default(),
        Arc::default(),
        Some(Arc::clone(&signals)),
        None,
    )
    .await
    .unwrap();
    assert_eq!(shared.reachable_for(Instant::now()), Duration::MAX);
    shared.lost_the_database();
    let own = Instant::now();
    std::thread::sleep(Duration::from_millis(20));
    signals.lost_now();
    let session = Instant::now();
    let later = session + Duration::from_secs(3);
    let reachable = shared.reachable_for(later);
    assert!(
        reachable <= later - own - Duration::from_millis(20),
        "{reachable:?}"
    );
    assert!(reachable >= Duration::from_secs(3), "{reachable:?}");
}
