//! `bench --citus`: the bench on a Citus cluster. The bench database is made on every node (the
//! coordinator and each worker its `postgres` database lists), Citus is set up in it (the
//! extension on every node, the workers added to the coordinator), and the cell is migrated
//! through the coordinator; the bench then runs as on one server, on the worker that holds the
//! cell.
//!
//! Invariants this module keeps:
//! - It touches only the databases it creates, one per node, each marked and dropped as the
//!   bench's own database is (`durable_etl::db::recreate_database`); the cluster's own databases
//!   are only read.
//! - A run without a cell, or of a mode other than burn-down and offered load, is refused before
//!   anything is created: on Citus the cell is what is distributed, and its processes run on its
//!   node.

use super::Mode;
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::db::{self, CreatedDatabase};
use durable_etl::error::Error;

/// The bench's databases on a Citus cluster's workers (the coordinator's is the bench's own).
pub(super) struct Cluster {
    /// The workers, in the coordinator's order.
    workers: Vec<Worker>,
}

/// A worker and the bench database made on it.
struct Worker {
    /// The worker's connection settings (its `postgres` database).
    config: DatabaseConfig,
    /// The identity of the bench database made on it.
    oid: u32,
    /// Its host name, as Citus's metadata names it.
    host: String,
    /// Its port.
    port: u16,
}

/// The primary nodes of the cluster, as the coordinator's `postgres` database lists them: the
/// coordinator (group 0) first.
///
/// Locks: none (reads Citus's metadata).
const NODES_SQL: &str = "
SELECT nodename, nodeport, groupid = 0 FROM pg_dist_node
 WHERE noderole = 'primary' AND isactive ORDER BY groupid, nodeid";

/// Makes database `name` on every worker of the coordinator at `base` (on which `created` is
/// already made), sets Citus up in all of them, and adds the workers to the coordinator's.
///
/// # Errors
/// [`ConfigError::CellName`] without a cell; [`Error::DatabaseTaken`] when a worker has a
/// database of that name the bench did not create; connection and database errors.
pub(super) async fn join(
    base: &DatabaseConfig,
    created: &CreatedDatabase,
    name: &str,
) -> Result<Cluster, Error> {
    let plain = DatabaseConfig {
        url: db::with_dbname(&base.url, "postgres")?,
        cell: None,
        ..base.clone()
    };
    let nodes: Vec<(String, u16, bool)> = db::connect(&plain, "bench")
        .await?
        .query(NODES_SQL, &[])
        .await?
        .iter()
        .map(|row| {
            let port: i32 = row.get(1);
            (row.get(0), u16::try_from(port).unwrap_or(0), row.get(2))
        })
        .collect();
    let mut cluster = Cluster {
        workers: Vec::new(),
    };
    let mut coordinator = None;
    for (host, port, is_coordinator) in nodes {
        if is_coordinator {
            coordinator = Some((host, port));
            continue;
        }
        let config = DatabaseConfig {
            url: db::with_node(&plain.url, &host, port)?,
            ..plain.clone()
        };
        let made = db::recreate_database(&config, name, "bench", "bench").await?;
        cluster.workers.push(Worker {
            config,
            oid: made.oid,
            host,
            port,
        });
        made.session.batch_execute("CREATE EXTENSION citus").await?;
    }
    let setup = db::connect(
        &DatabaseConfig {
            cell: None,
            ..created.config.clone()
        },
        "bench",
    )
    .await?;
    setup.batch_execute("CREATE EXTENSION citus").await?;
    if let Some((host, port)) = coordinator {
        setup
            .execute(
                "SELECT citus_set_coordinator_host($1, $2)",
                &[&host, &i32::from(port)],
            )
            .await?;
    }
    for worker in &cluster.workers {
        setup
            .execute(
                "SELECT citus_add_node($1, $2)",
                &[&worker.host, &i32::from(worker.port)],
            )
            .await?;
    }
    Ok(cluster)
}

/// Moves the cell of `coordinator` (the bench database on the coordinator) to worker `worker`
/// (its position in the coordinator's list of workers), unless it is there already; the cell is
/// empty, so the move is a moment.
///
/// # Errors
/// [`ConfigError::BenchCitusWorker`] for a position past the last worker; database errors.
pub(super) async fn place(coordinator: &DatabaseConfig, worker: usize) -> Result<(), Error> {
    let Some(cell) = &coordinator.cell else {
        return Err(ConfigError::CellName.into());
    };
    let session = db::connect(
        &DatabaseConfig {
            cell: None,
            ..coordinator.clone()
        },
        "bench",
    )
    .await?;
    let nodes = session.query(NODES_SQL, &[]).await?;
    let (host, port): (String, i32) = nodes
        .iter()
        .filter(|row| !row.get::<_, bool>(2))
        .nth(worker)
        .map(|row| (row.get(0), row.get(1)))
        .ok_or(ConfigError::BenchCitusWorker)?;
    session
        .execute(
            "SELECT citus_schema_move($1::text::regnamespace, $2::text, $3::int4,
                                      shard_transfer_mode => 'block_writes')
              WHERE NOT EXISTS (SELECT 1 FROM citus_shards
                                 WHERE table_name = to_regclass($1::text || '.etl_job_records')
                                   AND nodename = $2 AND nodeport = $3)",
            &[cell, &host, &port],
        )
        .await?;
    Ok(())
}

/// Refuses a Citus run without a cell (`base` names none) or in a mode other than burn-down and
/// offered load, before anything is made.
///
/// # Errors
/// [`ConfigError::CellName`]; [`ConfigError::BenchCitusMode`].
pub(super) fn check(base: &DatabaseConfig, mode: &Mode) -> Result<(), Error> {
    if base.cell.is_none() {
        return Err(ConfigError::CellName.into());
    }
    if !matches!(mode, Mode::BurnDown { .. } | Mode::OfferedLoad { .. }) {
        return Err(ConfigError::BenchCitusMode.into());
    }
    Ok(())
}

impl Cluster {
    /// Drops the bench database of every worker (those it still is the bench's own).
    ///
    /// # Errors
    /// Connection and database errors.
    pub(super) async fn drop_all(&self, name: &str) -> Result<(), Error> {
        for worker in &self.workers {
            db::drop_created(&worker.config, name, worker.oid).await?;
        }
        Ok(())
    }
}
