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

use crate::error::{Error, SchemaError};
use sha2::{Digest, Sha256};
use tokio_postgres::{types::Type, Client};

/// One schema migration: an `up` script, the `down` script that reverses it, and its compatibility.
#[derive(Debug)]
pub struct Migration {
    /// The version, from 1, without gaps.
    pub version: i32,
    /// A short snake_case name.
    pub name: &'static str,
    /// The SQL that applies the migration.
    pub up: &'static str,
    /// The SQL that reverses it exactly.
    pub down: &'static str,
    /// The oldest schema version a release may know and still run against a database at this
    /// version: equal to `version` for a breaking change, lower for an additive one.
    pub min_reader_version: i32,
}

impl Migration {
    /// The hex SHA-256 of the `up` SQL, as recorded in the history table.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.up.as_bytes()))
    }
}

/// Every migration this release knows, in version order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "job_schema",
        up: include_str!("../migrations/0001_job_schema.up.sql"),
        down: include_str!("../migrations/0001_job_schema.down.sql"),
        min_reader_version: 1,
    },
    Migration {
        version: 2,
        name: "lease_owner_locked",
        up: include_str!("../migrations/0002_lease_owner_locked.up.sql"),
        down: include_str!("../migrations/0002_lease_owner_locked.down.sql"),
        min_reader_version: 1,
    },
    Migration {
        version: 3,
        name: "fencing_token_claim_plan_retention",
        up: include_str!("../migrations/0003_fencing_token_claim_plan_retention.up.sql"),
        down: include_str!("../migrations/0003_fencing_token_claim_plan_retention.down.sql"),
        // Breaking for readers: a release that knows only 0001 or 0002 claims without advancing
        // the fencing token or stamping the renewal time, and its recovery kills the jobs of
        // live replicas whose owner lock is briefly gone (docs/migrations.md).
        min_reader_version: 3,
    },
    Migration {
        version: 4,
        name: "cancel_requests",
        up: include_str!("../migrations/0004_cancel_requests.up.sql"),
        down: include_str!("../migrations/0004_cancel_requests.down.sql"),
        // A release before it would ignore the cancel requests recorded here.
        min_reader_version: 4,
    },
    Migration {
        version: 5,
        name: "notify_opt_out",
        up: include_str!("../migrations/0005_notify_opt_out.up.sql"),
        down: include_str!("../migrations/0005_notify_opt_out.down.sql"),
        // Additive: a release that never sets `durable_etl.notify` notifies as before. Not below
        // 4, because a database at 5 holds 0004's cancel requests, which older releases ignore.
        min_reader_version: 4,
    },
    Migration {
        version: 6,
        name: "ledger_without_fk",
        up: include_str!("../migrations/0006_ledger_without_fk.up.sql"),
        down: include_str!("../migrations/0006_ledger_without_fk.down.sql"),
        // Additive for readers: releases that know 0004 write ledger rows the same way.
        min_reader_version: 4,
    },
    Migration {
        version: 7,
        name: "jobs_view",
        up: include_str!("../migrations/0007_jobs_view.up.sql"),
        down: include_str!("../migrations/0007_jobs_view.down.sql"),
        // Additive: a view no release before it reads.
        min_reader_version: 4,
    },
    Migration {
        version: 8,
        name: "live_rows_and_outcomes",
        up: include_str!("../migrations/0008_live_rows_and_outcomes.up.sql"),
        down: include_str!("../migrations/0008_live_rows_and_outcomes.down.sql"),
        // Breaking for readers: the job table keeps live jobs only, ended jobs are outcome rows
        // and the ledger moved into them; no release before it can read or write this layout.
        min_reader_version: 8,
    },
    Migration {
        version: 9,
        name: "waiting_replicas",
        up: include_str!("../migrations/0009_waiting_replicas.up.sql"),
        down: include_str!("../migrations/0009_waiting_replicas.down.sql"),
        // Additive for readers: a release before it never registers as waiting, and is woken
        // whenever a newer replica waits, else found by its poll (docs/migrations.md).
        min_reader_version: 8,
    },
    Migration {
        version: 10,
        name: "operator_keys",
        up: include_str!("../migrations/0010_operator_keys.up.sql"),
        down: include_str!("../migrations/0010_operator_keys.down.sql"),
        // Additive: a column no release before it reads, with a default for the keys it creates.
        min_reader_version: 8,
    },
    Migration {
        version: 11,
        name: "replica_reports",
        up: include_str!("../migrations/0011_replica_reports.up.sql"),
        down: include_str!("../migrations/0011_replica_reports.down.sql"),
        // Additive: tables that releases before it never read or write.
        min_reader_version: 8,
    },
    Migration {
        version: 12,
        name: "attempt_history",
        up: include_str!("../migrations/0012_attempt_history.up.sql"),
        down: include_str!("../migrations/0012_attempt_history.down.sql"),
        // Additive for readers: a table that releases before it never read or write; the attempts
        // they end are only missing from the console's timeline.
        min_reader_version: 8,
    },
    Migration {
        version: 13,
        name: "cancel_on_live_row",
        up: include_str!("../migrations/0013_cancel_on_live_row.up.sql"),
        down: include_str!("../migrations/0013_cancel_on_live_row.down.sql"),
        // Breaking for readers: cancel requests moved from their table onto the live row, so
        // that a request and a commit serialize on the row lock; releases before it read the
        // table, which is gone.
        min_reader_version: 13,
    },
    Migration {
        version: 14,
        name: "owner_alive_locks",
        up: include_str!("../migrations/0014_owner_alive_locks.up.sql"),
        down: include_str!("../migrations/0014_owner_alive_locks.down.sql"),
        // Breaking for readers: the claim stamps the owner's heartbeat interval and alive locks,
        // which releases before it would leave stale on rows they give back or claim.
        min_reader_version: 14,
    },
    Migration {
        version: 15,
        name: "ended_sessions_and_incarnations",
        up: include_str!("../migrations/0015_ended_sessions_and_incarnations.up.sql"),
        down: include_str!("../migrations/0015_ended_sessions_and_incarnations.down.sql"),
        // Additive for the queue: a table and columns of the console's; releases before it keep
        // running, their replicas' reports refused and their cookies not accepted by the new
        // console (docs/migrations.md).
        min_reader_version: 8,
    },
    Migration {
        version: 16,
        name: "pending_owner_listing",
        up: include_str!("../migrations/0016_pending_owner_listing.up.sql"),
        down: include_str!("../migrations/0016_pending_owner_listing.down.sql"),
        // Additive: an index that releases before it never use.
        min_reader_version: 8,
    },
    Migration {
        version: 17,
        name: "optional_ledger",
        up: include_str!("../migrations/0017_optional_ledger.up.sql"),
        down: include_str!("../migrations/0017_optional_ledger.down.sql"),
        // Additive for readers: releases before it write a ledger for every success, which the
        // new rule admits, and read the ledger as optional already.
        min_reader_version: 8,
    },
    Migration {
        version: 18,
        name: "kind_failure_codes",
        up: include_str!("../migrations/0018_kind_failure_codes.up.sql"),
        down: include_str!("../migrations/0018_kind_failure_codes.down.sql"),
        // Additive for readers: releases before it read the code as text and never run the
        // kinds that declare codes of their own.
        min_reader_version: 8,
    },
    Migration {
        version: 19,
        name: "name_checks_without_regex",
        up: include_str!("../migrations/0019_name_checks_without_regex.up.sql"),
        down: include_str!("../migrations/0019_name_checks_without_regex.down.sql"),
        // The same rows are admitted: nothing a reader or writer does changes.
        min_reader_version: 8,
    },
    Migration {
        version: 20,
        name: "queues_and_priorities",
        up: include_str!("../migrations/0020_queues_and_priorities.up.sql"),
        down: include_str!("../migrations/0020_queues_and_priorities.down.sql"),
        // Breaking for readers: a release before it inserts live rows without their virtual
        // deadline and claims every queue through an index that is gone.
        min_reader_version: 20,
    },
    Migration {
        version: 21,
        name: "queue_caps",
        up: include_str!("../migrations/0021_queue_caps.up.sql"),
        down: include_str!("../migrations/0021_queue_caps.down.sql"),
        // Additive for readers: release 20 takes and frees no permits (a mixed fleet can exceed
        // a cap, never lose a job).
        min_reader_version: 20,
    },
    Migration {
        version: 22,
        name: "key_caps",
        up: include_str!("../migrations/0022_key_caps.up.sql"),
        down: include_str!("../migrations/0022_key_caps.down.sql"),
        // Breaking for readers: a release before it frees no key permit, so a claim of this
        // release that it recovered or finished would leave its key's permit held for good.
        min_reader_version: 22,
    },
    Migration {
        version: 23,
        name: "freer_claims",
        up: include_str!("../migrations/0023_freer_claims.up.sql"),
        down: include_str!("../migrations/0023_freer_claims.down.sql"),
        // Additive for readers: release 22 never marks its completions, so its freed permits
        // wake the waiting replicas as before.
        min_reader_version: 22,
    },
    Migration {
        version: 24,
        name: "targeted_wakes",
        up: include_str!("../migrations/0024_targeted_wakes.up.sql"),
        down: include_str!("../migrations/0024_targeted_wakes.down.sql"),
        // Additive for readers: their rows have no token and get the empty NOTIFY, as before.
        min_reader_version: 22,
    },
];

/// The release recorded in the history table by the migrations it applies.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The advisory-lock key every migration transaction takes (`durable` and 1, as ASCII).
pub const MIGRATION_LOCK_KEY: i64 = 0x6475_7261_626c_6501;

/// The schema version this release needs and writes.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

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
/// [`migrate_up`] does: advisory-locked, so replicas may all do it at start-up.
///
/// # Errors
/// As [`migrate_up`]; connection errors.
pub async fn migrate(db: &crate::config::DatabaseConfig) -> Result<MigrateReport, Error> {
    let mut client = crate::db::connect(db, "migrate").await?;
    migrate_up(&mut client).await
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
                tx.batch_execute(migration.up)
                    .await
                    .map_err(|source| SchemaError::Failed {
                        version: migration.version,
                        source,
                    })?;
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
        tx.batch_execute(migration.down)
            .await
            .map_err(|source| SchemaError::Failed { version, source })?;
        tx.execute_typed(
            "DELETE FROM durable_etl_schema_history WHERE version = $1",
            &[(&version, Type::INT4)],
        )
        .await?;
        tx.commit().await?;
        changed.push(version);
    }
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
