//! The session's probe: every few seconds the session proves, on itself, that it is alive and
//! still listening, and in the same statement counts the commits of its database that are
//! stuck waiting for a synchronous standby.
//!
//! Invariants this module keeps:
//! - One read-only statement per probe: it writes nothing, so it never waits for a standby
//!   itself, and it answers even while every commit of the database is held.
//! - A commit counts as stuck once it has waited (`wait_event = 'SyncRep'`) in a statement
//!   started longer than the given threshold ago; the count covers the backends whose activity
//!   the session's role may read (its own role's, or all with `pg_read_all_stats`).
//! - The count goes to the `commits_waiting_for_standby` gauge, and only its changes to and from
//!   0 are logged, with a stable code and the count: never a query or a backend's identity.

use crate::codes::Code;
use crate::worker::stats::WorkerStats;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Whether the session listens on the deployment's channel (`durable_etl_channel()`), and how
/// many backends of its database have waited for a synchronous standby at their commit in a
/// statement started more than `$1` seconds ago.
///
/// Locks: none (reads `pg_listening_channels()` and `pg_stat_activity`).
pub(crate) const PROBE_SQL: &str = "
SELECT EXISTS (SELECT 1 FROM pg_listening_channels() AS c WHERE c = durable_etl_channel()),
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'SyncRep'
           AND query_start < clock_timestamp() - make_interval(secs => $1))";

/// What one probe saw.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    /// Whether the session listens on the deployment's channel.
    pub(super) listening: bool,
    /// Commits of the database stuck waiting for a synchronous standby.
    pub(super) waiting_for_standby: u64,
}

/// Runs the probe on `client`, counting commits stuck for longer than `stuck_after`.
///
/// # Errors
/// The statement's.
pub(super) async fn look(
    client: &Client,
    stuck_after: Duration,
) -> Result<Seen, tokio_postgres::Error> {
    let row = client
        .query_typed_one(PROBE_SQL, &[(&stuck_after.as_secs_f64(), Type::FLOAT8)])
        .await?;
    Ok(Seen {
        listening: row.get(0),
        waiting_for_standby: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
    })
}

/// Records `waiting` commits stuck for a synchronous standby in `stats`, and logs the change when
/// the count leaves 0 (an error: nothing commits until a standby is back or none is required)
/// or returns to it.
pub(super) fn report(stats: &WorkerStats, waiting: u64) {
    let before = stats
        .commits_waiting_for_standby
        .swap(waiting, Ordering::Relaxed);
    if before == 0 && waiting > 0 {
        tracing::error!(
            code = %Code::SynchronousStandbyWaiting,
            commits = waiting,
            "commits are waiting for a synchronous standby: no job can be claimed or end until \
             a standby is back or synchronous_standby_names names none"
        );
    } else if before > 0 && waiting == 0 {
        tracing::info!("no commit waits for a synchronous standby any more");
    }
}
