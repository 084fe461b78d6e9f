//! The alive lock: how recovery tells a replica whose process is gone from one whose session
//! merely dropped.
//!
//! Invariants this module keeps:
//! - Every connection a replica opens for itself (its long-lived session, each claim session,
//!   each commit session) takes a shared session-level advisory lock on
//!   `durable_etl_owner_alive_key(owner id)` when it opens, unless the replica runs behind a
//!   transaction-mode pooler (`--poll-only`), where a session-level lock would stick to a server
//!   connection other clients share. The lock lives exactly as long as that connection.
//! - So "no backend holds the owner's alive lock, nor its owner lock" means every connection of
//!   the replica vanished at once: its process died, or every connection was cut (which the
//!   replica's beats tell apart, see `beat`; and a server that lost every one of them, recovery
//!   by its own view of the database, see `rescuer`). One dropped session, a pool's reconnect or
//!   a terminated backend leaves the other connections' locks.
//! - Claims stamp whether the claimant holds alive locks (`lease_owner_alive_locked`), so
//!   recovery judges each owner by what it really does; the locks are shared, so a replica's
//!   connections never wait for each other, and the key differs from the owner lock's (which is
//!   exclusive and held by the session alone), so they never conflict with it.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Takes owner `$1`'s alive lock, shared, on this session.
///
/// Locks: a shared session-level advisory lock (never waits: shared locks conflict only with an
/// exclusive lock on the same key, which nothing takes).
pub(crate) const HOLD_ALIVE_LOCK_SQL: &str =
    "SELECT pg_advisory_lock_shared(durable_etl_owner_alive_key($1))";

/// Takes `owner_id`'s alive lock on `client`'s session, when `owner_id` is given (a replica
/// that holds alive locks); for as long as the connection lives.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn hold(
    client: &Client,
    owner_id: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    if let Some(owner_id) = owner_id {
        client
            .query_typed_one(HOLD_ALIVE_LOCK_SQL, &[(&owner_id, Type::TEXT)])
            .await?;
    }
    Ok(())
}
