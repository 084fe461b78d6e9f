//! The worker lifecycle against real PostgreSQL: claims, fencing, atomic execution, retries,
//! failures, recovery of dead and expired owners, heartbeats and shutdown.

use crate::handlers::{Noop, Scripted, NOOP, SCRIPTED};
use crate::support::{count, end_job, eventually, insert_jobs, job_row, pool, TestDb, LEDGERS};
use durable_etl::codes::Code;
use durable_etl::config::WorkerConfig;
use durable_etl::error::Error;
use durable_etl::job::handler::Registry;
use durable_etl::queue::{ServedQueue, DEFAULT_QUEUE};
use durable_etl::shutdown::{self, Stage};
use durable_etl::worker::completer::{self, Transition};
use durable_etl::worker::{claimer, heartbeat, Worker};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A test configuration: fast timers, small grace.
fn config(owner: &str) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots: 8,
        prefetch: durable_etl::config::PREFETCH_DEFAULT,
        poll_interval: Duration::from_millis(50),
        claim_cooldown: Duration::ZERO,
        lease: Duration::from_secs(3),
        heartbeat_interval: Duration::from_millis(200),
        execution_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_millis(300),
        retry_min_delay: Duration::from_millis(100),
        retry_max_delay: Duration::from_secs(1),
        metrics_listen: None,
        poll_only: false,
        session_database_url: None,
        queues: vec![ServedQueue::new(DEFAULT_QUEUE)],
    }
}

/// A lock-backed claimant that is not a running replica (a stalled or crashed one).
fn claimant(owner_id: &str, lease_secs: u64) -> claimer::Claimant<'_> {
    claimer::Claimant {
        owner_id,
        owner_locked: true,
        lease: Duration::from_secs(lease_secs),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    }
}

/// A registry with the test handlers.
fn registry(scripted: Scripted) -> Registry {
    Registry::new().register(Noop).register(scripted)
}

/// Starts a worker on `db` with `owner`, `config` tweaks and `scripted`.
async fn start(db: &TestDb, config: WorkerConfig, scripted: Scripted) -> Worker {
    Worker::start(pool(db).await, &db.config, config, registry(scripted))
        .await
        .unwrap()
}

/// Replica A stepping one `write` job, held inside its handler until `gate` gets a permit.
struct Stalled {
    /// The job.
    id: uuid::Uuid,
    /// Opens A's handler.
    gate: Arc<Semaphore>,
    /// A's step, with A's counters once it ends.
    step: tokio::task::JoinHandle<(
        Vec<(uuid::Uuid, Transition)>,
        durable_etl::worker::stats::StatsSnapshot,
    )>,
}

/// Enqueues one `write` job and starts replica A (configured by `cfg`) on it, returning once A is
/// inside its handler.
async fn stalled_replica(
    db: &TestDb,
    client: &tokio_postgres::Client,
    cfg: WorkerConfig,
) -> Stalled {
    let id = insert_jobs(client, SCRIPTED, &[json!({"do": "write"})], 3).await[0];
    let (gate, gated) = Scripted::gated();
    let a = start(db, cfg, gated.clone()).await;
    let step = tokio::spawn(async move { (a.step().await.unwrap(), a.stats()) });
    eventually("A to be inside its handler", || {
        let gated = gated.clone();
        async move { gated.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    Stalled { id, gate, step }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_claimers_take_ten_thousand_jobs_each_exactly_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let payloads = vec![json!({}); 10_000];
    insert_jobs(&client, NOOP, &payloads, 3).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut cfg = config(&format!("claimer-{i}"));
        cfg.slots = 32;
        let worker = start(&db, cfg, Scripted::default()).await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let done = worker.step().await.unwrap();
                if done.is_empty() {
                    return (mine, worker.stats());
                }
                mine.extend(done);
            }
        }));
    }
    let mut all = Vec::new();
    let mut succeeded = 0;
    for task in tasks {
        let (mine, stats) = task.await.unwrap();
        assert_eq!(stats.claimed as usize, mine.len());
        succeeded += stats.succeeded;
        all.extend(mine);
    }
    assert_eq!(all.len(), 10_000);
    assert!(all.iter().all(|(_, t)| *t == Transition::Succeeded));
    all.sort_by_key(|d| d.0);
    all.dedup_by_key(|d| d.0);
    assert_eq!(all.len(), 10_000, "no job was executed twice");
    assert_eq!(succeeded, 10_000);
    assert_eq!(
        count(
            &client,
            "etl_jobs WHERE status = 'succeeded' AND attempts = 1"
        )
        .await,
        10_000
    );
    assert_eq!(count(&client, LEDGERS).await, 10_000);
    assert_eq!(
        count(&client, "etl_job_records").await,
        0,
        "no live row (nor its payload) is left"
    );
}

#[tokio::test]
async fn a_stale_owner_can_write_nothing_after_its_lease_is_reclaimed() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    // Owner A claims, then stalls; its lease is aged past expiry in SQL (no sleeping).
    let stale = claimer::claim(&client, claimant("stale-a", 30), 1)
        .await
        .unwrap();
    let stale_claim = stale[0].claim_id();
    let stale_lease = stale[0].lease();
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '2 hours'",
            &[],
        )
        .await
        .unwrap();
    // Replica B recovers and finishes the job.
    let b = start(&db, config("replica-b"), Scripted::default()).await;
    let recovered = b.recover().await.unwrap();
    assert_eq!((recovered.expired, recovered.exhausted), (1, 0));
    assert_eq!(b.step().await.unwrap(), vec![(id, Transition::Succeeded)]);
    let after_b = job_row(&client, id).await;
    assert_eq!(
        (after_b.status.as_str(), after_b.attempts),
        ("succeeded", 2)
    );

    // Every write A could still try matches nothing.
    let mut a = db.client().await;
    let tx = a.transaction().await.unwrap();
    let ledger = Some(serde_json::json!({}));
    assert!(completer::succeed_many(&tx, &[(stale_lease, ledger)])
        .await
        .unwrap()
        .is_empty());
    tx.rollback().await.unwrap();
    assert!(
        heartbeat::beat(&a, "stale-a", &[stale_claim], Duration::from_secs(30), true)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        completer::retry(&a, stale_lease, Duration::ZERO)
            .await
            .unwrap(),
        Transition::LeaseLost
    );
    assert_eq!(
        completer::fail(&a, stale_lease, Code::HandlerFailed, None)
            .await
            .unwrap(),
        Transition::LeaseLost
    );
    assert_eq!(
        completer::release(&a, &[stale_lease], &[stale_lease.claim_id])
            .await
            .unwrap(),
        0
    );
    assert_eq!(job_row(&client, id).await, after_b);
    assert_eq!(count(&client, LEDGERS).await, 1);
    assert_eq!(count(&client, "etl_target_rows").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_executor_loses_its_commit_to_the_replica_that_recovered_the_job() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let Stalled { id, gate, step } = stalled_replica(&db, &client, config("replica-a")).await;
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 hour'",
            &[],
        )
        .await
        .unwrap();
    let b = start(&db, config("replica-b"), Scripted::default()).await;
    assert_eq!(b.recover().await.unwrap().expired, 1);
    assert_eq!(b.step().await.unwrap(), vec![(id, Transition::Succeeded)]);
    gate.add_permits(1);
    let (a_done, a_stats) = step.await.unwrap();
    assert_eq!(a_done, vec![(id, Transition::LeaseLost)]);
    assert_eq!(a_stats.lease_lost, 1);
    assert_eq!(a_stats.succeeded, 0);
    assert_eq!(
        count(&client, "etl_target_rows").await,
        1,
        "effects exactly once"
    );
    assert_eq!(count(&client, LEDGERS).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owners_jobs_are_claimable_long_before_their_lease_expires() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut cfg = config("doomed-a");
    cfg.lease = Duration::from_secs(600);
    cfg.heartbeat_interval = Duration::from_secs(60);
    let Stalled { id, gate, step } = stalled_replica(&db, &client, cfg).await;
    let b = start(&db, config("replica-b"), Scripted::default()).await;
    assert_eq!(
        b.recover().await.unwrap().dead_owner,
        0,
        "A is alive: nothing to recover"
    );
    // A dies: its task, its session and its owner lock are gone at once.
    step.abort();
    let _ = step.await;
    eventually("A's owner session to end", || {
        let client = &client;
        async move {
            count(
                client,
                "pg_locks WHERE locktype = 'advisory' AND granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND ((classid::bigint << 32) | objid::bigint) = durable_etl_owner_lock_key('doomed-a')",
            )
            .await
                == 0
        }
    })
    .await;
    // The lease has ten minutes left, yet the job is recovered as soon as A has also left it
    // unrenewed for two of B's heartbeat intervals.
    let mut recovered = b.recover().await.unwrap();
    for _ in 0..100 {
        if recovered.dead_owner > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        recovered = b.recover().await.unwrap();
    }
    assert_eq!((recovered.dead_owner, recovered.expired), (1, 0));
    assert_eq!(b.step().await.unwrap(), vec![(id, Transition::Succeeded)]);
    gate.add_permits(1);
    assert_eq!(count(&client, "etl_target_rows").await, 1);
}

#[tokio::test]
async fn a_replica_without_handlers_claims_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, NOOP, &[json!({})], 3).await[..] else {
        unreachable!()
    };
    let empty = Worker::start(
        pool(&db).await,
        &db.config,
        config("empty"),
        Registry::new(),
    )
    .await
    .unwrap();
    assert!(empty.step().await.unwrap().is_empty());
    assert_eq!(job_row(&client, id).await.status, "pending");
}

#[tokio::test]
async fn a_restarted_owner_releases_its_previous_claims_and_a_live_one_blocks_a_twin() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await;
    // A previous incarnation of "pod-0" claimed both and died.
    assert_eq!(
        claimer::claim(&client, claimant("pod-0", 600), 2)
            .await
            .unwrap()
            .len(),
        2
    );
    let pod0 = start(&db, config("pod-0"), Scripted::default()).await;
    assert_eq!(pod0.stats().released, 2);
    for id in &ids {
        let row = job_row(&client, *id).await;
        assert_eq!(
            (row.status.as_str(), row.attempts, row.lease_cleared),
            ("pending", 1, true)
        );
    }
    let twin = Worker::start(
        pool(&db).await,
        &db.config,
        config("pod-0"),
        registry(Scripted::default()),
    )
    .await;
    assert!(matches!(twin, Err(Error::OwnerIdInUse)));
    assert_eq!(pod0.step().await.unwrap().len(), 2);
}

#[tokio::test]
async fn effects_and_failure_roll_back_together() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let cases = [
        ("write_then_transient", "pending", None),
        ("write_then_permanent", "failed", Some("handler_failed")),
        ("write_then_panic", "failed", Some("handler_panicked")),
        ("write_then_constraint", "failed", Some("handler_failed")),
        ("write_then_lock_timeout", "pending", None),
    ];
    let payloads: Vec<_> = cases.iter().map(|c| json!({"do": c.0})).collect();
    let ids = insert_jobs(&client, SCRIPTED, &payloads, 3).await;
    let worker = start(&db, config("atomic"), Scripted::default()).await;
    // A lock another session holds, so the `lock_timeout` case cannot take it.
    let mut holder = db.client().await;
    let hold = holder.transaction().await.unwrap();
    hold.batch_execute("LOCK TABLE etl_api_clients IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    assert_eq!(worker.step().await.unwrap().len(), cases.len());
    hold.rollback().await.unwrap();
    for (id, (action, status, code)) in ids.iter().zip(cases) {
        let row = job_row(&client, *id).await;
        assert_eq!(row.status, status, "{action}");
        assert_eq!(row.failure_code.as_deref(), code, "{action}");
        assert_eq!(row.live, status != "failed", "{action}");
        assert!(row.lease_cleared, "{action}");
    }
    assert_eq!(
        count(&client, "etl_target_rows").await,
        0,
        "no effect survived a failed attempt"
    );
    assert_eq!(count(&client, LEDGERS).await, 0);
}

#[tokio::test]
async fn transient_failures_retry_with_growing_delay_then_exhaust() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "transient"})], 3).await[..] else {
        unreachable!()
    };
    let worker = start(&db, config("retrier"), Scripted::default()).await;
    let mut delays = Vec::new();
    for _ in 0..2 {
        assert_eq!(
            worker.step().await.unwrap(),
            vec![(id, Transition::Retried)]
        );
        let delay: f64 = client
            .query_one(
                "SELECT extract(epoch FROM run_at - updated_at)::float8 FROM etl_job_records WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        delays.push(delay);
        let row = job_row(&client, id).await;
        assert_eq!(
            (row.status.as_str(), row.live, row.lease_cleared),
            ("pending", true, true)
        );
        // Not due yet: a step claims nothing. Then pin the clock forward by moving run_at.
        assert!(worker.step().await.unwrap().is_empty());
        client
            .execute(
                "UPDATE etl_job_records SET run_at = now(), sort_at = now() WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
    }
    assert!(delays[0] >= 0.1 && delays[0] < 0.2, "{delays:?}");
    assert!(delays[1] >= 0.2 && delays[1] < 0.4, "{delays:?}");
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(id, Transition::Failed(Code::AttemptsExhausted))]
    );
    let row = job_row(&client, id).await;
    assert_eq!(row.status, "failed");
    assert_eq!(row.attempts, 3);
    assert_eq!(row.failure_code.as_deref(), Some("attempts_exhausted"));
    assert!(!row.live && row.lease_cleared);
    assert!(
        worker.step().await.unwrap().is_empty(),
        "a failed job is never claimed"
    );
    let stats = worker.stats();
    assert_eq!((stats.retried, stats.failed, stats.empty_claims), (2, 1, 3));
}

#[tokio::test]
async fn deterministic_failures_panics_and_timeouts_end_with_their_code_and_unknown_kinds_wait() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let actions = [
        "permanent",
        "record_invalid",
        "panic",
        "hang",
        "write_then_hang",
    ];
    let payloads: Vec<_> = actions.iter().map(|a| json!({"do": a})).collect();
    let ids = insert_jobs(&client, SCRIPTED, &payloads, 5).await;
    let [unknown] = insert_jobs(&client, "test.nobody_handles_this", &[json!({})], 5).await[..]
    else {
        unreachable!()
    };
    let mut cfg = config("failer");
    cfg.execution_timeout = Duration::from_millis(300);
    let worker = start(&db, cfg, Scripted::default()).await;
    assert_eq!(worker.step().await.unwrap().len(), 5);
    let expected = [
        (ids[0], "handler_failed", None),
        (ids[1], "record_invalid", Some(3)),
        (ids[2], "handler_panicked", None),
        (ids[3], "execution_timeout", None),
    ];
    for (id, code, index) in expected {
        let row = job_row(&client, id).await;
        assert_eq!(row.status, "failed", "{code}");
        assert_eq!(row.attempts, 1, "terminal at once: {code}");
        assert_eq!(row.failure_code.as_deref(), Some(code));
        assert_eq!(row.failure_record_index, index, "{code}");
        assert!(!row.live && row.lease_cleared, "{code}");
    }
    // Effects that overran their own budget are cut and retried, never failed at once.
    let overran = job_row(&client, ids[4]).await;
    assert_eq!((overran.status.as_str(), overran.attempts), ("pending", 1));
    assert!(overran.live && overran.lease_cleared);
    // A kind this replica does not run is never claimed by it: it waits, untouched, for a
    // replica that does.
    let waiting = job_row(&client, unknown).await;
    assert_eq!((waiting.status.as_str(), waiting.attempts), ("pending", 0));
    assert!(waiting.live && waiting.lease_cleared);
    let stats = worker.stats();
    assert_eq!(
        (stats.failed, stats.panicked, stats.timed_out, stats.retried),
        (4, 1, 1, 1)
    );
    assert_eq!(
        count(&client, "etl_target_rows").await,
        0,
        "timed-out effects rolled back"
    );
}

/// A job's ledger is its succeeded outcome, written by the statement that deletes its live row:
/// once it exists there is nothing left to claim, so the job is never executed again.
#[tokio::test]
async fn a_job_whose_ledger_row_exists_is_never_executed_again() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    end_job(&client, id, "succeeded", None, Some((7, 0, 0))).await;
    let worker = start(&db, config("dedup"), Scripted::default()).await;
    assert!(worker.step().await.unwrap().is_empty(), "nothing to claim");
    assert_eq!(
        count(&client, "etl_target_rows").await,
        0,
        "effects not run again"
    );
    assert_eq!(
        count(&client, &format!("{LEDGERS} AND rows_inserted = 7")).await,
        1,
        "ledger kept"
    );
    assert_eq!(job_row(&client, id).await.status, "succeeded");
}

#[tokio::test]
async fn a_job_on_its_last_attempt_waits_for_its_lease_then_ends_lease_expired_exhausted() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, NOOP, &[json!({})], 1).await[..] else {
        unreachable!()
    };
    claimer::claim(&client, claimant("crashed", 600), 1)
        .await
        .unwrap();
    // The crashed owner has not renewed for an hour (aged in SQL, no sleeping).
    client
        .execute(
            "UPDATE etl_job_records SET lease_renewed_at = now() - interval '1 hour'",
            &[],
        )
        .await
        .unwrap();
    let worker = start(&db, config("rescuer"), Scripted::default()).await;
    // Its owner is judged dead, but the judgement may be wrong (cut off, not dead): a job on its
    // last attempt waits for its lease.
    assert_eq!(worker.recover().await.unwrap(), Default::default());
    assert_eq!(job_row(&client, id).await.status, "running");
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let recovered = worker.recover().await.unwrap();
    assert_eq!((recovered.expired, recovered.exhausted), (1, 1));
    let row = job_row(&client, id).await;
    assert_eq!(row.failure_code.as_deref(), Some("lease_expired_exhausted"));
    assert!(!row.live && row.lease_cleared);
    assert_eq!(
        worker.recover().await.unwrap(),
        Default::default(),
        "terminal rows are never touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_drains_the_queue_renews_leases_and_abandons_lost_ones() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let payloads = vec![json!({}); 50];
    insert_jobs(&client, NOOP, &payloads, 3).await;
    let [gated_id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let (gate, gated) = Scripted::gated();
    let mut cfg = config("runner");
    cfg.slots = 4;
    cfg.prefetch = 0;
    cfg.lease = Duration::from_secs(1);
    cfg.heartbeat_interval = Duration::from_millis(100);
    let worker = start(&db, cfg, gated).await;
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("the no-op jobs to finish", || {
        let client = &client;
        async move { count(client, "etl_jobs WHERE status = 'succeeded'").await == 50 }
    })
    .await;
    // The gated job may be claimed just after the last no-op job ended (by the refill).
    eventually("the gated job to be claimed", || {
        let client = &client;
        async move {
            count(
                client,
                &format!("etl_job_records WHERE id = '{gated_id}' AND status = 'running'"),
            )
            .await
                == 1
        }
    })
    .await;
    // The gated job outlives its 1 s lease only because heartbeats renew it.
    let first: std::time::SystemTime = client
        .query_one(
            "SELECT lease_expires_at FROM etl_job_records WHERE id = $1",
            &[&gated_id],
        )
        .await
        .unwrap()
        .get(0);
    eventually("a heartbeat to renew the lease", || {
        let client = &client;
        async move {
            let now: std::time::SystemTime = client
                .query_one(
                    "SELECT lease_expires_at FROM etl_job_records WHERE id = $1",
                    &[&gated_id],
                )
                .await
                .unwrap()
                .get(0);
            now > first
        }
    })
    .await;
    // Someone else takes the job over: the next heartbeat sees the lease gone and abandons it.
    client
        .execute(
            "UPDATE etl_job_records SET lease_claim_id = gen_random_uuid() WHERE id = $1",
            &[&gated_id],
        )
        .await
        .unwrap();
    eventually("the lost lease to be noticed", || {
        let stats = Arc::clone(&stats);
        async move { stats.snapshot().lease_lost == 1 }
    })
    .await;
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    gate.add_permits(1);
    let snapshot = stats.snapshot();
    assert_eq!((snapshot.succeeded, snapshot.released), (50, 0));
    assert!(
        snapshot.claims >= 13,
        "claims sized to 4 free slots: {snapshot:?}"
    );
    assert_eq!(
        count(&client, "etl_target_rows").await,
        0,
        "the abandoned job wrote nothing"
    );
    assert_eq!(count(&client, LEDGERS).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_unfinished_leases_and_closes_its_connections() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(
        &client,
        SCRIPTED,
        &[json!({"do": "hang"}), json!({"do": "ok"})],
        3,
    )
    .await;
    let scripted = Scripted::default();
    let worker = start(&db, config("leaver"), scripted.clone()).await;
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("both jobs to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 2 }
    })
    .await;
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    let hung = job_row(&client, ids[0]).await;
    assert_eq!(
        (hung.status.as_str(), hung.attempts, hung.lease_cleared),
        ("pending", 0, true)
    );
    assert!(hung.live);
    assert_eq!(job_row(&client, ids[1]).await.status, "succeeded");
    assert_eq!(stats.snapshot().released, 1);
    let db_name = db.name.clone();
    eventually("the pool and owner session to close", || {
        let (client, db_name) = (&client, db_name.clone());
        async move {
            count(
                client,
                &format!("pg_stat_activity WHERE datname = '{db_name}' AND application_name LIKE 'durable-etl/%'"),
            )
            .await
                == 0
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_grace_period_to_zero() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "hang"})], 3).await[..] else {
        unreachable!()
    };
    let scripted = Scripted::default();
    let mut cfg = config("impatient");
    cfg.shutdown_grace = Duration::from_secs(3600);
    let worker = start(&db, cfg, scripted.clone()).await;
    let (trigger, shutdown) = shutdown::manual();
    let run = tokio::spawn(worker.run(shutdown));
    eventually("the job to start", || {
        let scripted = scripted.clone();
        async move { scripted.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    trigger.request(Stage::Draining);
    trigger.request(Stage::Immediate);
    run.await.unwrap().unwrap();
    assert_eq!(job_row(&client, id).await.status, "pending");
}

#[tokio::test]
async fn a_commit_lost_with_its_connection_is_resolved_through_the_ledger() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // At COMMIT, a deferred trigger makes the committing backend terminate itself: the client
    // sees its connection die during COMMIT and cannot know the outcome from the reply.
    client
        .batch_execute(
            "CREATE FUNCTION die_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER die_at_commit AFTER INSERT ON etl_target_rows
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION die_at_commit()",
        )
        .await
        .unwrap();
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let worker = start(&db, config("unlucky"), Scripted::default()).await;
    // The lost COMMIT is the infrastructure's fault, not the job's: given back uncharged.
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(id, Transition::GivenBack)]
    );
    eventually("the job given back", || {
        let client = &client;
        async move { job_row(client, id).await.status == "pending" }
    })
    .await;
    assert_eq!(job_row(&client, id).await.attempts, 0, "no attempt charged");
    assert_eq!(
        count(&client, "etl_job_attempts WHERE ending = 'released'").await,
        1
    );
    assert_eq!(
        count(&client, LEDGERS).await,
        0,
        "the ledger says: not committed"
    );
    assert_eq!(count(&client, "etl_target_rows").await, 0);
    client
        .batch_execute("DROP TRIGGER die_at_commit ON etl_target_rows")
        .await
        .unwrap();
    client
        .execute(
            "UPDATE etl_job_records SET run_at = now(), sort_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(id, Transition::Succeeded)]
    );
    assert_eq!(count(&client, "etl_target_rows").await, 1);
}

/// The claim commits like every commit, under the server's `synchronous_commit` (it used to
/// turn it off for its own transaction, which a server crash could undo while the job ran):
/// neither on its own nor inside an explicit transaction does it change the setting.
#[tokio::test]
async fn the_claim_commits_under_the_servers_synchronous_commit() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    insert_jobs(&client, NOOP, &[json!({}), json!({})], 5).await;
    let claimant = claimer::Claimant {
        owner_id: "durable-claim",
        owner_locked: false,
        lease: Duration::from_secs(30),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    assert_eq!(claimer::claim(&client, claimant, 1).await.unwrap().len(), 1);
    assert_eq!(synchronous_commit(&client).await, "on");
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(claimer::claim(&client, claimant, 1).await.unwrap().len(), 1);
    assert_eq!(synchronous_commit(&client).await, "on");
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        count(&client, "etl_job_records WHERE status = 'running'").await,
        2
    );
}

/// The session's current `synchronous_commit`.
async fn synchronous_commit(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0)
}

/// Under a backlog a replica refills once half its slots are free, or else shortly after the
/// first one freed: a freed slot never idles behind jobs that keep the others busy. The poll is
/// a minute away, so only the refill can take the fifth job.
#[tokio::test]
async fn a_freed_slot_is_refilled_while_most_slots_stay_busy() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (gate, scripted) = Scripted::gated();
    let prepares = Arc::clone(&scripted.prepares);
    insert_jobs(&client, SCRIPTED, &vec![json!({"do": "ok"}); 6], 5).await;
    // Without prefetch: no job waits in a buffer, so the freed slot needs a claim.
    let config = WorkerConfig {
        slots: 4,
        prefetch: 0,
        poll_interval: Duration::from_secs(60),
        ..config("refill")
    };
    let worker = start(&db, config, scripted).await;
    let (trigger, shutdown) = shutdown::manual();
    let task = tokio::spawn(worker.run(shutdown));
    let started = |n: usize| {
        let prepares = Arc::clone(&prepares);
        move || {
            let prepares = Arc::clone(&prepares);
            async move { prepares.load(Ordering::SeqCst) == n }
        }
    };
    eventually("four jobs started", started(4)).await;
    // One job ends: one slot of four is free, fewer than half.
    gate.add_permits(1);
    eventually("the freed slot refilled", started(5)).await;
    assert_eq!(
        count(&client, "etl_job_records WHERE status = 'running'").await,
        4
    );
    gate.add_permits(10);
    eventually("every job succeeded", || async {
        count(&client, "etl_jobs WHERE status = 'succeeded'").await == 6
    })
    .await;
    trigger.request(Stage::Draining);
    task.await.unwrap().unwrap();
}
