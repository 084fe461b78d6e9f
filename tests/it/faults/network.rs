//! Network faults between a replica and PostgreSQL, through the test proxy: a silently lost
//! network (blackhole) and a COMMIT whose reply never arrives.

use super::{assert_done_once, locked_update, replica, until_all_terminal, until_load_waits};
use crate::proxy::{Mode, Proxy};
use crate::support::{
    assert_settled_once, count, enqueue_loads, eventually, free_port, signal, spawn_replica,
    Processes, TestDb, LEDGERS,
};
use std::process::Stdio;

/// Flags of a replica behind the proxy: a short lease, frequent heartbeats, and a short idle
/// transaction timeout, so a partition frees its row locks and leases quickly.
const PARTITIONED_ARGS: &[&str] = &[
    "--lease",
    "2s",
    "--heartbeat-interval",
    "500ms",
    "--lock-timeout",
    "60s",
    "--idle-in-transaction-timeout",
    "1s",
    "--connect-timeout",
    "1s",
];

/// Waits until the replica serves its metrics at `addr`, which it does once started.
async fn until_metrics(addr: &str) {
    eventually("the replica's metrics endpoint", || async move {
        reqwest::get(format!("http://{addr}/metrics")).await.is_ok()
    })
    .await;
}

/// Starts a proxy and, behind it, a replica `owner` of `db` with `args`, serving metrics; waits
/// until it has started. Returns the proxy, the metrics address and the replica.
async fn behind_proxy(
    db: &TestDb,
    owner: &str,
    args: &[&str],
    stderr: Stdio,
) -> (Proxy, String, Processes) {
    let proxy = Proxy::in_front_of_test_server().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let replica = spawn_replica(
        &proxy.url_for(&db.config.url),
        owner,
        &[args, &["--metrics-listen", &metrics]].concat(),
        stderr,
    );
    let replicas = Processes(vec![replica]);
    // Metrics are served once start-up is over, so no fault can stall start-up itself.
    until_metrics(&metrics).await;
    (proxy, metrics, replicas)
}

/// Reads counter `name` from the replica metrics served at `addr`.
async fn metric(addr: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// Blackholes a replica while its load waits for a row lock, then checks that a direct replica
/// finishes that job and later ones exactly once, and that the partitioned replica, once its
/// traffic flows again, commits nothing stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_replica_loses_its_job_and_commits_nothing_stale() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, id) = locked_update(&db, &client).await;
    let proxy = Proxy::in_front_of_test_server().await;
    let behind = proxy.url_for(&db.config.url);
    let mut replicas = Processes(vec![spawn_replica(
        &behind,
        "partitioned",
        PARTITIONED_ARGS,
        Stdio::null(),
    )]);
    until_load_waits(&client).await;
    proxy.set_mode(Mode::Blackhole);
    // The partitioned load now takes the row lock and writes, but its result is held by the
    // partition: the backend sits idle in transaction until the timeout ends it.
    holder.batch_execute("ROLLBACK").await.unwrap();
    replicas.0.push(replica(&db, "direct", &[]));
    let later = enqueue_loads(&client, "later", 20, 2, 5).await;
    assert_done_once(&client, id, 2).await;
    until_all_terminal(&client).await;
    // Let the partitioned replica notice the loss: its session probe times out and it tries
    // to reconnect (through the partition).
    eventually("the partitioned session to try to reconnect", || {
        let proxy = &proxy;
        async move { proxy.startups_of("durable-etl/session") >= 2 }
    })
    .await;
    proxy.set_mode(Mode::Pass);
    // Everything it held back arrives now; then it is asked to stop, and it stops either way.
    signal(&replicas.0[0], "TERM");
    replicas.0[0].wait().unwrap();
    assert_done_once(&client, id, 2).await;
    for later_id in &later {
        assert_eq!(
            count(
                &client,
                &format!(
                    "etl_jobs WHERE id = '{later_id}' AND status = 'succeeded' AND attempts = 1"
                )
            )
            .await,
            1
        );
    }
    assert_eq!(
        count(
            &client,
            &format!("{LEDGERS} AND (output ->> 'rows_inserted')::int = 2")
        )
        .await,
        20
    );
    assert_eq!(
        count(&client, "etl_target_rows WHERE record_key LIKE 'later-%'").await,
        40
    );
    signal(&replicas.0[1], "TERM");
    assert_eq!(replicas.0[1].wait().unwrap().code(), Some(0));
}

/// After a partition heals, a replica that lost its session keeps its owner id: it takes its
/// owner lock again and goes on working. Its previous session is half-open (PostgreSQL still
/// holds it, and the owner lock with it), and must not count as a twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_partition_heals_keeps_its_owner_id_and_works_on() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let log = tempfile_path("healed");
    let (proxy, _, mut replicas) = behind_proxy(
        &db,
        "healed",
        PARTITIONED_ARGS,
        Stdio::from(std::fs::File::create(&log).unwrap()),
    )
    .await;
    proxy.set_mode(Mode::Blackhole);
    eventually("the session to notice the partition", || {
        let proxy = &proxy;
        async move { proxy.startups_of("durable-etl/session") >= 2 }
    })
    .await;
    // The held-back bytes flow now: the new session's owner lock must not be refused because the
    // replica's own previous session (alive on the server all along) still holds it.
    proxy.set_mode(Mode::Pass);
    enqueue_loads(&client, "healed", 5, 2, 5).await;
    let mut exited = None;
    eventually("the jobs to end or the replica to exit", || {
        let status = replicas.0[0].try_wait().unwrap();
        exited = exited.or(status);
        let client = &client;
        async move {
            status.is_some() || count(client, "etl_jobs WHERE status <> 'succeeded'").await == 0
        }
    })
    .await;
    assert!(
        exited.is_none(),
        "the healed replica exited ({exited:?}) instead of working on; its log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_settled_once(&client, 10).await;
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
}

/// Every connection of a replica is dropped (both sides closed) five times while 300 jobs flow:
/// each time it reconnects its session and its pool and goes on, and every job loads once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_connections_are_dropped_mid_flow_reconnects_and_loads_each_job_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (proxy, _, mut replicas) = behind_proxy(
        &db,
        "dropped",
        &["--lease", "2s", "--heartbeat-interval", "500ms"],
        Stdio::null(),
    )
    .await;
    for round in 1..=5 {
        enqueue_loads(&client, &format!("drop{round}"), 60, 2, 10).await;
        proxy.drop_all();
        eventually("the session to come back", || {
            let proxy = &proxy;
            async move { proxy.startups_of("durable-etl/session") > round }
        })
        .await;
    }
    until_all_terminal(&client).await;
    assert_settled_once(&client, 600).await;
    assert!(
        replicas.0[0].try_wait().unwrap().is_none(),
        "the replica runs on"
    );
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
}

/// A fresh path in the temporary directory for a replica's log.
fn tempfile_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "durable-etl-{name}-{}.log",
        uuid::Uuid::new_v4().simple()
    ))
}

/// The proxy forwards a replica's COMMIT and closes the connection before the server's reply
/// reaches it: the job committed, the replica cannot know. It must settle the job through the
/// ledger (success, counted once) and never run the load again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_reply_is_lost_is_resolved_through_the_ledger_and_never_rerun() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (proxy, metrics, mut replicas) = behind_proxy(&db, "unlucky", &[], Stdio::null()).await;
    proxy.cut_next_commit();
    let [id] = enqueue_loads(&client, "cut", 1, 3, 5).await[..] else {
        unreachable!()
    };
    eventually("a COMMIT to be cut", || {
        let proxy = &proxy;
        async move { proxy.commits_cut() == 1 }
    })
    .await;
    // The replica goes on: later jobs commit normally.
    enqueue_loads(&client, "after", 5, 3, 5).await;
    until_all_terminal(&client).await;
    assert_settled_once(&client, 18).await;
    let row = crate::support::job_row(&client, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("succeeded", 1));
    eventually("the replica to count every success once", || {
        let metrics = &metrics;
        async move { metric(metrics, "durable_etl_jobs_succeeded_total").await == 6 }
    })
    .await;
    for name in [
        "durable_etl_jobs_retried_total",
        "durable_etl_lease_lost_total",
        "durable_etl_transitions_unwritten_total",
    ] {
        assert_eq!(metric(&metrics, name).await, 0, "{name}");
    }
    signal(&replicas.0[0], "TERM");
    assert_eq!(replicas.0[0].wait().unwrap().code(), Some(0));
}

/// How long the server stays away in
/// [`during_an_outage_a_replica_tries_a_few_times_a_second_and_reconnects_promptly`]: long
/// enough for any backoff to reach its longest pause.
const OUTAGE: std::time::Duration = std::time::Duration::from_secs(8);

/// At most this many connection attempts a second reach a dead server from one replica.
const ATTEMPTS_PER_SECOND: usize = 4;

/// The server behind the proxy goes away (every connection closed, every new one closed once
/// its startup packet arrives) for [`OUTAGE`]: the replica keeps trying at most
/// [`ATTEMPTS_PER_SECOND`] times a second, whichever of its pools and its session asks, once the
/// connections it had in flight when the server went have failed (the first second). The server
/// comes back right after one of the session's attempts failed (the pause after it is the one
/// that counts): the session is up again and a job enqueued during the outage is claimed
/// within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_an_outage_a_replica_tries_a_few_times_a_second_and_reconnects_promptly() {
    use std::time::{Duration, Instant};
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (proxy, metrics, _replica) = behind_proxy(&db, "outage", &[], Stdio::null()).await;
    eventually("the session up", || {
        let metrics = &metrics;
        async move { metric(metrics, "durable_etl_session_up").await == 1 }
    })
    .await;
    proxy.set_mode(Mode::Refuse);
    proxy.drop_all();
    let down = Instant::now();
    let ids = crate::support::insert_jobs(
        &client,
        durable_etl::job::handler::NOOP_KIND,
        &[serde_json::json!({})],
        5,
    )
    .await;
    tokio::time::sleep(OUTAGE).await;
    let settled = down + Duration::from_secs(1);
    let attempts = proxy.refused_since(settled);
    let seconds = usize::try_from((Instant::now() - settled).as_secs()).unwrap() + 1;
    assert!(
        !attempts.is_empty() && attempts.len() <= ATTEMPTS_PER_SECOND * seconds,
        "{} attempts in about {seconds} s: {attempts:?}",
        attempts.len()
    );
    let session = |since| {
        proxy
            .refused_since(since)
            .into_iter()
            .filter(|(_, app)| app == "durable-etl/session")
            .count()
    };
    let now = Instant::now();
    while session(now) == 0 {
        assert!(now.elapsed() < Duration::from_secs(20), "the session tries");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set_mode(Mode::Pass);
    let up = Instant::now();
    loop {
        let claimed = count(&client, "etl_job_records WHERE status = 'pending'").await == 0;
        if metric(&metrics, "durable_etl_session_up").await == 1 && claimed {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(2),
            "the session up and job {} claimed within 2 s of the server's return",
            ids[0]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
