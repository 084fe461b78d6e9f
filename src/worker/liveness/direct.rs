//! Which session a replica opens: on the direct URL when it has one, on the database URL unless
//! that URL cannot keep a session (poll-only mode, a transaction-mode pooler), else none.

use super::session::{Session, SessionConfig};
use crate::config::{DatabaseConfig, Pooler, WorkerConfig};
use crate::db::Pool;
use crate::error::Error;
use crate::worker::stats::WorkerStats;
use std::sync::Arc;

/// Opens the session a replica with `config` needs, on the direct URL (`--session-database-url`,
/// which reaches PostgreSQL itself whatever pooler the database URL has, else the database's):
/// none without a direct URL in poll-only mode or behind a transaction-mode pooler, where no
/// owner lock can be held (said loudly, since dead owners are then found by lease expiry alone).
/// The session beats through `pool` while it reconnects.
///
/// # Errors
/// As [`Session::start`].
pub(crate) async fn open_for(
    config: &WorkerConfig,
    db_config: &DatabaseConfig,
    pool: &Pool,
    stats: Arc<WorkerStats>,
) -> Result<Option<Session>, Error> {
    let direct = config.session_database_url.clone();
    if direct.is_none() && (config.poll_only || !db_config.pooler.keeps_sessions()) {
        tracing::warn!(
            pooler = db_config.pooler.as_str(),
            "no direct session (poll-only, or a transaction-mode pooler without \
             --session-database-url): no LISTEN and no owner lock, so the poll alone finds work, \
             a dead replica's jobs are recovered by lease expiry only, and a second replica with \
             the same owner id cannot be detected"
        );
        return Ok(None);
    }
    let session_config = SessionConfig {
        database: match direct {
            Some(url) => DatabaseConfig {
                url,
                pooler: Pooler::None,
                ..db_config.clone()
            },
            None => db_config.clone(),
        },
        owner_id: config.owner_id.clone(),
        listen: !config.poll_only,
        alive: config.alive_locked(db_config),
        pool: pool.clone(),
    };
    Ok(Some(Session::start(session_config, stats).await?))
}
