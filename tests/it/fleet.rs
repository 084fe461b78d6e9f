//! Many replicas on one server (docs/operations.md, "Connection budget"): 24 replica processes of
//! the real binary, through a real PgBouncer in transaction mode, share a private server whose
//! `max_connections` is PostgreSQL's default 100, and drain a burst with nothing lost, nothing
//! run twice, and no connection refused for want of a slot.

use crate::support::{
    assert_settled_once, binary, connect, count, enqueue_loads, until_all_terminal, Cluster,
    Pooler, Processes,
};
use durable_etl::config::{DatabaseConfig, Pooler as PoolerMode, WorkerConfig};
use durable_etl::worker::budget::Budget;

/// Replica processes.
const REPLICAS: usize = 24;
/// PgBouncer's server connections for the database (`default_pool_size`).
const SERVER_POOL: u32 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dozen_replicas_through_pgbouncer_drain_a_burst_on_a_100_connection_server() {
    let cluster = Cluster::start_with("max_connections = 100");
    let direct = cluster.url("fleet");
    assert!(binary(&direct, &["migrate", "--create-database"])
        .status()
        .unwrap()
        .success());
    let pooler = Pooler::start_with(
        "transaction",
        &format!(
            "fleet = host=127.0.0.1 port={} dbname=fleet",
            cluster.port()
        ),
        &format!(
            "ignore_startup_parameters = options\ndefault_pool_size = {SERVER_POOL}\n\
             max_client_conn = 1000"
        ),
    );
    let pooled = pooler.url("postgres", "fleet");
    let config: tokio_postgres::Config = direct.parse().unwrap();
    let client = connect(&config).await;
    client
        .batch_execute(
            "ALTER ROLE postgres IN DATABASE fleet SET statement_timeout = '30s';
             ALTER ROLE postgres IN DATABASE fleet SET lock_timeout = '5s';
             ALTER ROLE postgres IN DATABASE fleet SET idle_in_transaction_session_timeout = '10s';",
        )
        .await
        .unwrap();
    let flags = [
        "--pooler",
        "transaction",
        "--pool-size",
        "2",
        "--slots",
        "2",
        "--poll-interval",
        "500ms",
        "--session-database-url",
        &direct,
    ];
    let mut replicas = Processes(Vec::new());
    for i in 0..REPLICAS {
        let owner = format!("fleet-{i}");
        let mut args = vec!["work", "--owner-id", owner.as_str()];
        args.extend_from_slice(&flags);
        replicas.0.push(binary(&pooled, &args).spawn().unwrap());
    }
    crate::support::eventually("every replica's session to connect", || async {
        count(
            &client,
            "pg_stat_activity WHERE datname = current_database()
               AND application_name = 'durable-etl/session'",
        )
        .await
            == REPLICAS as i64
    })
    .await;
    enqueue_loads(&client, "fleet", 3_000, 2, 3).await;
    // Sampled until the burst drains (`eventually` cannot carry state out of its check).
    let mut peak = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while count(&client, "etl_job_records").await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the burst did not drain"
        );
        let backends = count(
            &client,
            "pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'",
        );
        peak = peak.max(backends.await);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    until_all_terminal(&client).await;
    assert_settled_once(&client, 6_000).await;
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE status = 'succeeded'").await,
        3_000
    );
    println!("{REPLICAS} replicas: at most {peak} client backends of 100");
    // The sizing rule of docs/operations.md: the pooler's server pool, one direct session per
    // replica, and this test's own connection.
    let budget = Budget::replica(
        &DatabaseConfig {
            pool_max_size: 2,
            pooler: PoolerMode::Transaction,
            ..DatabaseConfig::default()
        },
        &WorkerConfig {
            session_database_url: Some(direct.clone()),
            ..WorkerConfig::default()
        },
    );
    assert_eq!(budget.session, 1);
    assert!(
        peak <= i64::from(SERVER_POOL) + (REPLICAS as i64) * i64::from(budget.session) + 1,
        "{peak} backends"
    );
    let log = cluster.log();
    assert!(!log.contains("too many clients"), "53300 in the server log");
    assert!(!log.contains("remaining connection slots are reserved"));
    for replica in &mut replicas.0 {
        assert!(replica.try_wait().unwrap().is_none(), "a replica exited");
        crate::support::signal(replica, "TERM");
        assert_eq!(replica.wait().unwrap().code(), Some(0));
    }
}
