//! The connection budget: the most connections a process opens to its database URL (backends,
//! or a pooler's clients) and to `--session-database-url`, from its configuration alone.
//!
//! Invariants this module keeps:
//! - Every connection a replica or the API opens while running belongs to one of these pools or
//!   dedicated sessions, each bounded by its size here; nothing else opens one (a cancel request
//!   opens a connection that takes no backend: the server answers it before starting one).
//! - `tests/it/budget.rs` holds every process to its [`Budget::total`], counted from
//!   `pg_stat_activity` idle and under load.

use crate::config::{DatabaseConfig, WorkerConfig};
use crate::worker::claimer::CLAIM_POOL_SIZE;
use crate::worker::complete::group_commit::sessions::COMMIT_POOL_SIZE;

/// The most connections of each kind a process opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Budget {
    /// The general pool (`--pool-size`, `durable-etl/worker` or `durable-etl/api`).
    pub pool: u32,
    /// A replica's claim sessions (`durable-etl/claimer`).
    pub claim: u32,
    /// A replica's commit sessions (`durable-etl/worker`, one per commit lane and a spare).
    pub commit: u32,
    /// A replica's long-lived session (`durable-etl/session`: LISTEN and owner lock), on
    /// `--session-database-url` when given; none without a direct session behind a
    /// transaction-mode pooler or in poll-only mode.
    pub session: u32,
    /// The API's notifier connection (`durable-etl/notifier`).
    pub notifier: u32,
}

impl Budget {
    /// The budget of a worker replica with `config` on `db`.
    pub fn replica(db: &DatabaseConfig, config: &WorkerConfig) -> Budget {
        let direct = config.session_database_url.is_some();
        let session = direct || config.alive_locked(db);
        Budget {
            pool: db.pool_max_size,
            claim: CLAIM_POOL_SIZE,
            commit: COMMIT_POOL_SIZE,
            session: u32::from(session),
            notifier: 0,
        }
    }

    /// The budget of the API (`serve`) on `db`.
    pub fn api(db: &DatabaseConfig) -> Budget {
        Budget {
            pool: db.pool_max_size,
            claim: 0,
            commit: 0,
            session: 0,
            notifier: 1,
        }
    }

    /// All of them: `pool + claim + commit + session + notifier`.
    pub fn total(&self) -> u32 {
        self.pool + self.claim + self.commit + self.session + self.notifier
    }
}

/// Logs, as a replica with `config` on `db` starts, how it connects: the pooler, whether it
/// prepares statements and holds alive locks, whether its session is direct, and its budget.
pub(crate) fn announce(db: &DatabaseConfig, config: &WorkerConfig) {
    let budget = Budget::replica(db, config);
    tracing::info!(
        pooler = db.pooler.as_str(),
        prepared_statements = db.pooler.keeps_sessions(),
        alive_locks = config.alive_locked(db),
        direct_session = config.session_database_url.is_some(),
        connections_max = budget.total(),
        "replica connections"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Pooler;

    #[test]
    fn a_replica_holds_its_pool_and_six_and_the_api_its_pool_and_one() {
        let db = DatabaseConfig::default();
        let worker = WorkerConfig::default();
        assert_eq!(Budget::replica(&db, &worker).total(), db.pool_max_size + 6);
        assert_eq!(Budget::api(&db).total(), db.pool_max_size + 1);
        let small = DatabaseConfig {
            pool_max_size: 2,
            ..db.clone()
        };
        assert_eq!(Budget::replica(&small, &worker).total(), 8);
    }

    #[test]
    fn a_replica_without_a_direct_session_holds_none() {
        let pooled = DatabaseConfig {
            pooler: Pooler::Transaction,
            ..DatabaseConfig::default()
        };
        let worker = WorkerConfig::default();
        assert_eq!(Budget::replica(&pooled, &worker).session, 0);
        let direct = WorkerConfig {
            session_database_url: Some("postgres://direct/db".to_owned()),
            ..worker.clone()
        };
        assert_eq!(Budget::replica(&pooled, &direct).session, 1);
        let poll_only = WorkerConfig {
            poll_only: true,
            ..worker
        };
        let db = DatabaseConfig::default();
        assert_eq!(Budget::replica(&db, &poll_only).session, 0);
    }
}
