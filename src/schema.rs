//! Versioned schema migrations embedded in the binary, and the release-compatibility check.
//!
//! Invariants this module keeps:
//! - Each migration runs in its own transaction that first takes a transaction-level advisory lock
//!   ([`MIGRATION_LOCK_KEY`]), then reads the history: concurrent `migrate` runs from many replicas
//!   serialize on that lock, and exactly one applies each migration. The wait for the lock has no
//!   timeout (the session's `lock_timeout` and `statement_timeout` are lifted for it), and a
//!   migration's SQL runs without `statement_timeout`. A run killed mid-way rolls its
//!   transaction back and frees the lock with its session; the next run completes the work.
//! - The history table records, for each applied version, its name, the SHA-256 checksum of its
//!   `up` SQL, the oldest schema version a release may know and still run against it
//!   (`min_reader_version`), and the release that applied it.
//! - An applied migration whose checksum differs from the embedded one is an error, never ignored.
//! - [`check_compatible`] refuses a database that is unmigrated, older than this release, or
//!   migrated by a newer release whose schema this release cannot read, before any job is touched.
//! - `down` undoes exactly what `up` did; a test compares the catalog after up → down → up.
//! - A new cell is built from [`CELL_BASELINE`] in one transaction and ends exactly as the
//!   migrations build it (a test compares the two cells' `pg_dump`), its history recording every
//!   migration; a cell already migrated applies what it lacks, as any deployment does.

use crate::error::{Error, SchemaError};
use tokio_postgres::{types::Type, Client};

mod migrations;
pub use migrations::{Migration, MIGRATIONS};

/// The release recorded in the history table by the migrations it applies.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The advisory-lock key every migration transaction takes (`durable` and 1, as ASCII).
pub const MIGRATION_LOCK_KEY: i64 = 0x6475_7261_626c_6501;

/// The schema version this release needs and writes.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Every migration's schema at once, as a script that builds a new cell in one transaction:
/// what the migrations leave in a cell, dumped by `pg_dump` and written in statements Citus's
/// schema-based sharding runs (an identity column declared with its table, not added after).
/// [`CELL_TEMPLATE`] stands for the cell's name. A test rebuilds it from the migrations and
/// checks that a cell built from it dumps as one built by the migrations.
pub const CELL_BASELINE: &str = include_str!("../migrations/cell_baseline.sql");

/// The line between two statements of [`CELL_BASELINE`]: each is sent alone, since Citus
/// forwards a DDL statement's whole query string to the worker, which refuses several commands.
pub const CELL_BASELINE_BREAK: &str = "-- ;";

/// The cell name [`CELL_BASELINE`] is written with.
pub const CELL_TEMPLATE: &str = "durable_etl_cell_template";

/// The history table. Created by the first migration transaction, under the migration lock.
const CREATE_HISTORY: &str = "
CREATE TABLE IF NOT EXISTS durable_etl_schema_history (
    version            integer     PRIMARY KEY,
    name               text        NOT NULL,
    checksum           text        NOT NULL,
    min_reader_version integer     NOT NULL,
    applied_by_release text        NOT NULL,
    applied_at         timestamptz NOT NULL DEFAULT now()
)";

/// Lifts the session's `lock_timeout` and `statement_timeout` for the rest of the transaction, so
/// that a `migrate` started by a replica queues behind a slow migration of another one instead of
/// failing after the pool's timeouts. Locks: none.
const WAIT_WITHOUT_TIMEOUT: &str = "SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0";

/// Takes the migration lock for the rest of the transaction; waits for any other migrating session.
/// Locks: the transaction-level advisory lock [`MIGRATION_LOCK_KEY`].
const TAKE_MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Puts the session's `lock_timeout` back once the migration lock is held: a migration's DDL that
/// waits for a table lock held by running replicas fails (and `migrate` can be run again) rather
/// than queueing every replica's statements behind it. `statement_timeout` stays lifted, so a
/// migration that rewrites a large table is not cut short. Locks: none.
const RESTORE_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout TO DEFAULT";

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// The versions this run applied (or reversed), in the order it did so.
    pub changed: Vec<i32>,
    /// The newest version applied to the database afterwards.
    pub version: i32,
}

/// Opens a migration transaction: waits for the lock without a timeout, then the history table.
async fn begin_locked(client: &mut Client) -> Result<tokio_postgres::Transaction<'_>, Error> {
    let tx = client.transaction().await?;
    tx.batch_execute(WAIT_WITHOUT_TIMEOUT).await?;
    tx.execute_typed(TAKE_MIGRATION_LOCK, &[(&MIGRATION_LOCK_KEY, Type::INT8)])
        .await?;
    tx.batch_execute(RESTORE_LOCK_TIMEOUT).await?;
    tx.batch_execute(CREATE_HISTORY).await?;
    Ok(tx)
}

/// The newest applied version (0 for none), read inside a locked migration transaction.
async fn current_version(tx: &tokio_postgres::Transaction<'_>) -> Result<i32, Error> {
    let row = tx
        .query_typed_one(
            "SELECT coalesce(max(version), 0) FROM durable_etl_schema_history",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Applies every pending migration on a connection of its own to `db` (role `migrate`), as
/// [`migrate_up`] does: advisory-locked, so replicas may all do it at start-up. The database
/// must exist, as for `durable-etl migrate` without `--create-database`; to create it, call
/// [`crate::db::ensure_database`] first.
///
/// # Errors
/// As [`migrate_up`]; [`Error::Refused`] (`database_refused`) when the database does not exist;
/// other connection errors.
pub async fn migrate(db: &crate::config::DatabaseConfig) -> Result<MigrateReport, Error> {
    let mut client = crate::db::connect(db, "migrate").await?;
    migrate_session(&mut client, db).await
}

/// Applies every pending migration of the deployment `db` names, on `client`, a session opened
/// with `db`: in a cell, readies the session ([`enter_cell`]) and migrates the cell
/// ([`migrate_cell`]); else as [`migrate_up`].
///
/// # Errors
/// As [`enter_cell`], [`migrate_cell`] and [`migrate_up`].
pub async fn migrate_session(
    client: &mut Client,
    db: &crate::config::DatabaseConfig,
) -> Result<MigrateReport, Error> {
    enter_cell(client, db).await?;
    let Some(cell) = &db.cell else {
        return migrate_up(client).await;
    };
    let report = migrate_cell(client, cell).await?;
    // On Citus, the node that holds the cell gets its views back, built from the new tables.
    if !report.changed.is_empty()
        && crate::db::citus::locate(&*client, cell).await? != crate::db::citus::Placement::Plain
    {
        let node = crate::db::citus::find_node(db).await?;
        let session = crate::db::connect(&node, "migrate").await?;
        crate::db::citus::ready(&session, cell).await?;
    }
    Ok(report)
}

/// Readies a migrating session for `db`'s cell, if it names one: creates the cell's schema if it
/// does not exist, checks that the session creates its objects there, and tells the migrations
/// (setting `durable_etl.cell` for the session) to give the cell its own wake channel and lock
/// keys (migration 0041). Nothing outside a cell. Call it before [`migrate_up`] on a session of
/// a cell's configuration.
///
/// # Errors
/// [`crate::config::ConfigError::CellSchema`] when the session's search path is not the cell's
/// schema alone (a pooler dropped the start-up option), before anything is created; database
/// errors.
pub async fn enter_cell(client: &Client, db: &crate::config::DatabaseConfig) -> Result<(), Error> {
    let Some(cell) = &db.cell else {
        return Ok(());
    };
    // Only a session whose search path is the cell's alone (or, as every session but a
    // migration's has it, after its node views, which only a Citus node has) creates anything.
    let path: String = client
        .query_typed_one("SELECT current_setting('search_path')", &[])
        .await?
        .get(0);
    let with_views = format!("{},{cell}", crate::db::citus::node_schema(cell));
    if path != *cell && path.replace(' ', "") != with_views {
        return Err(crate::config::ConfigError::CellSchema.into());
    }
    // Cell names need no quoting (`config::cell_name_ok`).
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {cell}; SET durable_etl.cell = '{cell}'"
        ))
        .await?;
    if crate::db::current_schema_is(client, cell).await? {
        Ok(())
    } else {
        Err(crate::config::ConfigError::CellSchema.into())
    }
}

/// On Citus, drops the node views of cell `cell` on every node (`db::citus::forget`), so that a
/// migration may change the tables they read; `client` is a session of the coordinator. Nothing
/// on plain PostgreSQL. Call it before reversing migrations; applying them
/// ([`migrate_session`]) does it itself and readies the cell's node again.
///
/// # Errors
/// Database errors; [`Error::Unavailable`] if a node did not drop them.
pub async fn forget_node_views(client: &Client, cell: &str) -> Result<(), Error> {
    if crate::db::citus::locate(client, cell).await? == crate::db::citus::Placement::Plain {
        return Ok(());
    }
    crate::db::citus::forget(client, cell).await
}

/// Applies every embedded migration the database lacks, one transaction each, and verifies the
/// checksum of each one already applied.
///
/// # Errors
/// [`SchemaError::ChecksumMismatch`] for an applied migration that differs, [`SchemaError::Failed`]
/// when a migration's SQL fails, [`Error::Unavailable`]/[`Error::Database`] from the server.
pub async fn migrate_up(client: &mut Client) -> Result<MigrateReport, Error> {
    let mut changed = Vec::new();
    for migration in MIGRATIONS {
        let tx = begin_locked(client).await?;
        let applied = tx
            .query_typed_opt(
                "SELECT checksum FROM durable_etl_schema_history WHERE version = $1",
                &[(&migration.version, Type::INT4)],
            )
            .await?;
        match applied {
            Some(row) if row.get::<_, String>(0) != migration.checksum() => {
                return Err(SchemaError::ChecksumMismatch {
                    version: migration.version,
                }
                .into());
            }
            Some(_) => {}
            None => {
                run_script(&tx, migration.up, migration.version).await?;
                record(&tx, migration).await?;
                changed.push(migration.version);
            }
        }
        tx.commit().await?;
    }
    let tx = begin_locked(client).await?;
    let version = current_version(&tx).await?;
    tx.commit().await?;
    Ok(MigrateReport { changed, version })
}

/// Records `migration` as applied, by this release, in the history table.
async fn record(tx: &tokio_postgres::Transaction<'_>, migration: &Migration) -> Result<(), Error> {
    tx.execute_typed(
        "INSERT INTO durable_etl_schema_history
             (version, name, checksum, min_reader_version, applied_by_release)
         VALUES ($1, $2, $3, $4, $5)",
        &[
            (&migration.version, Type::INT4),
            (&migration.name, Type::TEXT),
            (&migration.checksum(), Type::TEXT),
            (&migration.min_reader_version, Type::INT4),
            (&RELEASE, Type::TEXT),
        ],
    )
    .await?;
    Ok(())
}

/// Migrates cell `cell` on `client`, a session [`enter_cell`] readied: a cell with no migration
/// applied is built from [`CELL_BASELINE`] in one transaction (every migration recorded as
/// applied), whose statements Citus's schema-based sharding also runs through its coordinator;
/// a cell already migrated applies what it lacks, as [`migrate_up`] does.
///
/// # Errors
/// As [`migrate_up`]; [`SchemaError::Failed`] (naming the newest version) when the baseline fails.
pub async fn migrate_cell(client: &mut Client, cell: &str) -> Result<MigrateReport, Error> {
    let tx = begin_locked(client).await?;
    let version = current_version(&tx).await?;
    if version > 0 {
        tx.commit().await?;
        // On Citus, the node views name every column of the tables a migration may change.
        if version < latest_version() {
            forget_node_views(client, cell).await?;
        }
        return migrate_up(client).await;
    }
    let baseline = CELL_BASELINE.replace(CELL_TEMPLATE, cell);
    for statement in baseline.split(&format!("\n{CELL_BASELINE_BREAK}\n")) {
        tx.batch_execute(statement)
            .await
            .map_err(|source| SchemaError::Failed {
                version: latest_version(),
                source,
            })?;
    }
    for migration in MIGRATIONS {
        record(&tx, migration).await?;
    }
    tx.commit().await?;
    Ok(MigrateReport {
        changed: MIGRATIONS.iter().map(|m| m.version).collect(),
        version: latest_version(),
    })
}

/// Reverses applied migrations, newest first, until the database is at version `target`.
///
/// # Errors
/// [`SchemaError::UnknownVersion`] for an applied version this release does not know,
/// [`SchemaError::ChecksumMismatch`] when the applied migration is not this release's,
/// [`SchemaError::Failed`] when a `down` script fails, and database errors.
pub async fn migrate_down_to(client: &mut Client, target: i32) -> Result<MigrateReport, Error> {
    let mut changed = Vec::new();
    loop {
        let tx = begin_locked(client).await?;
        let version = current_version(&tx).await?;
        if version <= target {
            tx.commit().await?;
            return Ok(MigrateReport { changed, version });
        }
        let migration = MIGRATIONS
            .iter()
            .find(|m| m.version == version)
            .ok_or(SchemaError::UnknownVersion { version })?;
        let row = tx
            .query_typed_one(
                "SELECT checksum FROM durable_etl_schema_history WHERE version = $1",
                &[(&version, Type::INT4)],
            )
            .await?;
        if row.get::<_, String>(0) != migration.checksum() {
            return Err(SchemaError::ChecksumMismatch { version }.into());
        }
        run_script(&tx, migration.down, version).await?;
        tx.execute_typed(
            "DELETE FROM durable_etl_schema_history WHERE version = $1",
            &[(&version, Type::INT4)],
        )
        .await?;
        tx.commit().await?;
        changed.push(version);
    }
}

/// Opens the pool of a long-running role on `db_config`, checks that the server applies the
/// session limits (which, on Citus, readies the node views the schema is read through) and that
/// the schema is one this release can run against; returns the pool and the schema version.
///
/// # Errors
/// As [`crate::db::connect_pool`], [`crate::db::check_session_settings`] and
/// [`check_compatible`].
pub async fn open_checked(
    db_config: &crate::config::DatabaseConfig,
    role: &str,
) -> Result<(crate::db::Pool, i32), Error> {
    let pool = crate::db::connect_pool(db_config, role).await?;
    let conn = crate::db::checkout(&pool).await?;
    crate::db::check_session_settings(&*conn, db_config).await?;
    let version = check_compatible(&conn).await?;
    drop(conn);
    Ok((pool, version))
}

/// Runs migration `version`'s script `sql` on `tx`, a part at a time: the parts are split at each
/// [`CELL_BASELINE_BREAK`] line, each sent as one query (Citus propagates a DDL statement to the
/// nodes with the text of the query that held it, so a part that changes a distributed table
/// holds that statement alone).
///
/// # Errors
/// [`SchemaError::Failed`] when a part fails.
async fn run_script(
    tx: &tokio_postgres::Transaction<'_>,
    sql: &str,
    version: i32,
) -> Result<(), Error> {
    for part in sql.split(&format!("\n{CELL_BASELINE_BREAK}\n")) {
        tx.batch_execute(part)
            .await
            .map_err(|source| SchemaError::Failed { version, source })?;
    }
    Ok(())
}

/// Checks that the database schema is one this release can run against, and returns its version.
/// Reads only; takes no lock.
///
/// # Errors
/// [`SchemaError::TooOld`] for an unmigrated or older database, [`SchemaError::TooNew`] for one a
/// newer release migrated incompatibly, [`SchemaError::ChecksumMismatch`] for one whose applied
/// migrations differ from this release's, and database errors.
pub async fn check_compatible(client: &Client) -> Result<i32, Error> {
    let required = latest_version();
    let exists: bool = client
        .query_typed_one(
            "SELECT to_regclass('durable_etl_schema_history') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        return Err(SchemaError::TooOld { found: 0, required }.into());
    }
    let rows = client
        .query_typed(
            "SELECT version, checksum, min_reader_version
               FROM durable_etl_schema_history ORDER BY version",
            &[],
        )
        .await?;
    let applied: Vec<(i32, String, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let found = applied.last().map_or(0, |a| a.0);
    for migration in MIGRATIONS {
        match applied.iter().find(|a| a.0 == migration.version) {
            None => return Err(SchemaError::TooOld { found, required }.into()),
            Some(a) if a.1 != migration.checksum() => {
                return Err(SchemaError::ChecksumMismatch {
                    version: migration.version,
                }
                .into())
            }
            Some(_) => {}
        }
    }
    let needs = applied.iter().map(|a| a.2).max().unwrap_or(0);
    if needs > required {
        return Err(SchemaError::TooNew {
            found,
            needs,
            supported: required,
        }
        .into());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
            assert!(m.min_reader_version <= m.version);
            assert!(m.min_reader_version >= 1);
            assert_eq!(m.checksum().len(), 64);
            assert!(!m.down.trim().is_empty());
        }
        assert_eq!(latest_version(), MIGRATIONS.last().map_or(0, |m| m.version));
    }
}
