//! Who holds a replica's owner lock, as a starting replica sees it: the backend, whether it is a
//! durable-etl session, and how long it has been silent.
//!
//! Invariants this module keeps:
//! - It only reads (`pg_locks`, `pg_stat_activity`); deciding what to do with the holder is the
//!   session's.

use crate::error::Error;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// The backend holding owner `$1`'s lock: its pid, whether it is a durable-etl session, when its
/// state last changed, and for how many seconds it has been silent.
///
/// Locks: none (reads `pg_locks` and `pg_stat_activity`).
pub(crate) const HOLDER_ACTIVITY_SQL: &str = "
SELECT h.pid, a.application_name = 'durable-etl/session', a.state_change,
       extract(epoch FROM clock_timestamp() - a.state_change)::float8
  FROM (SELECT l.pid
          FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ((l.classid::bigint << 32) | l.objid::bigint) = durable_etl_owner_lock_key($1)) h
  JOIN pg_stat_activity a ON a.pid = h.pid";

/// What a starting replica sees of the backend holding its owner lock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holder {
    /// The holder's backend pid.
    pub(super) pid: i32,
    /// Whether it is a durable-etl session (anything else holding the key is never evicted).
    pub(super) is_session: bool,
    /// When its state last changed (a live session's probes change it).
    pub(super) last_active: chrono::DateTime<chrono::Utc>,
    /// Seconds since then.
    pub(super) silent_for: f64,
}

/// The backend holding `owner_id`'s lock, if any.
pub(super) async fn lock_holder(client: &Client, owner_id: &str) -> Result<Option<Holder>, Error> {
    let row = client
        .query_typed_opt(HOLDER_ACTIVITY_SQL, &[(&owner_id, Type::TEXT)])
        .await?;
    Ok(row.map(|r| Holder {
        pid: r.get(0),
        is_session: r.get::<_, Option<bool>>(1).unwrap_or(false),
        last_active: r
            .get::<_, Option<chrono::DateTime<chrono::Utc>>>(2)
            .unwrap_or_default(),
        silent_for: r.get::<_, Option<f64>>(3).unwrap_or(0.0),
    }))
}
