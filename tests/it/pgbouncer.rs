//! The API and several replicas of the real binary through Debian's real PgBouncer (1.18), in
//! transaction mode and in session mode, with the role-level settings of docs/operations.md as
//! written: every job the API accepted ends succeeded once, with exact effects, and no statement
//! ever meets a prepared statement of another client (PgBouncer 1.18 has no protocol-level
//! prepared statements in transaction mode).

use crate::support::{
    api_key, assert_settled_once, binary, count, counter, eventually, free_port, signal,
    submit_load, until_serving, Pooler, Processes, TestDb,
};

/// How many jobs each test submits.
const JOBS: usize = 120;
/// Target rows of each job.
const RECORDS: usize = 5;

/// A migrated test database with docs/operations.md's role-level settings, as written (the role
/// is the tests' `postgres`, the database this test's own).
async fn migrated_with_role_settings() -> TestDb {
    let db = TestDb::empty().await;
    assert!(binary(&db.config.url, &["migrate"])
        .status()
        .unwrap()
        .success());
    let q = durable_etl::db::quote_ident(&db.name);
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER ROLE postgres IN DATABASE {q} SET statement_timeout = '30s';
             ALTER ROLE postgres IN DATABASE {q} SET lock_timeout = '5s';
             ALTER ROLE postgres IN DATABASE {q} SET idle_in_transaction_session_timeout = '10s';"
        ))
        .await
        .unwrap();
    db
}

/// Runs `serve` and `replicas` replicas through a PgBouncer in `pool_mode` whose pool holds
/// `server_connections` server connections (a handful, so that clients share them), the
/// processes started with `pooler_args` (plus, for replicas, `replica_args(direct URL)`);
/// submits [`JOBS`] ETL jobs through the API and checks that every one succeeds once with exact
/// effects. Returns, per replica, its `(unnamed claims, prepared statement misses)`.
async fn jobs_through_pgbouncer(
    pool_mode: &str,
    server_connections: u32,
    replicas: usize,
    pooler_args: &[&str],
    replica_args: impl Fn(&str) -> Vec<String>,
) -> Vec<(u64, u64)> {
    let db = migrated_with_role_settings().await;
    let key = api_key(&db.config.url);
    let pooler = Pooler::start_with(
        pool_mode,
        &format!("{} = host=127.0.0.1 port=5432 dbname={}", db.name, db.name),
        &format!(
            "ignore_startup_parameters = options\ndefault_pool_size = {server_connections}\n\
             max_client_conn = 500"
        ),
    );
    let pooled = pooler.url("postgres", &db.name);
    let api_addr = format!("127.0.0.1:{}", free_port());
    let mut serve = vec!["serve", "--listen", api_addr.as_str()];
    serve.extend_from_slice(pooler_args);
    let mut processes = Processes(vec![binary(&pooled, &serve).spawn().unwrap()]);
    let mut metrics = Vec::new();
    for i in 0..replicas {
        let addr = format!("127.0.0.1:{}", free_port());
        let owner = format!("pooled-{i}");
        let extra = replica_args(&db.config.url);
        let mut args = vec!["work", "--owner-id", &owner, "--metrics-listen", &addr];
        args.extend_from_slice(&["--slots", "4", "--poll-interval", "200ms"]);
        args.extend_from_slice(pooler_args);
        args.extend(extra.iter().map(String::as_str));
        processes.0.push(binary(&pooled, &args).spawn().unwrap());
        metrics.push(addr);
    }
    let http = reqwest::Client::new();
    until_serving(&http, &api_addr, &metrics).await;
    let mut monitors = Vec::new();
    for i in 0..JOBS {
        monitors.push(submit_load(&http, &api_addr, &key, i, RECORDS).await);
    }
    let client = db.client().await;
    eventually("every job to succeed", || {
        let client = &client;
        async move {
            count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == JOBS as i64
        }
    })
    .await;
    assert_settled_once(&client, (JOBS * RECORDS) as i64).await;
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE attempts <> 1").await,
        0,
        "no job needed a second attempt"
    );
    // The API reads through the pooler too: each job's monitor and the owner's list.
    for monitor in monitors.iter().step_by(10) {
        let status: serde_json::Value = http
            .get(format!("http://{api_addr}{monitor}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(status["status"], "succeeded", "{monitor}");
    }
    let list = http
        .get(format!("http://{api_addr}/v1/etl-jobs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let mut seen = Vec::new();
    for addr in &metrics {
        seen.push((
            counter(&http, addr, "durable_etl_claims_unnamed").await,
            counter(&http, addr, "durable_etl_prepared_statement_misses").await,
        ));
    }
    for child in &mut processes.0 {
        signal(child, "TERM");
        assert_eq!(child.wait().unwrap().code(), Some(0), "graceful exit");
    }
    seen
}

/// Transaction mode, the general pool of every process through the pooler and only the
/// replicas' sessions (LISTEN, owner lock) direct: a handful of server connections serve every
/// client, no named statement is sent (none could meet another client's), and each claim sets
/// its planner switches in its own transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_transaction_mode_every_job_succeeds_once_with_exact_effects() {
    let args = ["--pooler", "transaction", "--pool-size", "4"];
    let seen = jobs_through_pgbouncer("transaction", 4, 4, &args, |direct| {
        vec!["--session-database-url".to_owned(), direct.to_owned()]
    })
    .await;
    for (unnamed, misses) in seen {
        assert!(unnamed > 0, "claims are sent unnamed");
        assert_eq!(misses, 0, "no prepared statement was missing or duplicated");
    }
}

/// Session mode: every process through the pooler, sessions included (each client keeps its
/// server connection, so LISTEN and the locks work); the claim sessions set their planner
/// switches themselves, since the pooler drops start-up options, and prepare their claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_every_job_succeeds_once_with_exact_effects() {
    // Each client holds a server connection: 2 replicas of 1 session, 2 claim, 3 commit and 2
    // pooled connections, and the API's 2 pooled and 1 notifier connections.
    let args = ["--pooler", "session", "--pool-size", "2"];
    let seen = jobs_through_pgbouncer("session", 25, 2, &args, |_| Vec::new()).await;
    for (unnamed, misses) in seen {
        assert_eq!(unnamed, 0, "claims are prepared");
        assert_eq!(misses, 0);
    }
}

/// How many times [`without_the_flag_a_replica_stops_with_one_message_naming_it`] starts the
/// replica.
const MISCONFIGURED_RUNS: usize = 5;

/// A replica started without `--pooler transaction` on a transaction-mode PgBouncer stops, every
/// time, with exit code 2 and one message that names the flag, within a start-up's time, without
/// retrying in a loop (a few warnings at most), and without touching a job: the due jobs stay
/// pending and unclaimed. Some runs start while other clients keep the pooler's server
/// connections busy, so that its server connections move in every pattern a deployment sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_a_replica_stops_with_one_message_naming_it() {
    let db = migrated_with_role_settings().await;
    let client = db.client().await;
    let payloads = vec![serde_json::json!({}); 20];
    crate::support::insert_jobs(&client, durable_etl::job::handler::NOOP_KIND, &payloads, 5).await;
    let pooler = Pooler::start_with(
        "transaction",
        &format!("{} = host=127.0.0.1 port=5432 dbname={}", db.name, db.name),
        "ignore_startup_parameters = options\ndefault_pool_size = 4",
    );
    let pooled = pooler.url("postgres", &db.name);
    for run in 0..MISCONFIGURED_RUNS {
        // Odd runs: another client's transactions come and go through the pooler meanwhile.
        let busy = (run % 2 == 1).then(|| {
            let pooled = pooled.clone();
            tokio::spawn(async move {
                let (other, connection) = tokio_postgres::connect(&pooled, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                loop {
                    let _ = other.simple_query("SELECT pg_sleep(0.002)").await;
                }
            })
        });
        let owner = format!("unpooled-{run}");
        let started = std::time::Instant::now();
        let mut child = binary(&pooled, &["work", "--owner-id", &owner])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                signal(&child, "KILL");
                panic!("run {run}: the replica was still running after 30 s");
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        if let Some(busy) = busy {
            busy.abort();
        }
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "run {run}: exit code\n{stderr}");
        let exit_messages: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("durable-etl: "))
            .collect();
        assert_eq!(exit_messages.len(), 1, "run {run}: one message\n{stderr}");
        assert!(
            exit_messages[0].contains("--pooler transaction"),
            "run {run}: the message names the flag\n{stderr}"
        );
        let warnings = stderr.lines().filter(|l| l.contains("WARN")).count();
        assert!(warnings <= 3, "run {run}: {warnings} warnings\n{stderr}");
    }
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE status = 'pending' AND attempts = 0"
        )
        .await,
        20,
        "every job still pending, never claimed"
    );
}
