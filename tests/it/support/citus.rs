//! A private Citus cluster for the cell tests: a coordinator and two workers, each a private
//! PostgreSQL cluster (`cluster`) with Citus preloaded, on free ports, stopped and deleted when
//! dropped. Citus 13.2.2 must be installed into the server's PostgreSQL (`.ci/run` builds it from
//! `../shared/citus/`).
//!
//! Every node has the metadata (MX), so a worker plans statements on the distributed tables it
//! holds; new schemas are distributed (schema-based sharding); triggers may be created on
//! distributed tables. Sessions go without TLS: Citus turns on TLS with a self-signed
//! certificate that no root trusts.

use super::{connect, Cluster};
use tokio_postgres::Client;

/// What every node's `postgresql.conf` adds.
const NODE_SETTINGS: &str = "shared_preload_libraries = 'citus'
max_prepared_transactions = 20
wal_level = logical
citus.enable_schema_based_sharding = on
citus.enable_unsafe_triggers = on";

/// A coordinator and two workers.
pub struct Citus {
    /// The coordinator: DDL, the metadata.
    pub coordinator: Cluster,
    /// The workers, which hold the distributed schemas.
    pub workers: Vec<Cluster>,
}

impl Citus {
    /// Starts the three nodes, creates the extension on each and adds the workers.
    pub async fn start() -> Citus {
        let citus = Citus {
            coordinator: Cluster::start_with(NODE_SETTINGS),
            workers: (0..2).map(|_| Cluster::start_with(NODE_SETTINGS)).collect(),
        };
        for node in std::iter::once(&citus.coordinator).chain(&citus.workers) {
            Citus::session(node)
                .await
                .batch_execute("CREATE EXTENSION citus")
                .await
                .unwrap();
        }
        let coordinator = Citus::session(&citus.coordinator).await;
        coordinator
            .execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
                &[&i32::from(citus.coordinator.port())],
            )
            .await
            .unwrap();
        for worker in &citus.workers {
            coordinator
                .execute(
                    "SELECT citus_add_node('127.0.0.1', $1)",
                    &[&i32::from(worker.port())],
                )
                .await
                .unwrap();
        }
        citus
    }

    /// The URL of node `node`'s `postgres` database, without TLS.
    pub fn url(node: &Cluster) -> String {
        format!("{}?sslmode=disable", node.url("postgres"))
    }

    /// A plain session on node `node`.
    pub async fn session(node: &Cluster) -> Client {
        connect(&Citus::url(node).parse().unwrap()).await
    }

    /// On each node (the coordinator first, then the workers), its port and the count of the
    /// rows of `from` (a `FROM` clause, as [`super::count`] takes it).
    pub async fn count_on_each(&self, from: &str) -> Vec<(u16, i64)> {
        let mut counts = Vec::new();
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            let n = super::count(&Citus::session(node).await, from).await;
            counts.push((node.port(), n));
        }
        counts
    }

    /// The port of a worker that does not hold schema `cell`.
    pub async fn other_worker(&self, cell: &str) -> u16 {
        let from = self.node_of(cell).await;
        let other = self.workers.iter().find(|w| w.port() != from);
        other.unwrap().port()
    }

    /// Moves schema `cell` to the worker on port `to` and waits for the move
    /// (`block_writes`: a cell's unlogged tables keep Citus from moving it by logical
    /// replication); `coordinator` is a session of the coordinator.
    pub async fn move_schema(coordinator: &Client, cell: &str, to: u16) {
        coordinator
            .execute(
                "SELECT citus_schema_move($1::text::regnamespace, '127.0.0.1', $2,
                                          shard_transfer_mode => 'block_writes')",
                &[&cell, &i32::from(to)],
            )
            .await
            .unwrap();
    }

    /// The port of the worker that holds schema `cell` (its job table's shard), by the
    /// coordinator's metadata.
    pub async fn node_of(&self, cell: &str) -> u16 {
        let port: i32 = Citus::session(&self.coordinator)
            .await
            .query_one(
                "SELECT nodeport FROM citus_shards
                  WHERE table_name = to_regclass($1 || '.etl_job_records')",
                &[&cell],
            )
            .await
            .unwrap()
            .get(0);
        u16::try_from(port).unwrap()
    }
}
