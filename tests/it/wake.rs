//! The wake path: notifications wake idle replicas, the poll is the backstop, the session
//! reconnects and catches up, deferred jobs run when due, and several replicas share the queue.

use crate::handlers::{Noop, NOOP};
use crate::support::{
    count, eventually, insert_job, insert_jobs, pool, register_waiting, session_pid, Listener,
    TestDb, LEDGERS,
};
use durable_etl::config::WorkerConfig;
use durable_etl::error::Error;
use durable_etl::job::handler::Registry;
use durable_etl::shutdown::{self, Stage, Trigger};
use durable_etl::worker::stats::WorkerStats;
use durable_etl::worker::Worker;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A configuration with the given poll interval and slots.
pub(crate) fn config(owner: &str, poll: Duration, slots: usize) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots,
        poll_interval: poll,
        lease: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(5),
        ..WorkerConfig::default()
    }
}

/// A running replica: its counters, its shutdown trigger and its task.
pub(crate) struct Replica {
    /// Live counters.
    pub(crate) stats: Arc<WorkerStats>,
    /// Asks it to stop.
    trigger: Trigger,
    /// The `run` task.
    task: JoinHandle<Result<(), Error>>,
}

impl Replica {
    /// Starts a replica on `db` running no-op jobs.
    async fn start(db: &TestDb, config: WorkerConfig) -> Replica {
        Replica::start_with(db, config, Registry::new().register(Noop)).await
    }

    /// Starts a replica on `db` running the handlers of `registry`.
    pub(crate) async fn start_with(
        db: &TestDb,
        config: WorkerConfig,
        registry: Registry,
    ) -> Replica {
        Replica::start_on(db, &db.config, config, registry).await
    }

    /// Starts a replica on `db`, its own sessions opened with `db_config`, running the handlers
    /// of `registry`.
    pub(crate) async fn start_on(
        db: &TestDb,
        db_config: &durable_etl::DatabaseConfig,
        config: WorkerConfig,
        registry: Registry,
    ) -> Replica {
        Replica::start_pooled((pool(db).await, db_config), config, registry).await
    }

    /// Starts a replica on `pool`, its own sessions opened with `db_config`, running the
    /// handlers of `registry`.
    pub(crate) async fn start_pooled(
        (pool, db_config): (durable_etl::db::Pool, &durable_etl::DatabaseConfig),
        config: WorkerConfig,
        registry: Registry,
    ) -> Replica {
        let worker = Worker::start(pool, db_config, config, registry)
            .await
            .unwrap();
        let stats = worker.stats_handle();
        let (trigger, shutdown) = shutdown::manual();
        let task = tokio::spawn(worker.run(shutdown));
        Replica {
            stats,
            trigger,
            task,
        }
    }

    /// Waits for its start-up claim, so what the test enqueues next is found by something else.
    async fn started(&self) {
        eventually("the start-up claim", || {
            let stats = Arc::clone(&self.stats);
            async move { stats.snapshot().claims == 1 }
        })
        .await;
    }

    /// Stops it and waits for it.
    pub(crate) async fn stop(self) -> Result<(), Error> {
        self.trigger.request(Stage::Draining);
        self.task.await.unwrap()
    }
}

/// Waits until `n` jobs have succeeded.
pub(crate) async fn until_succeeded(client: &tokio_postgres::Client, n: i64) {
    eventually(&format!("{n} succeeded jobs"), || async move {
        count(client, "etl_jobs WHERE status = 'succeeded'").await == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_starts_a_job_because_of_its_notification() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = Replica::start(&db, config("notified", Duration::from_secs(60), 4)).await;
    replica.started().await;
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.notifications, 1);
    assert_eq!((stats.claims_by_notify, stats.claimed_by_notify), (1, 1));
    assert_eq!(stats.claimed_by_poll, 0, "the 60 s poll never fired");
    replica.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notify_suppressed_every_job_still_runs_by_the_poll() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE etl_job_records DISABLE TRIGGER etl_job_records_notify_enqueue")
        .await
        .unwrap();
    let replica = Replica::start(&db, config("polled", Duration::from_millis(100), 4)).await;
    replica.started().await;
    for _ in 0..5 {
        insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await;
    }
    until_succeeded(&client, 10).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.notifications, 0);
    assert_eq!(stats.claimed_by_notify, 0);
    assert!(stats.claimed_by_poll >= 1, "{stats:?}");
    assert!(
        stats.poll_found_work >= 1,
        "polls found what no notification announced: {stats:?}"
    );
    replica.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_reconnects_relistens_and_catches_up() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = Replica::start(&db, config("reconnector", Duration::from_secs(60), 4)).await;
    replica.started().await;
    // A job enqueued while the session is away sends no notification the replica can receive:
    // here, none at all (trigger off), so only the catch-up claim can find it.
    client
        .batch_execute("ALTER TABLE etl_job_records DISABLE TRIGGER etl_job_records_notify_enqueue")
        .await
        .unwrap();
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    let pid = session_pid(&client, &db).await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    until_succeeded(&client, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.reconnects, 1);
    assert!(stats.claims_by_reconnect >= 1, "{stats:?}");
    assert_eq!(stats.session_up, 1);
    // It listens again: the next job is started by its notification.
    client
        .batch_execute("ALTER TABLE etl_job_records ENABLE TRIGGER etl_job_records_notify_enqueue")
        .await
        .unwrap();
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 2).await;
    assert_eq!(replica.stats.snapshot().claimed_by_notify, 1);
    replica.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_owner_id_is_taken_while_it_reconnects_stops() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = Replica::start(&db, config("contested", Duration::from_secs(60), 4)).await;
    let waiting = "etl_waiting_replicas WHERE owner_id = 'contested'";
    eventually("the replica waits", || async {
        count(&client, waiting).await == 1
    })
    .await;
    let pid = session_pid(&client, &db).await;
    // Queue for the owner lock first, then kill the session: the lock passes to the queued
    // waiter the moment the old backend exits, long before the replica can reconnect.
    let contender = db.client().await;
    let queued = tokio::spawn(async move {
        contender
            .execute(
                "SELECT pg_advisory_lock(durable_etl_owner_lock_key('contested'))",
                &[],
            )
            .await
            .unwrap();
        contender
    });
    eventually("the contender to queue for the lock", || {
        let client = &client;
        async move {
            count(
                client,
                "pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .await
                == 1
        }
    })
    .await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let _contender = queued.await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), replica.task)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(outcome, Err(Error::OwnerIdInUse)));
    assert_eq!(
        count(&client, waiting).await,
        1,
        "the row under the owner id is the new holder's: the stopped replica leaves it"
    );
}

/// Drains 1,000 jobs enqueued in one transaction through one replica with 8 slots and
/// `prefetch`; returns its counters.
async fn drain_a_thousand(prefetch: usize) -> durable_etl::worker::stats::StatsSnapshot {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let config = WorkerConfig {
        prefetch,
        ..config("drainer", Duration::from_secs(60), 8)
    };
    let replica = Replica::start(&db, config).await;
    replica.started().await;
    insert_jobs(&client, NOOP, &vec![json!({}); 1000], 3).await;
    until_succeeded(&client, 1000).await;
    let stats = replica.stats.snapshot();
    replica.stop().await.unwrap();
    assert_eq!(stats.notifications, 1, "one transaction, one notification");
    assert_eq!(stats.claimed, 1000);
    assert_eq!(stats.claimed_by_poll, 0);
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prefetch_a_thousand_jobs_drain_in_claims_sized_to_free_slots() {
    let stats = drain_a_thousand(0).await;
    assert_eq!(
        stats.claimed_by_notify, 8,
        "the first claim filled the slots"
    );
    assert!(
        stats.claims > 1000 / 8,
        "no claim took more than 8: {stats:?}"
    );
    assert!(
        stats.claims_by_drain >= 1000 / 8 - 1,
        "drained as slots freed: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_jobs_drain_in_claims_sized_to_the_slots_and_the_prefetch() {
    let stats = drain_a_thousand(56).await;
    assert_eq!(
        stats.claimed_by_notify, 8,
        "an idle replica claims for its free slots only"
    );
    // No claim took more than the room; fewer claims than free slots alone would have needed.
    assert!(
        (1000 / 64..1000 / 8).contains(&stats.claims),
        "claims of up to 64 jobs: {stats:?}"
    );
    assert!(
        stats.claims_by_drain >= 1000 / 64 - 1,
        "drained as the room freed: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_share_two_thousand_jobs_each_claimed_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut replicas = Vec::new();
    for i in 0..4 {
        replicas.push(
            Replica::start(&db, config(&format!("r{i}"), Duration::from_millis(200), 8)).await,
        );
    }
    for _ in 0..4 {
        insert_jobs(&client, NOOP, &vec![json!({}); 500], 3).await;
    }
    until_succeeded(&client, 2000).await;
    assert_eq!(
        count(&client, "etl_jobs WHERE attempts <> 1").await,
        0,
        "each claimed once"
    );
    assert_eq!(count(&client, LEDGERS).await, 2000);
    let mut claimed = 0;
    let mut empty = 0;
    for replica in replicas {
        // A replica counts a success after its commit returns, so the rows can all read
        // `succeeded` a moment before its counters do: read them once it has stopped.
        let handle = Arc::clone(&replica.stats);
        replica.stop().await.unwrap();
        let stats = handle.snapshot();
        claimed += stats.claimed;
        empty += stats.empty_claims;
        assert_eq!(stats.succeeded, stats.claimed);
    }
    assert_eq!(claimed, 2000);
    println!("4 replicas, 2000 jobs: {empty} empty claims");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_job_runs_when_due_and_never_before() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // Known at start-up: the replica's timer wakes it when the job is due (the poll is 60 s).
    let early = insert_job(&client, "now() + interval '800 milliseconds'").await;
    client
        .execute(
            "UPDATE etl_job_records SET kind = $1::text WHERE id = $2",
            &[&NOOP, &early],
        )
        .await
        .unwrap();
    let replica = Replica::start(&db, config("patient", Duration::from_secs(60), 4)).await;
    until_succeeded(&client, 1).await;
    assert!(replica.stats.snapshot().claims_by_due >= 1);
    // Inserted later, unannounced (deferred jobs do not notify): found by the next poll.
    replica.stop().await.unwrap();
    let replica = Replica::start(&db, config("patient", Duration::from_millis(300), 4)).await;
    let late = insert_job(&client, "now() + interval '500 milliseconds'").await;
    client
        .execute(
            "UPDATE etl_job_records SET kind = $1::text WHERE id = $2",
            &[&NOOP, &late],
        )
        .await
        .unwrap();
    until_succeeded(&client, 2).await;
    for id in [early, late] {
        let not_early: bool = client
            .query_one(
                "SELECT started_at >= run_at FROM etl_jobs WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            not_early,
            "a job never starts before its run_at (database time)"
        );
    }
    replica.stop().await.unwrap();
}

#[tokio::test]
async fn the_notification_carries_no_id_payload_or_principal() {
    let db = TestDb::migrated().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "sentinel"]).await;
    let client = db.client().await;
    // A waiting replica is named by its wake token (a number), with the job's queue and kind:
    // nothing else of the job (migration 0028).
    register_waiting(&client, "listener").await;
    let ids = insert_jobs(
        &client,
        NOOP,
        &[json!({"secret": "canary-payload-91c2"})],
        3,
    )
    .await;
    client.batch_execute("NOTIFY sentinel").await.unwrap();
    let seen = listener.drain_until("sentinel").await;
    let channel = "durable_etl_jobs".to_owned();
    assert_eq!(seen, vec![(channel, "t 1 default test.noop".to_owned())]);
    for (_, payload) in &seen {
        assert!(!payload.contains("canary"));
        assert!(!payload.contains(&ids[0].to_string()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_only_mode_without_a_session_recovers_by_expiry_only() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut cfg = config("pooled", Duration::from_millis(100), 4);
    cfg.poll_only = true;
    let replica = Replica::start(&db, cfg).await;
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!((stats.notifications, stats.session_up), (0, 0));
    assert_eq!(
        (stats.waits, count(&client, "etl_waiting_replicas").await),
        (0, 0),
        "nothing can wake it, so it never waits"
    );
    assert_eq!(
        count(&client, &format!("pg_stat_activity WHERE datname = '{}' AND application_name = 'durable-etl/session'", db.name)).await,
        0
    );
    replica.stop().await.unwrap();
    // A lockless claim is never taken for a dead owner: only its lease expiry frees it.
    let pooled = durable_etl::worker::claimer::Claimant {
        owner_id: "pooled-2",
        owner_locked: false,
        lease: Duration::from_secs(600),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    assert_eq!(
        durable_etl::worker::claimer::claim(&client, pooled, 1)
            .await
            .unwrap()
            .len(),
        1
    );
    let checker = Worker::start(
        pool(&db).await,
        &db.config,
        config("checker", Duration::from_secs(1), 1),
        Registry::new(),
    )
    .await
    .unwrap();
    assert_eq!(checker.recover().await.unwrap(), Default::default());
    client.execute("UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'", &[]).await.unwrap();
    assert_eq!(checker.recover().await.unwrap().expired, 1);
}

/// A claim that fails is tried again shortly, without waiting for another notification or the
/// (here two-minute) poll: the first claim after the notification hits an error raised once by a
/// trigger, and the job still runs.
#[tokio::test]
async fn a_failed_claim_is_retried_without_waiting_for_the_poll() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = Replica::start(&db, config("retrying", Duration::from_secs(120), 4)).await;
    replica.started().await;
    client
        .batch_execute(
            // A sequence, not a table: its advance survives the failing statement's rollback.
            "CREATE SEQUENCE claim_attempts;
             CREATE FUNCTION fail_claim_once() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.status = 'running' AND nextval('claim_attempts') = 1 THEN
                 RAISE EXCEPTION 'claim fails once';
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER fail_claim_once BEFORE UPDATE ON etl_job_records
               FOR EACH ROW EXECUTE FUNCTION fail_claim_once();",
        )
        .await
        .unwrap();
    insert_job(&client, "now()").await;
    until_succeeded(&client, 1).await;
    let stats = replica.stats.snapshot();
    // The start-up claim, the failed one (counted nowhere but in the log) and its retry.
    assert_eq!((stats.claims, stats.claims_by_due), (2, 1));
    replica.stop().await.unwrap();
}

/// Migration 0026 changes the types of columns a replica's prepared statements read and write
/// (a prepared statement whose result types change fails with `0A000`): a replica started before
/// the migration goes down to 25 and up again under it keeps claiming on the sessions it
/// prepared its claim and presence statements on, and completes what it claimed once the schema
/// is back (below 0033 it has nowhere to write a success, and gives nothing up meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replica_keeps_working_across_migration_0026_down_and_up() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let replica = Replica::start(&db, config("across", Duration::from_secs(60), 4)).await;
    replica.started().await;
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 1).await;
    let down = durable_etl::schema::migrate_down_to(&mut client, 25)
        .await
        .unwrap();
    assert_eq!(down.version, 25);
    insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await;
    crate::support::eventually("the replica to claim both below 0026", || {
        let client = &client;
        async move { count(client, "etl_job_records WHERE status = 'running'").await == 2 }
    })
    .await;
    let up = durable_etl::schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.version, durable_etl::schema::latest_version());
    insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await;
    until_succeeded(&client, 5).await;
    assert_eq!(
        count(&client, "etl_jobs WHERE status <> 'succeeded'").await,
        0,
        "no job failed or was left behind"
    );
    replica.stop().await.unwrap();
}
