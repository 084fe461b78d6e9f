//! The deployment topology of `compose.yaml` (one API, three worker replicas with stable owner
//! ids, one database), started as processes of the real binary, since no container engine runs
//! here.

use crate::support::{
    api_key, binary, count, counter, eventually, free_port, signal, until_serving, Processes,
    TestDb,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_api_and_three_replicas_share_the_work() {
    let db = TestDb::empty().await;
    let command = |args: &[&str]| binary(&db.config.url, args);
    assert!(command(&["migrate"]).status().unwrap().success());
    let key = api_key(&db.config.url);
    let api_addr = format!("127.0.0.1:{}", free_port());
    let mut processes = Processes(vec![command(&["serve", "--listen", &api_addr])
        .spawn()
        .unwrap()]);
    let mut metrics = Vec::new();
    for i in 1..=3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let owner = format!("worker-{i}");
        processes.0.push(
            command(&["work", "--owner-id", &owner, "--metrics-listen", &addr])
                .spawn()
                .unwrap(),
        );
        metrics.push(addr);
    }
    let http = reqwest::Client::new();
    until_serving(&http, &api_addr, &metrics).await;
    for i in 0..30 {
        let body = json!({"dataset": "events", "key": "id", "records": [{"id": i}]});
        let response = http
            .post(format!("http://{api_addr}/v1/etl-jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("deploy-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    let client = db.client().await;
    eventually("every job to succeed", || {
        let client = &client;
        async move { count(client, "etl_jobs WHERE status = 'succeeded'").await == 30 }
    })
    .await;
    assert_eq!(count(&client, "etl_jobs WHERE attempts <> 1").await, 0);
    let mut claimed = 0;
    for addr in &metrics {
        claimed += counter(&http, addr, "durable_etl_jobs_claimed").await;
    }
    assert_eq!(claimed, 30, "each job claimed once, across the replicas");
    for child in &mut processes.0 {
        signal(child, "TERM");
        assert_eq!(
            child.wait().unwrap().code(),
            Some(0),
            "graceful exit on SIGTERM"
        );
    }
}

/// A local endpoint in front of PostgreSQL whose first `dropped` connections are closed as soon
/// as they open (a connection lost during start-up), and whose `blackhole` connections are held
/// open without a byte ever answered. With `strip_options`, the `options` start-up parameter is
/// removed, as PgBouncer does with `ignore_startup_parameters = options`.
struct Endpoint {
    /// Where clients connect.
    addr: std::net::SocketAddr,
    /// Connections accepted so far.
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Endpoint {
    /// Starts the endpoint on a free port.
    async fn start(dropped: usize, blackhole: bool, strip_options: bool) -> Endpoint {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                if blackhole {
                    held.push(client);
                } else if n >= dropped {
                    tokio::spawn(relay(client, strip_options));
                }
            }
        });
        Endpoint { addr, accepted }
    }

    /// A URL of database `name` through this endpoint, without TLS (the relay rewrites the
    /// start-up packet, which TLS would hide from it).
    fn url(&self, name: &str) -> String {
        format!("postgres://postgres@{}/{name}?sslmode=disable", self.addr)
    }
}

/// Relays `client` to PostgreSQL, rewriting its start-up packet without `options` if asked.
async fn relay(mut client: tokio::net::TcpStream, strip_options: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut server = tokio::net::TcpStream::connect("127.0.0.1:5432")
        .await
        .unwrap();
    let len = client.read_i32().await.unwrap();
    let mut body = vec![0; usize::try_from(len).unwrap() - 4];
    client.read_exact(&mut body).await.unwrap();
    if strip_options {
        // Protocol version, then NUL-terminated name/value pairs, then a final NUL.
        let fields: Vec<&[u8]> = body[4..].split(|b| *b == 0).collect();
        let mut kept = body[..4].to_vec();
        for pair in fields
            .chunks(2)
            .filter(|p| p.len() == 2 && !p[0].is_empty())
        {
            if pair[0] != b"options" {
                for part in pair {
                    kept.extend_from_slice(part);
                    kept.push(0);
                }
            }
        }
        kept.push(0);
        body = kept;
    }
    server
        .write_i32(i32::try_from(body.len() + 4).unwrap())
        .await
        .unwrap();
    server.write_all(&body).await.unwrap();
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// Runs the binary with `args` and the environment `env`; waits at most a minute for its exit
/// (a hang kills it and fails the test) and returns its exit code and standard error.
async fn exit_of(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .args(args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reading = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait())
        .await
        .expect("the process hung at start-up")
        .unwrap();
    (status.code(), reading.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_server_at_start_up_exits_3_within_the_start_up_timeout() {
    let db = TestDb::migrated().await;
    let hole = Endpoint::start(0, true, false).await;
    let bounded = [("DURABLE_ETL_STARTUP_TIMEOUT", "2s")];
    // `migrate` connects directly (no pool): the start-up packet is never answered.
    let (code, err) = exit_of(&["--database-url", &hole.url("x"), "migrate"], &bounded).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("[database_unavailable]"), "{err}");
    // `work` reaches the database, then its session's direct connection is blackholed.
    let (code, err) = exit_of(
        &[
            "--database-url",
            &db.config.url,
            "work",
            "--owner-id",
            "blackholed",
            "--session-database-url",
            &hole.url(&db.name),
        ],
        &bounded,
    )
    .await;
    assert_eq!(code, Some(3), "{err}");
    assert!(hole.accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_during_start_up_is_retried() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // What a previous incarnation left running: a successful start releases it.
    let job = crate::support::insert_job(&client, "now()").await;
    let claim = uuid::Uuid::new_v4();
    client
        .execute(
            "UPDATE etl_job_records SET status = 'running', attempts = 1,
                    lease_owner_id = 'restarted', lease_claim_id = $2,
                    lease_expires_at = now() + interval '1 hour', lease_renewed_at = now()
              WHERE id = $1",
            &[&job, &claim],
        )
        .await
        .unwrap();
    let still_held = format!("etl_job_records WHERE lease_claim_id = '{claim}'");
    let flaky = Endpoint::start(2, false, false).await;
    let session_url = flaky.url(&db.name);
    let mut replica = Processes(vec![crate::support::spawn_replica(
        &db.config.url,
        "restarted",
        &["--session-database-url", &session_url],
        std::process::Stdio::null(),
    )]);
    // Released (the job may at once be claimed again, under a new claim).
    eventually(
        "the replica to start and release its previous jobs",
        || async { count(&client, &still_held).await == 0 },
    )
    .await;
    assert!(
        replica.0[0].try_wait().unwrap().is_none(),
        "the replica exited"
    );
    assert!(flaky.accepted.load(std::sync::atomic::Ordering::SeqCst) >= 3);
    signal(&replica.0[0], "TERM");
    assert_eq!(replica.0[0].wait().unwrap().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_pooler_that_drops_start_up_options_role_settings_are_required() {
    let db = TestDb::migrated().await;
    let pooler = Endpoint::start(0, false, true).await;
    let url = pooler.url(&db.name);
    let args = [
        "--database-url",
        url.as_str(),
        "work",
        "--owner-id",
        "pooled",
    ];
    let (code, err) = exit_of(&args, &[]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("[config_invalid]"), "{err}");
    assert!(err.contains("statement_timeout"), "{err}");
    // The documented fix: the settings on the role (here on the database, for isolation).
    let q = durable_etl::db::quote_ident(&db.name);
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {q} SET statement_timeout = '30s';
             ALTER DATABASE {q} SET lock_timeout = '5s';
             ALTER DATABASE {q} SET idle_in_transaction_session_timeout = '10s';"
        ))
        .await
        .unwrap();
    let mut replica = Processes(vec![crate::support::spawn_replica(
        &url,
        "pooled",
        &[],
        std::process::Stdio::null(),
    )]);
    let client = db.client().await;
    eventually("the replica behind the pooler to start", || async {
        count(
            &client,
            "pg_stat_activity WHERE datname = current_database() AND application_name = 'durable-etl/worker'",
        )
        .await
            >= 1
    })
    .await;
    signal(&replica.0[0], "TERM");
    assert_eq!(replica.0[0].wait().unwrap().code(), Some(0));
}
