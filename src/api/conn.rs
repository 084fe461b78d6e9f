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
//! - A cut connection is never reused as is: its drop hands it to a task that sends the server a
//!   cancel request for the backend's running statement, then one `ROLLBACK`, whose reply comes
//!   only after the replies of everything sent before it (and which ends any transaction the cut
//!   left open). Only then does the connection go back to the pool; one that failed meanwhile is
//!   discarded by the pool. Until then it stays checked out: a statement the cancel did not reach
//!   (a pooler that drops cancel requests) holds it until the server's `statement_timeout` ends
//!   it, never a request's.
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

/// A connection checked out for one request. See the module documentation.
pub(super) struct Conn {
    /// The connection; taken only by the drop of a cut one.
    pooled: Option<Pooled>,
    /// Whether a [`Conn::run`] started and did not finish (its future was dropped).
    cut: bool,
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
        })
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
        let Conn { pooled, cut } = self;
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

/// Cancels what a cut connection's backend runs, then waits until it answers a `ROLLBACK`
/// (everything sent before it has ended), and hands it back to the pool.
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
            Ok(()) => return,
            // A closed connection is discarded by the pool when it comes back.
            Err(e) if e.is_closed() => return,
            Err(_) => {}
        }
    }
}
