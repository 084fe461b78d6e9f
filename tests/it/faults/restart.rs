//! PostgreSQL restarts and crashes under load. Restarting the shared test server would break
//! every other test, so these tests run their own private cluster ([`Cluster`]).

use crate::support::{
    assert_settled_once, connect, enqueue_loads, eventually, signal, spawn_replica, Cluster,
    Processes, LEDGERS,
};
use std::process::{Command, Stdio};

/// Creates and migrates the database at `url` with the real binary.
fn migrate(url: &str) {
    let migrated = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .args(["migrate", "--create-database"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(migrated.success());
}

/// Two replicas burn through a thousand jobs; PostgreSQL is restarted (`pg_ctl -m fast
/// restart`) in the middle. Every job ends, none is lost, each succeeded job has exactly one
/// ledger row, and the replicas survive and reconnect: jobs enqueued after the restart are
/// picked up too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_burn_loses_nothing_and_the_replicas_reconnect() {
    let cluster = Cluster::start();
    let url = cluster.url("etl");
    migrate(&url);
    let config: tokio_postgres::Config = url.parse().unwrap();
    let client = connect(&config).await;
    let args = ["--lease", "3s", "--heartbeat-interval", "500ms"];
    let mut replicas = Processes(
        ["phoenix-a", "phoenix-b"]
            .iter()
            .map(|o| spawn_replica(&url, o, &args, Stdio::null()))
            .collect(),
    );
    enqueue_loads(&client, "before", 1000, 2, 5).await;
    eventually("the burn to be under way", || {
        let client = &client;
        async move { crate::support::count(client, LEDGERS).await >= 50 }
    })
    .await;
    let unfinished = crate::support::count(&client, "etl_job_records").await;
    cluster.pg_ctl(&["-m", "fast", "restart"]);
    println!("restarted PostgreSQL with {unfinished} of 1000 jobs unfinished");
    let client = connect(&config).await;
    enqueue_loads(&client, "after", 100, 2, 5).await;
    super::until_all_terminal(&client).await;
    assert_settled_once(&client, 2200).await;
    for replica in &mut replicas.0 {
        assert!(replica.try_wait().unwrap().is_none(), "a replica died");
        signal(replica, "TERM");
        assert_eq!(replica.wait().unwrap().code(), Some(0));
    }
}

/// A claim is durable before the claimer sees it, so its handler never starts on a claim that a
/// server crash can undo: after the server is killed (`pg_ctl -m immediate stop`, no checkpoint)
/// right after the claim returned, the job is still `running` under that claim, with its attempt
/// counted and its fencing token taken, and a second claimer gets nothing. The WAL writer's
/// background flush is held off for 10 s, so a claim that committed without waiting for its WAL
/// flush is lost by the crash, and its token and attempt are handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crash_after_a_claim_never_hands_its_fencing_token_to_a_second_attempt() {
    use durable_etl::worker::claimer::{claim, Claimant};
    let cluster = Cluster::start_with("wal_writer_delay = 10s\nwal_writer_flush_after = 0");
    let url = cluster.url("etl");
    migrate(&url);
    let config: tokio_postgres::Config = url.parse().unwrap();
    let client = connect(&config).await;
    let [id] = crate::support::insert_jobs(
        &client,
        crate::handlers::SCRIPTED,
        &[serde_json::json!({"do": "write"})],
        3,
    )
    .await[..] else {
        unreachable!()
    };
    let claimant = |owner_id| Claimant {
        owner_id,
        owner_locked: true,
        lease: std::time::Duration::from_secs(60),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    let first = claim(&client, claimant("before-crash"), 1).await.unwrap();
    let (claim_id, token) = (first[0].claim_id(), first[0].ctx.fencing_token);
    cluster.pg_ctl(&["-m", "immediate", "stop"]);
    cluster.pg_ctl(&["start"]);
    let client = connect(&config).await;
    let row = client
        .query_one(
            "SELECT status, lease_claim_id, fencing_token, attempts FROM etl_job_records
              WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, Option<uuid::Uuid>>(1),
            row.get::<_, i64>(2),
            row.get::<_, i32>(3)
        ),
        ("running".to_owned(), Some(claim_id), token, 1),
        "the claim survived the crash"
    );
    let second = claim(&client, claimant("after-crash"), 1).await.unwrap();
    assert!(second.is_empty(), "the job was claimed a second time");
}

/// A server restart longer than two heartbeat intervals, with jobs computing on two replicas:
/// nobody can renew during the outage, and the first replica back sees every owner lock gone,
/// yet no replica takes another's jobs for a dead owner's (recovery gives every owner time to
/// reconnect, counted from when the server, and the recovering replica, came back). Every job
/// succeeds on its first charged attempt, and none is recovered: a replica that stopped trusting
/// its leases during the outage gives its jobs back uncharged once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_with_jobs_computing_on_two_replicas_recovers_none_of_them() {
    let cluster = Cluster::start();
    let url = cluster.url("etl");
    migrate(&url);
    let config: tokio_postgres::Config = url.parse().unwrap();
    let client = connect(&config).await;
    let args = [
        "--lease",
        "15s",
        "--heartbeat-interval",
        "500ms",
        "--slots",
        "2",
    ];
    let mut replicas = Processes(
        ["restart-a", "restart-b"]
            .iter()
            .map(|o| spawn_replica(&url, o, &args, Stdio::null()))
            .collect(),
    );
    let pause = serde_json::json!({"pause_ms": 9000});
    let ids = crate::support::insert_jobs(&client, "noop", &vec![pause; 4], 5).await;
    eventually("both replicas to compute jobs", || {
        let client = &client;
        async move {
            let owners: Vec<String> = crate::support::first_column(
                client,
                "SELECT DISTINCT lease_owner_id FROM etl_job_records WHERE status = 'running'",
            )
            .await;
            owners.len() == 2
                && crate::support::count(client, "etl_job_records WHERE status = 'running'").await
                    == 4
        }
    })
    .await;
    // Down for four heartbeat intervals and more.
    cluster.pg_ctl(&["-m", "fast", "stop"]);
    std::thread::sleep(std::time::Duration::from_secs(2));
    cluster.pg_ctl(&["start"]);
    let client = connect(&config).await;
    super::until_all_terminal(&client).await;
    for id in ids {
        let row = crate::support::job_row(&client, id).await;
        assert_eq!((row.status.as_str(), row.attempts), ("succeeded", 1));
    }
    // An outage longer than a replica's trust after its last beat (1.5 s) makes it abandon its
    // jobs; once the server is back it gives each back uncharged (`released`), since no judge
    // took any of them (every judge waits out its reconnect grace).
    assert_eq!(
        crate::support::count(&client, "etl_job_attempts WHERE ending <> 'released'").await,
        0,
        "no attempt was recovered or charged"
    );
    for replica in &mut replicas.0 {
        assert!(replica.try_wait().unwrap().is_none(), "a replica died");
        signal(replica, "TERM");
        assert_eq!(replica.wait().unwrap().code(), Some(0));
    }
}
