//! Cells: deployments in schemas of their own, several in one database, each with its own
//! tables, wake channel, owner locks and enqueue barriers; and the checks that keep a cell's
//! session in its schema.

use crate::handlers::{Noop, NOOP};
use crate::support::{count, eventually, expire_and_recover, insert_jobs, TestDb};
use crate::wake::{config, until_succeeded, Replica};
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::error::Error;
use durable_etl::job::handler::Registry;
use durable_etl::{db, schema};
use serde_json::json;
use std::time::Duration;
use tokio_postgres::Client;

/// `db`'s configuration for cell `cell`.
fn cell_config(db: &TestDb, cell: &str) -> DatabaseConfig {
    DatabaseConfig {
        cell: Some(cell.to_owned()),
        ..db.config.clone()
    }
}

/// A session of cell `cfg` (its search path is the cell's schema alone).
async fn session(cfg: &DatabaseConfig) -> Client {
    db::connect(cfg, "test").await.unwrap()
}

/// Starts a replica of cell `cfg`, owner `owner`, polling once a minute (only wakes bring
/// work), running no-op jobs; waits for its start-up claim.
async fn start(cfg: &DatabaseConfig, owner: &str) -> Replica {
    let pool = db::connect_pool(cfg, "test").await.unwrap();
    let replica = Replica::start_pooled(
        (pool, cfg),
        config(owner, Duration::from_secs(60), 4),
        Registry::new().register(Noop),
    )
    .await;
    let stats = std::sync::Arc::clone(&replica.stats);
    eventually("the start-up claim", || {
        let stats = std::sync::Arc::clone(&stats);
        async move { stats.snapshot().claims == 1 }
    })
    .await;
    replica
}

/// The channel, barrier key space and owner-lock key of owner `one` that `client`'s deployment
/// uses.
async fn names(client: &Client) -> (String, i32, i64) {
    let row = client
        .query_one(
            "SELECT durable_etl_channel(), durable_etl_lock_space(),
                    durable_etl_owner_lock_key('one')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cells_in_one_database_run_their_own_jobs_on_their_own_wakes() {
    let db = TestDb::migrated().await;
    let (a, b) = (cell_config(&db, "cell_a"), cell_config(&db, "cell_b"));
    for cfg in [&a, &b] {
        let report = schema::migrate(cfg).await.unwrap();
        assert_eq!(report.version, schema::latest_version());
        assert_eq!(report.changed.len(), schema::MIGRATIONS.len());
    }
    let (client_a, client_b) = (session(&a).await, session(&b).await);
    // Each cell names its own channel and barrier keys; the database's first deployment keeps
    // the names it had before cells.
    let public = db.client().await;
    let (na, nb, np) = (
        names(&client_a).await,
        names(&client_b).await,
        names(&public).await,
    );
    assert_eq!(na.0, "durable_etl_jobs.cell_a");
    assert_eq!(nb.0, "durable_etl_jobs.cell_b");
    assert_eq!(np.0, durable_etl::jobs::notifier::CHANNEL);
    assert_eq!(np.1, 1_684_370_540);
    assert!(na.1 != nb.1 && na.1 != np.1 && nb.1 != np.1);
    assert!(na.2 != nb.2 && na.2 != np.2 && nb.2 != np.2);

    // One owner id in both cells: each takes its own owner lock.
    let replica_a = start(&a, "same-owner").await;
    let replica_b = start(&b, "same-owner").await;

    // A's jobs run in A, brought by A's wake alone (the poll is a minute away); B is not woken.
    insert_jobs(&client_a, NOOP, &[json!({}), json!({}), json!({})], 3).await;
    until_succeeded(&client_a, 3).await;
    assert_eq!(replica_b.stats.snapshot().claims, 1, "B woke for A's jobs");
    let claims_a = replica_a.stats.snapshot().claims;
    insert_jobs(&client_b, NOOP, &[json!({}), json!({})], 3).await;
    until_succeeded(&client_b, 2).await;
    assert_eq!(
        replica_a.stats.snapshot().claims,
        claims_a,
        "A woke for B's jobs"
    );
    assert_eq!(replica_a.stats.snapshot().succeeded, 3);
    assert_eq!(replica_b.stats.snapshot().succeeded, 2);
    // Nothing crossed: each cell holds its own jobs, and the database's first deployment none.
    assert_eq!(count(&client_a, "etl_jobs").await, 3);
    assert_eq!(count(&client_b, "etl_jobs").await, 2);
    assert_eq!(count(&public, "etl_jobs").await, 0);

    // Recovery in B does not take A's live replica for B's dead one of the same id.
    replica_b.stop().await.unwrap();
    let stuck = insert_jobs(&client_b, "test.cell_stuck", &[json!({})], 1).await[0];
    crate::support::running_under(&client_b, stuck, "dead-owner").await;
    let dead = start(&a, "dead-owner").await;
    assert_eq!(expire_and_recover(&client_b).await, 1);
    assert_eq!(
        count(&client_b, "etl_jobs WHERE status = 'failed'").await,
        1
    );
    for replica in [replica_a, dead] {
        replica.stop().await.unwrap();
    }
}

#[tokio::test]
async fn a_cell_migrates_down_and_up_alone() {
    let db = TestDb::migrated().await;
    let cell = cell_config(&db, "cell_down");
    schema::migrate(&cell).await.unwrap();
    let mut client = session(&cell).await;
    let down = schema::migrate_down_to(&mut client, 0).await.unwrap();
    assert_eq!(down.version, 0);
    assert_eq!(down.changed.len(), schema::MIGRATIONS.len());
    // The cell's schema holds its migration history alone again (table and key), and no
    // function; the database's first deployment is untouched.
    let left: Vec<String> = crate::support::first_column(
        &client,
        "SELECT relname::text FROM pg_class
          WHERE relnamespace = 'cell_down'::regnamespace ORDER BY 1",
    )
    .await;
    assert_eq!(
        left,
        [
            "durable_etl_schema_history",
            "durable_etl_schema_history_pkey"
        ]
    );
    assert_eq!(
        count(
            &client,
            "pg_proc WHERE pronamespace = 'cell_down'::regnamespace"
        )
        .await,
        0
    );
    let public = db.client().await;
    assert_eq!(
        schema::check_compatible(&public).await.unwrap(),
        schema::latest_version()
    );
    drop(client);
    let up = schema::migrate(&cell).await.unwrap();
    assert_eq!(up.changed.len(), schema::MIGRATIONS.len());
    let client = session(&cell).await;
    let channel: String = client
        .query_one("SELECT durable_etl_channel()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, "durable_etl_jobs.cell_down");
}

#[tokio::test]
async fn a_session_outside_its_cell_is_refused_before_it_migrates_or_runs() {
    let db = TestDb::migrated().await;
    let cell = cell_config(&db, "cell_lost");
    // A session whose search path is not the cell's, as behind a pooler that drops start-up
    // options: refused, and nothing is created in the database's first deployment.
    let outside = db.client().await;
    let refused = |e: Error| matches!(e, Error::Config(ConfigError::CellSchema));
    assert!(refused(db::check_cell(&outside, &cell).await.unwrap_err()));
    assert!(refused(
        schema::enter_cell(&outside, &cell).await.unwrap_err()
    ));
    assert!(db::check_cell(&outside, &db.config).await.is_ok());
    assert_eq!(
        count(&outside, "pg_namespace WHERE nspname = 'cell_lost'").await,
        0
    );
    // A replica whose pool does not reach its cell does not start.
    let pool = db::connect_pool(&db.config, "test").await.unwrap();
    let started = durable_etl::worker::Worker::start(
        pool,
        &cell,
        config("lost", Duration::from_secs(60), 1),
        Registry::new().register(Noop),
    )
    .await;
    assert!(matches!(
        started,
        Err(Error::Config(ConfigError::CellSchema))
    ));
    // A cell's session that finds no schema yet is refused too.
    let before = session(&cell).await;
    assert!(refused(
        db::check_session_settings(&before, &cell)
            .await
            .unwrap_err()
    ));
    schema::migrate(&cell).await.unwrap();
    assert!(db::check_session_settings(&session(&cell).await, &cell)
        .await
        .is_ok());
    // A name that is not a cell's is refused before anything connects.
    for bad in ["", "Cell", "1cell", "pg_cell", "cell-a", &"c".repeat(41)] {
        let cfg = DatabaseConfig {
            cell: Some(bad.to_owned()),
            ..db.config.clone()
        };
        assert_eq!(cfg.validate(), Err(ConfigError::CellName), "{bad}");
    }
    assert_eq!(
        DatabaseConfig {
            cell: Some("c".repeat(40)),
            ..db.config.clone()
        }
        .validate(),
        Ok(())
    );
}

#[tokio::test]
async fn the_command_line_migrates_a_cell_and_its_admin_commands_stay_in_it() {
    let db = TestDb::migrated().await;
    let run = |args: &[&str]| {
        crate::support::binary(&db.config.url, args)
            .output()
            .unwrap()
    };
    let migrated = run(&["migrate", "--cell", "cell_cli"]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        String::from_utf8_lossy(&migrated.stdout)
            .contains(&format!("schema at version {}", schema::latest_version())),
        "{migrated:?}"
    );
    // A queue paused in the cell is paused there alone.
    let paused = run(&["queues", "pause", "default", "--cell", "cell_cli"]);
    assert!(paused.status.success(), "{paused:?}");
    let cell = session(&cell_config(&db, "cell_cli")).await;
    assert_eq!(count(&cell, "etl_queues WHERE paused").await, 1);
    assert_eq!(
        count(&db.client().await, "etl_queues WHERE paused").await,
        0
    );
    // An admin command of a cell that does not exist is refused (exit 2) and creates nothing.
    let missing = run(&["queues", "pause", "default", "--cell", "cell_none"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert_eq!(
        count(&cell, "pg_namespace WHERE nspname = 'cell_none'").await,
        0
    );
}
