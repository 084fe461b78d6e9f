//! The prefetch buffer: jobs claimed ahead of free slots are leased, renewed, started as slots
//! free, released (attempt not charged) when they wait too long or when the replica stops, and
//! a claim still in flight at shutdown is released too; idle replicas share a burst; a replica
//! that dies with jobs in its buffer leaves each to run once elsewhere. A replica
//! claims ahead only once it has been starting jobs: the tests of a buffer first drain no-op jobs
//! through its one slot, which sets the start rate that the jobs after them are claimed ahead by.

use crate::handlers::{Noop, Scripted, NOOP, SCRIPTED};
use crate::support::{count, eventually, insert_jobs, job_row, pool, TestDb};
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use durable_etl::shutdown::{self, Stage};
use durable_etl::worker::Worker;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Semaphore;

/// One slot and a deep buffer (the claims that reach the test's jobs after a warm-up have room
/// to spare, so they take them all while the start rate is high), a short lease renewed every
/// 100 ms, no poll to speak of: every claim after the first is caused by the test.
fn one_slot(owner: &str) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots: 1,
        prefetch: 64,
        poll_interval: Duration::from_secs(60),
        lease: Duration::from_secs(1),
        heartbeat_interval: Duration::from_millis(100),
        shutdown_grace: Duration::ZERO,
        ..WorkerConfig::default()
    }
}

/// Starts a replica on `db` running `scripted` and no-op jobs.
async fn start(db: &TestDb, config: WorkerConfig, scripted: Scripted) -> Worker {
    let registry = Registry::new().register(Noop).register(scripted);
    Worker::start(pool(db).await, &db.config, config, registry)
        .await
        .unwrap()
}

/// No-op jobs that run first and set the replica's start rate.
const WARM_UP: usize = 200;

/// When job `id`'s lease expires.
async fn lease_expiry(client: &tokio_postgres::Client, id: uuid::Uuid) -> SystemTime {
    client
        .query_one(
            "SELECT lease_expires_at FROM etl_job_records WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

/// A one-slot replica running behind a warm-up: four scripted jobs doing `action` follow
/// [`WARM_UP`] no-op jobs; the first of them holds its slot at `gate` once it starts.
struct Gated {
    /// Opens the scripted jobs' handler.
    gate: Arc<Semaphore>,
    /// The handler (its `prepares` counts starts).
    scripted: Scripted,
    /// The four scripted jobs, in claim order.
    ids: Vec<uuid::Uuid>,
    /// The replica's counters.
    stats: Arc<durable_etl::worker::stats::WorkerStats>,
    /// Asks the replica to stop.
    trigger: shutdown::Trigger,
    /// The replica's `run`.
    run: tokio::task::JoinHandle<Result<(), durable_etl::error::Error>>,
}

/// Starts [`Gated`] as `owner` and waits until its first scripted job has started and the other
/// three wait in its buffer.
async fn gated(db: &TestDb, client: &tokio_postgres::Client, owner: &str, action: &str) -> Gated {
    let (gate, scripted) = Scripted::gated();
    insert_jobs(client, NOOP, &vec![json!({}); WARM_UP], 3).await;
    let ids = insert_jobs(client, SCRIPTED, &vec![json!({ "do": action }); 4], 3).await;
    let worker = start(db, one_slot(owner), scripted.clone()).await;
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("the first scripted job to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    // The other three are claimed ahead by the claim that took the first, or else by the next
    // wake while the start rate is still high: a notification makes sure there is one.
    eventually("the other three to be claimed ahead", || {
        let stats = Arc::clone(&stats);
        async move {
            let claimed = stats.snapshot().claimed == WARM_UP as u64 + 4;
            if !claimed {
                client
                    .batch_execute(&format!("NOTIFY {}", durable_etl::jobs::notifier::CHANNEL))
                    .await
                    .unwrap();
            }
            claimed
        }
    })
    .await;
    Gated {
        gate,
        scripted,
        ids,
        stats,
        trigger,
        run,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_claimed_ahead_are_leased_renewed_started_in_order_and_released_at_shutdown() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let Gated {
        gate,
        scripted,
        ids,
        stats,
        trigger,
        run,
    } = gated(&db, &client, "ahead", "ok").await;
    // Claimed ahead while the no-op jobs ran: one runs, three wait leased to this owner, their
    // attempt charged.
    // (The last no-op jobs may still be committing: their slot freed when they computed.)
    eventually("the no-op jobs to commit", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().succeeded == WARM_UP as u64 }
    })
    .await;
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE status = 'running' AND lease_owner_id = 'ahead' AND attempts = 1"
        )
        .await,
        4
    );
    // A waiting job's lease is renewed by the heartbeat like a running one's.
    let waiting = ids[3];
    let first = lease_expiry(&client, waiting).await;
    eventually("a heartbeat to renew a waiting job's lease", || {
        let client = &client;
        async move { lease_expiry(client, waiting).await > first }
    })
    .await;
    // A freed slot starts the next waiting job, in claim order, under the claim it waited with.
    let second_claim = job_row(&client, ids[1]).await.lease_claim_id;
    assert!(second_claim.is_some());
    gate.add_permits(1);
    eventually("the second job to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 2 }
    })
    .await;
    let first_job = ids[0];
    eventually("the first job to commit", || {
        let client = &client;
        async move { job_row(client, first_job).await.status == "succeeded" }
    })
    .await;
    let second = job_row(&client, ids[1]).await;
    assert_eq!(
        (
            second.status.as_str(),
            second.attempts,
            second.lease_claim_id
        ),
        ("running", 1, second_claim)
    );
    // Stopping releases the running job and the waiting ones, none charged an attempt.
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    for id in &ids[1..] {
        let row = job_row(&client, *id).await;
        assert_eq!(
            (row.status.as_str(), row.attempts, row.lease_cleared),
            ("pending", 0, true)
        );
    }
    assert_eq!(stats.snapshot().released, 3);
    // Only the job whose handler had started has an attempt in its history; the buffered ones
    // never started one.
    assert_eq!(released_attempts(&client, &ids[1..]).await, [1, 0, 0]);
}

/// How many `released` attempts the history holds for each of `ids`.
async fn released_attempts(client: &tokio_postgres::Client, ids: &[uuid::Uuid]) -> Vec<i64> {
    let mut counts = Vec::new();
    for id in ids {
        let sql = format!("etl_job_attempts WHERE job_id = '{id}' AND ending = 'released'");
        counts.push(count(client, &sql).await);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_waits_longer_than_the_hold_is_released_for_another_replica() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let warm_up = WARM_UP;
    insert_jobs(&client, NOOP, &vec![json!({}); warm_up], 3).await;
    let mut ids = insert_jobs(&client, SCRIPTED, &[json!({"do": "hang"})], 3).await;
    ids.extend(insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await);
    let scripted = Scripted::default();
    let worker = start(&db, one_slot("hoarder"), scripted.clone()).await;
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("the hanging job to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    // Another replica, idle: everything due is claimed already, and its poll is a minute away.
    let other = start(&db, one_slot("idle"), Scripted::default()).await;
    let (other_trigger, other_shutdown) = shutdown::manual();
    let other_run = tokio::spawn(other.run(other_shutdown));
    eventually("the two jobs behind it to be claimed ahead", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().claimed == warm_up as u64 + 3 }
    })
    .await;
    // Behind a job that never ends, the two waiting jobs go back, uncharged, within the hold.
    eventually("the waiting jobs to be released", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().released == 2 }
    })
    .await;
    // The idle replica, whose poll is a minute away, is told: it runs each on its first attempt
    // (the release refunded the hoarder's).
    let released = format!(
        "etl_jobs WHERE status = 'succeeded' AND id IN ('{}', '{}')",
        ids[1], ids[2]
    );
    eventually("the released jobs to run elsewhere", || {
        let (client, released) = (&client, released.clone());
        async move { count(client, &released).await == 2 }
    })
    .await;
    for id in &ids[1..] {
        let row = job_row(&client, *id).await;
        assert_eq!((row.status.as_str(), row.attempts), ("succeeded", 1));
    }
    other_trigger.request(Stage::Draining);
    other_run.await.unwrap().unwrap();
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    assert_eq!(job_row(&client, ids[0]).await.status, "pending");
    // Released from the buffer, never started: no attempt in their history. The hanging job,
    // released at shutdown, had started one.
    assert_eq!(released_attempts(&client, &ids).await, [1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_at_shutdown_is_held_and_released() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let worker = start(&db, one_slot("stopping"), Scripted::default()).await;
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("the start-up claim", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().claims == 1 }
    })
    .await;
    // Jobs the replica is not told about, then a lock that makes its next claim wait.
    let quiet = client.transaction().await.unwrap();
    quiet
        .batch_execute("SET LOCAL durable_etl.notify = 'off'")
        .await
        .unwrap();
    let ids = insert_jobs(&quiet, NOOP, &[json!({}), json!({})], 3).await;
    quiet.commit().await.unwrap();
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE etl_job_records IN EXCLUSIVE MODE")
        .await
        .unwrap();
    client
        .batch_execute(&format!("NOTIFY {}", durable_etl::jobs::notifier::CHANNEL))
        .await
        .unwrap();
    eventually("the claim to wait for the lock", || {
        let client = &client;
        async move {
            // The claim (of an uncapped queue: the one without permits), as `pg_stat_activity`
            // shows it: its first `track_activity_query_size` bytes (the claim is longer than
            // the default 1,024).
            let waiting: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE wait_event_type = 'Lock' AND datname = current_database()
                        AND left($1::text, length(query)) = query",
                    &[&durable_etl::worker::claimer::CLAIM_UNCAPPED_SQL],
                )
                .await
                .unwrap()
                .get(0);
            waiting == 1
        }
    })
    .await;
    // Stopping now: the claim comes back after the lock goes, and what it took is released. (An
    // idle replica claims only for its free slot: one job.)
    trigger.request(Stage::Draining);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!run.is_finished(), "the replica waits for its claim");
    locker.batch_execute("COMMIT").await.unwrap();
    run.await.unwrap().unwrap();
    let snapshot = stats.snapshot();
    assert_eq!(
        (snapshot.claimed, snapshot.released, snapshot.succeeded),
        (1, 1, 0),
        "{snapshot:?}"
    );
    for id in ids {
        let row = job_row(&client, id).await;
        assert_eq!(
            (row.status.as_str(), row.attempts, row.lease_cleared),
            ("pending", 0, true)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_replicas_share_a_burst_instead_of_one_claiming_it_ahead() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (gate, scripted) = Scripted::gated();
    let mut runs = Vec::new();
    for owner in ["share-a", "share-b"] {
        let config = WorkerConfig {
            slots: 4,
            prefetch: 64,
            ..one_slot(owner)
        };
        let worker = start(&db, config, scripted.clone()).await;
        let (trigger, shutdown) = shutdown::manual();
        runs.push((trigger, tokio::spawn(worker.run(shutdown))));
    }
    insert_jobs(&client, SCRIPTED, &vec![json!({"do": "ok"}); 16], 3).await;
    eventually("both replicas to fill their slots", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 8 }
    })
    .await;
    // Neither claimed ahead of its free slots: four each, the other eight still pending.
    for owner in ["share-a", "share-b"] {
        assert_eq!(
            count(
                &client,
                &format!("etl_job_records WHERE status = 'running' AND lease_owner_id = '{owner}'"),
            )
            .await,
            4
        );
    }
    assert_eq!(
        count(&client, "etl_job_records WHERE status = 'pending'").await,
        8
    );
    gate.add_permits(16);
    eventually("every job to succeed", || {
        let client = &client;
        async move { count(client, "etl_jobs WHERE status = 'succeeded'").await == 16 }
    })
    .await;
    for (trigger, run) in runs {
        trigger.request(Stage::Draining);
        run.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_with_jobs_in_its_buffer_leaves_each_to_run_once_elsewhere() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let Gated {
        gate,
        ids,
        stats,
        trigger,
        run,
        ..
    } = gated(&db, &client, "doomed", "write").await;
    // One write job computes (held at its gate); the other three wait in the buffer.
    assert_eq!(stats.snapshot().claimed, WARM_UP as u64 + 4);
    // The replica dies: its tasks, heartbeats, session and owner lock go at once. Its trigger
    // lives on until then: a replica whose every trigger is gone starts a graceful shutdown,
    // which would give the jobs back itself, racing the abort.
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    drop(trigger);
    let heir = start(
        &db,
        WorkerConfig {
            slots: 4,
            ..one_slot("heir")
        },
        Scripted::default(),
    )
    .await;
    // Recovered as a dead owner's (its lock gone, its leases unrenewed), or as expired leases if
    // the second-long lease ran out first on a slow machine: either way, back to pending.
    let mut recovered = 0;
    for _ in 0..200 {
        let pass = heir.recover().await.unwrap();
        recovered += pass.dead_owner + pass.expired;
        if recovered == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(recovered, 4, "the running job and the three buffered ones");
    let done = heir.step().await.unwrap();
    assert_eq!(done.len(), 4);
    // Each ran to its end once, on its second attempt (the dead claim charged the buffered jobs
    // too: it could not know they never started), and wrote its row once.
    for id in ids {
        let row = job_row(&client, id).await;
        assert_eq!((row.status.as_str(), row.attempts), ("succeeded", 2));
    }
    assert_eq!(count(&client, "etl_target_rows").await, 4);
    gate.add_permits(1);
}
