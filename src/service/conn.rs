//! The API's pooled connections, never handed back to the pool busy.
//!
//! A handler's future is dropped mid-statement when its request runs out of time (the timeout
//! layer answers `503 request_timeout`) or its client goes away. tokio-postgres has sent the
//! statement by then and the server still runs it, so a connection that went straight back to
//! the pool would make the next request that checks it out queue behind that statement (for up
//! to `statement_timeout`: 5 of 8 concurrent `GET`s hung 30 s, then answered 503).
//!
//! Invariants this module keeps:
//! - Handlers (the API's and the console's) run their statements through [`Conn::run`]; a future
//!   dropped inside it leaves the connection marked cut.
//! - A cut connection is never reused: its drop hands it to a task that sends the server a
//!   cancel request for the backend's running statement, then one `ROLLBACK`, whose reply comes
//!   only after the replies of everything sent before it (and which ends any transaction the cut
//!   left open), then ends its own session. The driver sends a cancel request and returns without
//!   waiting for the server to act on it, so one that lands after the cut statement ended would
//!   cancel whatever the session ran next: a later request's statement. Its session gone, the
//!   connection comes back closed and the pool opens another when it needs one. Until then it
//!   stays checked out: a statement the cancel did not reach (a pooler that drops cancel
//!   requests) holds it until the server's `statement_timeout` ends it, never a request's.
//! - A connection whose statements all returned (with a result or an error) goes back to the pool
//!   at once, with no extra round trip.

use crate::db::{self, Manager, Pool};
use crate::error::Error;
use std::future::Future;
use tokio_postgres::Client;

/// A pooled connection of the API's pool, owned (so a cut one can outlive its request).
type Pooled = bb8::PooledConnection<'static, Manager>;

/// How many `ROLLBACK`s a cut connection is given to come back idle: a cancel request that
/// reaches the backend only after the cut statement ended can cancel the first one.
const SETTLE_ATTEMPTS: usize = 2;

/// How long a retired connection is given to be seen closed, in polls of [`RETIRE_POLL`].
const RETIRE_POLLS: usize = 200;

/// The pause between two looks at whether a retired connection is closed.
const RETIRE_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// A connection checked out for one request. See the module documentation.
pub(super) struct Conn {
    /// The connection; taken only by the drop of a cut one.
    pooled: Option<Pooled>,
    /// Whether a [`Conn::run`] started and did not finish (its future was dropped).
    cut: bool,
    /// The pool it came from.
    pool: Pool,
}

impl Conn {
    /// A live connection of `pool`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the pool cannot hand out a live connection in time.
    pub(super) async fn checkout(pool: &Pool) -> Result<Conn, Error> {
        Ok(Conn {
            pooled: Some(db::checkout_owned(pool).await?),
            cut: false,
            pool: pool.clone(),
        })
    }

    /// The pool the connection came from (its cell's, on a routed API).
    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs `statements` on the connection. Should the future be dropped before they finish, the
    /// connection is cancelled and settled before anyone reuses it.
    ///
    /// # Errors
    /// The statements' own error; [`Error::Internal`] if the connection is gone (never: only a
    /// drop takes it).
    pub(super) async fn run<'c, T, E, Fut>(
        &'c mut self,
        statements: impl FnOnce(&'c mut Client) -> Fut,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, E>>,
        Error: From<E>,
    {
        let Conn { pooled, cut, .. } = self;
        let client = pooled.as_deref_mut().ok_or(Error::Internal)?;
        *cut = true;
        let done = statements(client).await;
        *cut = false;
        done.map_err(Error::from)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.cut {
            return;
        }
        let Some(pooled) = self.pooled.take() else {
            return;
        };
        // Without a runtime there is no pool left to hand the connection to: it is dropped with
        // the process.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(settle(pooled));
        }
    }
}

/// Cancels what a cut connection's backend runs, waits until it answers a `ROLLBACK` (everything
/// sent before it has ended), then retires it ([`retire`]) and hands it back to the pool, which
/// discards it.
async fn settle(pooled: Pooled) {
    tracing::info!("a request ended mid-statement: cancelling the statement before reuse");
    if let Err(e) = db::cancel(&pooled.cancel_token()).await {
        tracing::warn!(
            code = %Error::from(e).code(),
            "the cancel request failed; the connection returns once its statement ends"
        );
    }
    for _ in 0..SETTLE_ATTEMPTS {
        match pooled.batch_execute("ROLLBACK").await {
            Ok(()) => break,
            // A closed connection is discarded by the pool when it comes back.
            Err(e) if e.is_closed() => return,
            Err(_) => {}
        }
    }
    retire(&pooled).await;
}

/// Ends the session of a settled connection (its own backend: the role needs no privilege for
/// that), so a cancel request that lands late finds no later statement to cancel, and waits
/// (bounded) until the driver has seen the session end, so the pool discards the connection when
/// it comes back. Behind a pooler that keeps the client connection open, it comes back open, and
/// is used again as before.
async fn retire(pooled: &Pooled) {
    let _ended = pooled
        .batch_execute("SELECT pg_terminate_backend(pg_backend_pid())")
        .await;
    for _ in 0..RETIRE_POLLS {
        if pooled.is_closed() {
            return;
        }
        tokio::time::sleep(RETIRE_POLL).await;
    }
}
