//! Whether the database URL keeps one server session per client between transactions, as
//! `--pooler none` and `--pooler session` assume: checked once at a replica's start, so that a
//! transaction-mode pooler on a URL not declared so stops the replica the same way every time
//! instead of failing some of its statements at random.
//!
//! Invariants this module keeps:
//! - The check never fails a URL that keeps sessions: it fails only on what a direct connection
//!   or a session-mode pooler cannot do, two clients' transactions running on one server backend
//!   at once apart, or one client's transactions running on two backends.
//! - It moves a transaction-mode pooler's server connection on purpose rather than hoping for
//!   traffic to do it: the backend that just served the first client is, in PgBouncer's default
//!   last-in-first-out reuse, the one the second client's transaction gets (caught at once), and
//!   if another was handed out, the first client's next statement runs while that transaction
//!   holds it (caught when it lands elsewhere).
//! - Every statement is sent unnamed, so the check itself meets no missing prepared statement.

use crate::config::{ConfigError, DatabaseConfig};
use crate::db::{bounded, checkout, connect_error, Pool};
use crate::error::Error;
use tokio_postgres::GenericClient;

/// How many times the check tries to move the first client's server connection (each try is
/// three round trips and a transaction's two).
const ROUNDS: usize = 3;

/// The backend running the statement: its pid and its start (together unique over the
/// server's life). Locks: none.
const BACKEND_SQL: &str = "
SELECT pg_backend_pid(), backend_start::text
  FROM pg_stat_activity WHERE pid = pg_backend_pid() AND datname = current_database()";

/// A server backend, as [`BACKEND_SQL`] names it.
type Backend = (i32, Option<String>);

/// Fails with [`ConfigError::TransactionPooler`] when `pool` (opened with `cfg`) does not keep a
/// server session per client although `cfg.pooler` says it does (see the module's invariants);
/// does nothing behind a pooler declared transaction-mode.
///
/// # Errors
/// [`ConfigError::TransactionPooler`]; database errors, and [`Error::Unavailable`] when a
/// statement does not answer within the connect timeout.
pub(crate) async fn check(pool: &Pool, cfg: &DatabaseConfig) -> Result<(), Error> {
    if !cfg.pooler.keeps_sessions() {
        return Ok(());
    }
    let first = checkout(pool).await?;
    let mut second = pool
        .dedicated_connection()
        .await
        .map_err(|e| connect_error(cfg, e))?;
    let bound = cfg.connect_timeout.saturating_add(cfg.statement_timeout);
    for _ in 0..ROUNDS {
        let served = bounded(bound, backend(&*first)).await?;
        let holding = second.transaction().await?;
        if bounded(bound, backend(&holding)).await? == served {
            return Err(ConfigError::TransactionPooler.into());
        }
        // While `holding` is open its backend is its own: the first client's next statement
        // cannot run on it, and under a session-keeping URL runs where its last one did.
        let again = bounded(bound, backend(&*first)).await?;
        holding.rollback().await?;
        if again != served {
            return Err(ConfigError::TransactionPooler.into());
        }
    }
    Ok(())
}

/// The backend that runs a statement of `client` ([`BACKEND_SQL`]).
async fn backend(client: &impl GenericClient) -> Result<Backend, tokio_postgres::Error> {
    let row = client.query_typed_one(BACKEND_SQL, &[]).await?;
    Ok((row.get(0), row.get(1)))
}
