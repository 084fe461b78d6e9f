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
    let db = TestDb::empty().await;
    assert!(binary(&db.config.url, &["migrate"])
        .status()
        .unwrap()
        .success());
    // docs/operations.md's role-level settings, as written (the role is the tests' `postgres`,
    // the database this test's own).
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
