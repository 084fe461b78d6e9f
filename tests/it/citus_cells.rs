//! Cells on Citus schema-based sharding, on a private coordinator and two workers: a cell is
//! migrated through the coordinator into one worker, and sessions on that worker run it.

use crate::support::{count, Citus};
use durable_etl::config::DatabaseConfig;
use durable_etl::{db, schema};

/// Cell `cell` of the Citus node at `url`.
fn cell_at(url: String, cell: &str) -> DatabaseConfig {
    DatabaseConfig {
        cell: Some(cell.to_owned()),
        ..DatabaseConfig::new(url)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_migrated_through_the_coordinator_lives_whole_on_one_worker() {
    let citus = Citus::start().await;
    let through = cell_at(Citus::url(&citus.coordinator), "cell_one");
    let report = schema::migrate(&through).await.unwrap();
    assert_eq!(report.version, schema::latest_version());
    assert_eq!(report.changed.len(), schema::MIGRATIONS.len());

    // The schema is distributed, and every table of the cell is one shard, all on one worker.
    let coordinator = Citus::session(&citus.coordinator).await;
    assert_eq!(
        count(
            &coordinator,
            "pg_dist_schema WHERE schemaid = 'cell_one'::regnamespace"
        )
        .await,
        1
    );
    let tables = count(&coordinator, "pg_tables WHERE schemaname = 'cell_one'").await;
    let placements: Vec<(i64, i32)> = coordinator
        .query(
            "SELECT count(*), nodeport FROM citus_shards
              WHERE table_name::text LIKE 'cell_one.%' GROUP BY nodeport",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let port = citus.node_of("cell_one").await;
    assert_eq!(placements, [(tables, i32::from(port))]);
    assert!(citus.workers.iter().any(|w| w.port() == port));

    // On that worker a session of the cell finds it whole: the migrations' history, its own
    // channel, and no other cell's.
    let worker = citus.workers.iter().find(|w| w.port() == port).unwrap();
    let on_worker = cell_at(Citus::url(worker), "cell_one");
    let session = db::connect(&on_worker, "test").await.unwrap();
    db::check_session_settings(&session, &on_worker)
        .await
        .unwrap();
    assert_eq!(
        schema::check_compatible(&session).await.unwrap(),
        schema::latest_version()
    );
    let channel: String = session
        .query_one("SELECT durable_etl_channel()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, "durable_etl_jobs.cell_one");
    // Migrating again through the coordinator applies nothing.
    assert!(schema::migrate(&through).await.unwrap().changed.is_empty());
}
