//! What every bench shares: a throw-away database on `DATABASE_URL`'s server, and queue fills
//! and histories of ended jobs done outside the timed region.
//!
//! The benches need PostgreSQL. Without one they print what to do and exit with status 2 instead
//! of timing nothing.

use durable_etl::config::DatabaseConfig;
use durable_etl::db::{self, Pool};
use std::time::Duration;
use tokio::runtime::Runtime;

/// The server the benches use, from `DATABASE_URL`.
pub(crate) fn base_config() -> DatabaseConfig {
    DatabaseConfig {
        url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| durable_etl::config::DATABASE_URL_DEFAULT.to_owned()),
        pool_max_size: 16,
        ..DatabaseConfig::default()
    }
}

/// A bench's own database, created fresh and migrated.
pub(crate) struct BenchDb {
    /// Its configuration.
    pub(crate) config: DatabaseConfig,
    /// A client for setup and cleanup.
    pub(crate) client: tokio_postgres::Client,
}

impl BenchDb {
    /// Creates database `name` afresh (it must start with `durable_etl_bench`) and migrates it;
    /// a database of that name is dropped first only if a bench created it and no session uses
    /// it. Exits the process with a clear message (and the error's code, `database_taken` for a
    /// name taken otherwise) when it cannot.
    pub(crate) fn create(rt: &Runtime, name: &str) -> BenchDb {
        let base = base_config();
        rt.block_on(async {
            let created = match db::recreate_database(&base, name, "bench", "bench").await {
                Ok(created) => created,
                Err(e @ durable_etl::Error::DatabaseTaken { .. }) => {
                    eprintln!("{e} [{}]", e.code());
                    std::process::exit(2);
                }
                Err(e) => {
                    eprintln!(
                        "these benches need PostgreSQL at DATABASE_URL ({}): start it \
                         (pg_ctlcluster 15 main start) or point DATABASE_URL at one; \
                         error code: {}",
                        base.url,
                        e.code()
                    );
                    std::process::exit(2);
                }
            };
            let mut client = created.session;
            durable_etl::schema::migrate_up(&mut client)
                .await
                .expect("migrate");
            BenchDb {
                config: created.config,
                client,
            }
        })
    }

    /// A pool of `size` connections on the bench database.
    pub(crate) async fn pool(&self, size: u32) -> Pool {
        let config = DatabaseConfig {
            pool_max_size: size,
            ..self.config.clone()
        };
        db::connect_pool(&config, "bench").await.expect("pool")
    }

    /// Empties the queue and vacuums it, so every sample starts from the same table. `CASCADE`
    /// also empties the tables that reference these (a job's attempts reference its intake row).
    pub(crate) async fn reset(&self) {
        self.client
            .batch_execute(
                "TRUNCATE etl_target_rows, etl_job_records,
                          etl_job_outcomes, etl_job_intake CASCADE",
            )
            .await
            .expect("truncate");
    }

    /// Inserts `n` due no-op jobs (their intake rows and live rows) in one statement, each under
    /// an idempotency key of its own (so fills may repeat without a reset).
    pub(crate) async fn fill(&self, n: usize) {
        let n = i64::try_from(n).expect("n");
        self.client
            .execute(
                "WITH intake AS (
                     INSERT INTO etl_job_intake
                            (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                             max_attempts, run_at)
                     SELECT gen_random_uuid(), sha256('bench'::bytea),
                            sha256(gen_random_uuid()::text::bytea), sha256(g::text::bytea),
                            'noop', 5, now() - interval '1 second'
                       FROM generate_series(1, $1::int8) AS g
                     RETURNING id, owner_key, kind, max_attempts, run_at
                 )
                 INSERT INTO etl_job_records
                        (id, owner_key, kind, request_payload, max_attempts, run_at)
                 SELECT id, owner_key, kind, '{}'::jsonb, max_attempts, run_at FROM intake",
                &[&n],
            )
            .await
            .expect("fill");
    }
}

/// Histories of ended jobs, as the retention runbook leaves them until they age out: what the
/// hot paths and the pages must not read.
// Only the benches that price a history use it (history, console).
#[allow(dead_code)]
pub(crate) mod history {
    use super::BenchDb;
    use sha2::{Digest, Sha256};

    /// The ended jobs of the larger history.
    pub(crate) const HISTORY: i64 = 1_000_000;

    /// Ended jobs appended per statement: each statement stays well inside the setup session's
    /// `statement_timeout` even on a slow, busy machine (one 1,000,000-row statement did not).
    const HISTORY_CHUNK: i64 = 50_000;

    /// Milliseconds between two jobs of a history: 50 jobs a second, so 1,000,000 span 5.6 hours
    /// and every whole second inside a history holds 50 of its jobs.
    pub(crate) const SPACING_MS: i64 = 20;

    /// Appends `n` ended jobs of an owner no bench signs in as; see [`add_owned_history`].
    pub(crate) async fn add_history(db: &BenchDb, n: i64) {
        add_owned_history(db, n, &Sha256::digest(b"history")[..]).await;
    }

    /// Appends `n` ended jobs (succeeded, with their ledger) of the owner whose digest is
    /// `owner_key`, in chunks of [`HISTORY_CHUNK`], then analyzes the tables. Job `g` (1 to `n`)
    /// has a UUIDv7 id that begins with the millisecond it was submitted, ran and ended at: a
    /// whole second two days ago, plus `g` times [`SPACING_MS`].
    pub(crate) async fn add_owned_history(db: &BenchDb, n: i64, owner_key: &[u8]) {
        let start: i64 = db
            .client
            .query_one(
                "SELECT (extract(epoch FROM date_trunc('second', now() - interval '2 days'))
                         * 1000)::int8",
                &[],
            )
            .await
            .expect("history start")
            .get(0);
        for first in (1..=n).step_by(usize::try_from(HISTORY_CHUNK).expect("chunk")) {
            let last = (first + HISTORY_CHUNK - 1).min(n);
            db.client
                .execute(
                    &format!(
                        "WITH ids AS (
                             SELECT (lpad(to_hex(ms), 12, '0') || '7000' || '8'
                                     || lpad(to_hex(g), 15, '0'))::uuid AS id,
                                    'epoch'::timestamptz + ms * interval '1 millisecond' AS at, g
                               FROM (SELECT $2::int8 + g * {SPACING_MS} AS ms, g
                                       FROM generate_series($3::int8, $4::int8) g) s
                         ), intake AS (
                             INSERT INTO etl_job_intake
                                    (id, owner_key, idempotency_key_digest, request_fingerprint,
                                     kind, max_attempts, run_at, created_at)
                             SELECT id, $1::bytea, sha256(g::text::bytea), sha256(g::text::bytea),
                                    'noop', 5, at, at
                               FROM ids
                         )
                         INSERT INTO etl_job_outcomes
                                (job_id, owner_key, status, attempts, run_at, lease_claim_id,
                                 rows_inserted, rows_updated, rows_unchanged, data_checksum,
                                 started_at, finished_at)
                         SELECT id, $1::bytea, 'succeeded', 1, at, gen_random_uuid(), 0, 0, 0,
                                sha256(g::text::bytea), at, at
                           FROM ids"
                    ),
                    &[&owner_key, &start, &first, &last],
                )
                .await
                .expect("history");
        }
        db.client
            .batch_execute("ANALYZE etl_job_intake, etl_job_outcomes, etl_job_records")
            .await
            .expect("analyze");
    }
}

/// A criterion configuration sized for a 2-core machine: few samples, short windows.
pub(crate) fn criterion() -> criterion::Criterion {
    criterion::Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
}

/// A multi-threaded runtime for the benches.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
