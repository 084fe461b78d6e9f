//! The execution and group-commit path under hostile handlers and blocked commits: a handler
//! that panics before returning its future, handler code that kills a commit lane, and a
//! shutdown whose commit is blocked in the database.

use crate::faults::{assert_done_once, locked_update, replica, until_load_waits};
use crate::handlers::{Noop, Scripted, NOOP, SCRIPTED};
use crate::support::{
    count, insert_jobs, job_row, pool, signal, until_all_terminal, Processes, TestDb, LEDGERS,
};
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use durable_etl::shutdown::{self, Stage};
use durable_etl::worker::stats::StatsSnapshot;
use durable_etl::worker::Worker;
use serde_json::json;
use std::process::{Child, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A replica configuration with fast timers and short retry delays.
fn config(owner: &str, slots: usize) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots,
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(3),
        heartbeat_interval: Duration::from_millis(200),
        shutdown_grace: Duration::from_millis(300),
        retry_min_delay: Duration::from_millis(50),
        retry_max_delay: Duration::from_millis(200),
        ..WorkerConfig::default()
    }
}

/// A replica running on a task, and how to stop it.
struct Running {
    /// Asks the replica to drain.
    trigger: shutdown::Trigger,
    /// The replica's run.
    run: tokio::task::JoinHandle<Result<(), durable_etl::error::Error>>,
    /// The replica's live counters.
    stats: std::sync::Arc<durable_etl::worker::stats::WorkerStats>,
}

impl Running {
    /// Starts a replica on `db` with `cfg`, running [`Noop`] and `scripted`.
    async fn start(db: &TestDb, cfg: WorkerConfig, scripted: Scripted) -> Running {
        let registry = Registry::new().register(Noop).register(scripted);
        let worker = Worker::start(pool(db).await, &db.config, cfg, registry)
            .await
            .unwrap();
        let stats = worker.stats_handle();
        let (trigger, shutdown) = shutdown::manual();
        let run = tokio::spawn(worker.run(shutdown));
        Running {
            trigger,
            run,
            stats,
        }
    }

    /// Drains the replica; returns its counters.
    async fn stop(self) -> StatsSnapshot {
        self.trigger.request(Stage::Draining);
        self.run.await.unwrap().unwrap();
        self.stats.snapshot()
    }
}

/// Asserts that every job of `ids` ended `status` (with `code`) at attempt 1.
async fn assert_ended(
    client: &tokio_postgres::Client,
    ids: &[uuid::Uuid],
    status: &str,
    code: Option<&str>,
) {
    for &id in ids {
        let row = job_row(client, id).await;
        assert_eq!(
            (
                row.status.as_str(),
                row.failure_code.as_deref(),
                row.attempts
            ),
            (status, code, 1)
        );
        assert!(!row.live && row.lease_cleared);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_before_returning_its_future_fails_its_job_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let payloads = ["panic_at_call", "ok"].map(|a| json!({ "do": a }));
    let ids = insert_jobs(&client, SCRIPTED, &payloads, 3).await;
    let scripted = Scripted::default();
    let replica = Running::start(&db, config("prepare-panics", 8), scripted.clone()).await;
    until_all_terminal(&client).await;
    let stats = replica.stop().await;
    assert_ended(&client, &ids[..1], "failed", Some("handler_panicked")).await;
    assert_ended(&client, &ids[1..], "succeeded", None).await;
    // Each ran once: no loop of releases and re-claims.
    assert_eq!(scripted.prepares.load(Ordering::SeqCst), 2);
    assert_eq!((stats.panicked, stats.released), (1, 0));
}

/// On a one-slot replica (so each job is a batch of its own, committed by each lane in turn),
/// runs `n` jobs doing `action`, then four `noop` jobs and a `write` job, and asserts that the
/// latter all succeed. Returns the database, a client on it and the first jobs' ids.
async fn then_every_kind_commits(
    owner: &str,
    action: &str,
    n: usize,
) -> (TestDb, tokio_postgres::Client, Vec<uuid::Uuid>) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = Running::start(&db, config(owner, 1), Scripted::default()).await;
    let first = insert_jobs(&client, SCRIPTED, &vec![json!({ "do": action }); n], 3).await;
    until_all_terminal(&client).await;
    let noops = insert_jobs(&client, NOOP, &vec![json!({}); 4], 3).await;
    let writes = insert_jobs(&client, SCRIPTED, &[json!({"do": "write"})], 3).await;
    until_all_terminal(&client).await;
    replica.stop().await;
    assert_ended(&client, &noops, "succeeded", None).await;
    assert_ended(&client, &writes, "succeeded", None).await;
    assert_eq!(count(&client, "etl_target_rows").await, 1);
    (db, client, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_panics_in_apply_leave_the_replica_committing_every_kind() {
    let (_db, client, panicky) =
        then_every_kind_commits("apply-panics", "apply_panics_at_call", 2).await;
    assert_ended(&client, &panicky, "failed", Some("handler_panicked")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_that_panic_when_dropped_neither_end_a_lane_nor_abort_the_replica() {
    // Three of them, claimed together, commit in batches of more than one: a panic in one's
    // drop, unwinding through the drop of the others, used to abort the whole process. Their
    // `apply` runs (they are not `NoEffects`) and consumes them, so each panics in its own
    // guarded call: each job fails once, and every kind commits after. (Effects dropped
    // unapplied in a lane: `group_commit::transaction_tests`.)
    let (_db, client, dying) = then_every_kind_commits("drop-panics", "drop_panics", 3).await;
    assert_ended(&client, &dying, "failed", Some("handler_panicked")).await;
    assert_eq!(count(&client, LEDGERS).await, 4 + 1);
}
/// Waits up to `limit` for `child` to exit; `None` if it is still running then.
async fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_after_the_grace_even_with_a_commit_blocked_on_a_row_lock() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    // The load's statement would wait a minute for the row the test holds.
    let mut replicas = Processes(vec![replica(
        &db,
        "blocked",
        &["--shutdown-grace", "1s", "--lock-timeout", "60s"],
    )]);
    until_load_waits(&client).await;
    signal(&replicas.0[0], "TERM");
    // A liveness bound, not a speed claim: the grace is 1 s, the row lock would hold for 60 s.
    let status = exit_within(&mut replicas.0[0], Duration::from_secs(10)).await;
    assert_eq!(
        status.map(|s| s.code()),
        Some(Some(0)),
        "the replica exits soon after its grace"
    );
    // Nothing of the load committed; the job was released with its attempt given back.
    let row = job_row(&client, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 0));
    assert!(row.live && row.lease_cleared);
    // Another replica then runs it exactly once.
    holder.batch_execute("ROLLBACK").await.unwrap();
    replicas.0.push(replica(&db, "successor", &[]));
    assert_done_once(&client, id, 1).await;
    signal(&replicas.0[1], "TERM");
    assert_eq!(
        exit_within(&mut replicas.0[1], Duration::from_secs(10))
            .await
            .map(|s| s.code()),
        Some(Some(0))
    );
}
