//! Leases held by a live replica against what can go wrong around them: a session that keeps
//! dropping (the owner lock comes and goes while the pool still renews), heartbeats that stop
//! reaching the database (the local lease clock must abandon the job before the database lease
//! ends), an owner that really died (every connection of its own gone and its beats silent:
//! recovered without waiting for its lease), and
//! owners judged by their own terms (their heartbeat interval, their alive locks), never by
//! the recovering replica's.

use crate::handlers::{Noop, Scripted, SCRIPTED};
use crate::proxy::{Mode, Proxy};
use crate::support::{count, eventually, insert_jobs, job_row, pool, TestDb, LEDGERS};
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::error::Error;
use durable_etl::job::handler::{Effects, Handler, JobContext, JobError, Registry};
use durable_etl::shutdown::{self, Stage, Trigger};
use durable_etl::worker::stats::WorkerStats;
use durable_etl::worker::Worker;
use futures::future::BoxFuture;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

/// A replica configuration with frequent heartbeats and no poll to speak of.
fn config(owner: &str, lease: Duration) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots: 8,
        poll_interval: Duration::from_secs(60),
        lease,
        heartbeat_interval: Duration::from_millis(200),
        execution_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_millis(300),
        ..WorkerConfig::default()
    }
}

/// A running replica: its counters, its shutdown trigger and its `run` task.
struct Running {
    /// Live counters.
    stats: Arc<WorkerStats>,
    /// Asks it to stop.
    trigger: Trigger,
    /// The `run` task.
    task: JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Starts `worker` running.
    fn start(worker: Worker) -> Running {
        let stats = worker.stats_handle();
        let (trigger, shutdown) = shutdown::manual();
        let task = tokio::spawn(worker.run(shutdown));
        Running {
            stats,
            trigger,
            task,
        }
    }

    /// Stops it; it must stop cleanly.
    async fn stop(self) {
        self.trigger.request(Stage::Draining);
        self.task.await.unwrap().unwrap();
    }
}

/// Starts replica `owner` (with `lease`) running `SCRIPTED` jobs held at a gate, and returns once
/// `jobs` of them are inside their handlers: the replica, its handler and the gate.
async fn gated_replica(
    db: &TestDb,
    owner: &str,
    lease: Duration,
    jobs: usize,
) -> (Running, Scripted, Arc<Semaphore>) {
    let (gate, gated) = Scripted::gated();
    let worker = Worker::start(
        pool(db).await,
        &db.config,
        config(owner, lease),
        Registry::new().register(gated.clone()),
    )
    .await
    .unwrap();
    let running = Running::start(worker);
    eventually(&format!("{owner} to run {jobs} job(s)"), || {
        let gated = gated.clone();
        async move { gated.prepares.load(Ordering::SeqCst) == jobs }
    })
    .await;
    (running, gated, gate)
}

/// Terminates the backend holding `owner`'s owner lock, if one does; returns whether one did.
async fn terminate_owner_session(client: &tokio_postgres::Client, owner: &str) -> bool {
    terminate_holders(client, owner, false).await > 0
}

/// The granted owner locks of owner `$1` in this database and, with `$2`, its alive locks.
const HOLDERS: &str = "FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 1 AND granted
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND (((classid::bigint << 32) | objid::bigint) = durable_etl_owner_lock_key($1)
        OR $2 AND ((classid::bigint << 32) | objid::bigint) = durable_etl_owner_alive_key($1))";

/// Terminates every backend holding `owner`'s owner lock or, with `alive`, its alive lock (as a
/// crash of its process would end them all); returns how many locks they held.
async fn terminate_holders(client: &tokio_postgres::Client, owner: &str, alive: bool) -> i64 {
    let sql = format!("SELECT count(pg_terminate_backend(pid)) {HOLDERS}");
    client
        .query_one(&sql, &[&owner, &alive])
        .await
        .unwrap()
        .get(0)
}

/// How many of `owner`'s owner and alive locks are held, terminating nobody.
async fn held_locks(client: &tokio_postgres::Client, owner: &str) -> i64 {
    let sql = format!("SELECT count(*) {HOLDERS}");
    client
        .query_one(&sql, &[&owner, &true])
        .await
        .unwrap()
        .get(0)
}

/// Terminates every backend that holds `owner`'s owner or alive lock until none has held one for
/// a second: what a process's death does to all its connections at once. A stopped replica's
/// pools may still be finishing a connection they had begun to open, which takes the alive lock
/// a moment after the first termination (a dead process's could not); over TLS, on a loaded
/// machine, such a connection took more than 100 ms to open.
async fn terminate_every_holder(client: &tokio_postgres::Client, owner: &str) {
    let mut quiet = 0;
    for _ in 0..750 {
        if terminate_holders(client, owner, true).await == 0 {
            quiet += 1;
            if quiet == 50 {
                return;
            }
        } else {
            quiet = 0;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("connections of {owner} kept taking its locks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_in_flight_survive_a_session_terminated_again_and_again() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, SCRIPTED, &vec![json!({"do": "write"}); 3], 3).await;
    let (a, _, gate) = gated_replica(&db, "flaky-session", Duration::from_secs(10), 3).await;
    // B recovers as often as it can while A's session is terminated again and again; A's pool
    // keeps renewing, so nothing of A's is ever a dead owner's.
    let b = Worker::start(
        pool(&db).await,
        &db.config,
        config("rescuer-b", Duration::from_secs(10)),
        Registry::new().register(Noop),
    )
    .await
    .unwrap();
    let mut terminated = 0;
    for _ in 0..12 {
        terminated += usize::from(terminate_owner_session(&client, "flaky-session").await);
        for _ in 0..5 {
            let recovered = b.recover().await.unwrap();
            assert_eq!(
                (recovered.dead_owner, recovered.expired),
                (0, 0),
                "a live replica's jobs were recovered"
            );
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    }
    assert!(
        terminated >= 3,
        "the session was terminated {terminated} times"
    );
    gate.add_permits(3);
    eventually("the three jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_jobs WHERE status = 'succeeded'").await == 3 }
    })
    .await;
    for id in ids {
        let row = job_row(&client, id).await;
        assert_eq!((row.status.as_str(), row.attempts), ("succeeded", 1));
    }
    assert_eq!(count(&client, "etl_target_rows").await, 3);
    assert_eq!(count(&client, LEDGERS).await, 3);
    assert_eq!(a.stats.snapshot().lease_lost, 0);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_every_connection_vanished_is_recovered_once_its_beats_fall_silent() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let (a, gated, _gate) = gated_replica(&db, "doomed", Duration::from_secs(600), 1).await;
    // A stops (its task is gone, as in a crash) and every connection of its own ends: its
    // session and its claim and commit sessions, each of which held its alive lock.
    a.task.abort();
    let _ = a.task.await;
    terminate_every_holder(&client, "doomed").await;
    let b = Worker::start(
        pool(&db).await,
        &db.config,
        config("rescuer-b", Duration::from_secs(10)),
        Registry::new().register(gated.clone()),
    )
    .await
    .unwrap();
    // The lease has ten minutes left, and was renewed moments ago: the job comes back as a dead
    // owner's, not an expired one, once its beats are silent (1.75 s). Recovery judges
    // owners only once it has itself reached the database for the reconnect grace (5 s) past
    // any loss it saw, so a loaded machine whose probe of B's session timed out may take that
    // long again: the wait is 30 s, still a twentieth of the lease.
    let mut recovered = b.recover().await.unwrap();
    for _ in 0..1500 {
        if recovered.dead_owner > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        recovered = b.recover().await.unwrap();
    }
    let holders = held_locks(&client, "doomed").await;
    assert_eq!(
        (recovered.dead_owner, recovered.expired),
        (1, 0),
        "{holders} locks of the dead owner still held; the rescuer's session reconnected {} times",
        b.stats().reconnects
    );
    let row = job_row(&client, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE lease_owner_locked OR lease_renewed_at IS NOT NULL
                OR lease_owner_alive_locked OR lease_heartbeat_ms IS NOT NULL"
        )
        .await,
        0,
        "the lease is cleared whole on the way back to pending"
    );
}

/// A live peer with a longer heartbeat interval whose session is cut, and stays cut, is never
/// taken for dead by a replica with a shorter interval: its claim and commit sessions still
/// hold its alive lock. (Judged by the recovering replica's interval and the owner lock alone,
/// the peer was dead as soon as its last renewal was 1.6 s old.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_session_is_cut_is_alive_to_a_replica_with_a_shorter_heartbeat() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let proxy = Proxy::in_front_of_test_server().await;
    let (gate, gated) = Scripted::gated();
    let slow = WorkerConfig {
        heartbeat_interval: Duration::from_secs(4),
        session_database_url: Some(proxy.url_for(&db.config.url)),
        ..config("slow", Duration::from_secs(15))
    };
    let registry = Registry::new().register(gated.clone());
    let worker = Worker::start(pool(&db).await, &db.config, slow, registry)
        .await
        .unwrap();
    let a = Running::start(worker);
    eventually("the slow replica to run its job", || {
        let gated = gated.clone();
        async move { gated.prepares.load(Ordering::SeqCst) == 1 }
    })
    .await;
    // Its session is cut and cannot come back; its pool still reaches the server.
    proxy.set_mode(Mode::Blackhole);
    proxy.drop_all();
    eventually("the slow replica's owner lock to go", || {
        let client = &client;
        async move { !terminate_owner_session(client, "slow").await }
    })
    .await;
    let quick = WorkerConfig {
        heartbeat_interval: Duration::from_millis(800),
        ..config("quick", Duration::from_secs(3))
    };
    let b = Worker::start(pool(&db).await, &db.config, quick, Registry::new())
        .await
        .unwrap();
    // Longer than the slow replica's heartbeat interval, so its renewal grows past 1.6 s old.
    for _ in 0..25 {
        assert_eq!(b.recover().await.unwrap(), Default::default());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let row = job_row(&client, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("running", 1));
    gate.add_permits(1);
    eventually("the slow replica's job to succeed", || {
        let client = &client;
        async move { job_row(client, id).await.status == "succeeded" }
    })
    .await;
    assert_eq!(job_row(&client, id).await.attempts, 1);
    a.task.abort();
}

/// An owner without alive locks (behind a pooler, with a direct session) is judged by its own
/// heartbeat interval, stamped by its claim, and only by a replica that has itself reached the
/// database long enough for the owner to have reconnected.
#[tokio::test]
async fn an_owner_without_alive_locks_is_judged_by_its_own_heartbeat_and_the_judges_view() {
    use durable_etl::worker::claimer::{self, Claimant};
    use durable_etl::worker::rescuer::{self, Judgement, RECONNECT_GRACE};
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await[..] else {
        unreachable!()
    };
    let owner = Claimant {
        owner_id: "pooled",
        owner_locked: true,
        lease: Duration::from_secs(600),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    assert_eq!(claimer::claim(&client, owner, 1).await.unwrap().len(), 1);
    let renewed = |seconds: i32| {
        let client = &client;
        async move {
            client
                .execute(
                    "UPDATE etl_job_records
                        SET lease_renewed_at = now() - $1 * interval '1 second'",
                    &[&f64::from(seconds)],
                )
                .await
                .unwrap();
        }
    };
    let judge = |reachable_for| Judgement {
        heartbeat_interval: Duration::from_millis(800),
        reachable_for,
    };
    // Two of the judge's intervals, not of the owner's: alive.
    renewed(2).await;
    let recovered = rescuer::recover(&client, judge(Duration::MAX))
        .await
        .unwrap();
    assert_eq!(recovered.dead_owner, 0);
    // Two of the owner's intervals, but the judge itself reached the database only just now
    // (as after a server restart): alive, for the grace.
    renewed(9).await;
    let recovered = rescuer::recover(&client, judge(Duration::from_secs(6)))
        .await
        .unwrap();
    assert_eq!(recovered.dead_owner, 0);
    let long_enough = RECONNECT_GRACE + Duration::from_secs(9);
    let recovered = rescuer::recover(&client, judge(long_enough)).await.unwrap();
    assert_eq!(recovered.dead_owner, 1);
    assert_eq!(job_row(&client, id).await.status, "pending");
}

/// Kind of [`Hangs`].
const HANGS: &str = "test.hangs";

/// A handler whose compute phase never finishes; it reports when it starts and when its future
/// is dropped (the job abandoned).
#[derive(Clone)]
struct Hangs {
    /// Where `started` and `dropped` go.
    events: mpsc::UnboundedSender<&'static str>,
}

/// Sends `dropped` when the handler's future holding it is dropped.
struct DropSignal(mpsc::UnboundedSender<&'static str>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send("dropped");
    }
}

impl Handler for Hangs {
    fn kind(&self) -> &'static str {
        HANGS
    }

    fn prepare<'a>(
        &'a self,
        _job: &'a Arc<JobContext>,
        _payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            let _signal = DropSignal(self.events.clone());
            let _ = self.events.send("started");
            std::future::pending().await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_heartbeats_fail_abandons_its_job_before_the_lease_expires() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let [id] = insert_jobs(&client, HANGS, &[json!({})], 3).await[..] else {
        unreachable!()
    };
    // The pool goes through a proxy; the session does not, so only renewals are cut.
    let proxy = Proxy::in_front_of_test_server().await;
    let behind = DatabaseConfig {
        url: proxy.url_for(&db.config.url),
        ..db.config.clone()
    };
    let pool = durable_etl::db::connect_pool(&behind, "test")
        .await
        .unwrap();
    let mut cfg = config("cut-off", Duration::from_secs(5));
    cfg.session_database_url = Some(db.config.url.clone());
    let (events, mut happened) = mpsc::unbounded_channel();
    let worker = Worker::start(
        pool,
        &behind,
        cfg,
        Registry::new().register(Hangs { events }),
    )
    .await
    .unwrap();
    let a = Running::start(worker);
    assert_eq!(happened.recv().await, Some("started"));
    proxy.set_mode(Mode::Blackhole);
    // The job's own lease clock abandons it (its handler's future is dropped), however busy the
    // claim loop is with statements that the blackhole holds.
    let abandoned = tokio::time::timeout(Duration::from_secs(30), happened.recv())
        .await
        .expect("the job was never abandoned");
    assert_eq!(abandoned, Some("dropped"));
    // Abandoned while the database still grants the lease: nobody else could have taken it yet.
    let row = client
        .query_one(
            "SELECT status, lease_expires_at > now() FROM etl_job_records WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "running");
    assert!(
        row.get::<_, bool>(1),
        "abandoned only after the lease expired"
    );
    proxy.set_mode(Mode::Pass);
    eventually("the abandoned job to be counted as a lost lease", || {
        let stats = Arc::clone(&a.stats);
        async move { stats.snapshot().lease_lost == 1 }
    })
    .await;
    a.stop().await;
}
