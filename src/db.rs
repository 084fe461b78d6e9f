//! Connections to PostgreSQL: the pool, dedicated sessions, and session settings.
//!
//! Invariants this module keeps:
//! - Every session this crate opens sets `statement_timeout`, `lock_timeout` and
//!   `idle_in_transaction_session_timeout` at start-up (in the startup packet, so it costs no round
//!   trip), so a frozen process cannot hold a row lock forever.
//! - Every socket has TCP keepalives (idle, interval and count) and a `TCP_USER_TIMEOUT` on both
//!   sides, so a silently lost server or client is noticed, even mid-statement.
//! - The worker bounds its own statements client-side too ([`bounded`]).
//! - `application_name` is `durable-etl/<role>`: never an id, a payload or a principal.
//! - Every session is opened by a [`Connector`] (see `connect`): TLS as the URL's `sslmode`
//!   asks (see `tls`), each attempt at a host bounded by the connect timeout end to end, the
//!   hosts of a multi-host URL tried in turn.
//! - Start-up is bounded ([`StartUp`]): every start-up step runs before one deadline, each attempt
//!   is bounded too, and a lost connection is retried with backoff until the deadline.
//! - A connection the server refuses for a reason retrying cannot fix (SQLSTATE class 28, 3D000,
//!   a pooler's permanent 08P01) is [`Error::Refused`], naming the address, database and role
//!   (never the password).
//! - `serve` and `work` check at start that the server applies the session limits
//!   ([`check_session_settings`]), since a pooler may refuse or drop start-up options; a replica
//!   whose URL is not declared a transaction-mode pooler checks that it keeps its server session
//!   (`worker::liveness::sessions_kept`).
//! - The tools' throw-away databases (`demo`, `bench`) are dropped only by the tool that created
//!   them, and never while in use (see `owned`).

use crate::config::{ConfigError, DatabaseConfig};
use crate::error::{Error, Target};
use std::time::Duration;
use tokio_postgres::Client;

/// The connection pool every component shares.
pub type Pool = bb8::Pool<Manager>;

/// The tokio-postgres configuration for `role` (a fixed word such as `worker` or `api`); the
/// URL's TLS parameters as the driver knows them ([`DatabaseConfig::driver_url`]).
///
/// # Errors
/// [`ConfigError::DatabaseUrl`] if the URL does not parse; [`ConfigError::SslMode`] for an
/// `sslmode` libpq does not know.
pub fn pg_config(cfg: &DatabaseConfig, role: &str) -> Result<tokio_postgres::Config, ConfigError> {
    let (mut pg, _) = cfg.driver_url()?;
    pg.application_name(format!("durable-etl/{role}"))
        .connect_timeout(cfg.connect_timeout)
        .keepalives(true)
        .keepalives_idle(cfg.keepalive_idle)
        .keepalives_interval(KEEPALIVE_PROBE_INTERVAL)
        .keepalives_retries(KEEPALIVE_PROBES)
        // Keepalives probe only an idle socket; a statement whose bytes the server never
        // acknowledges (a half-open connection mid-query) would otherwise wait out the kernel's
        // retransmissions, about 15 minutes.
        .tcp_user_timeout(dead_peer_timeout(cfg))
        .options(options(cfg, role));
    Ok(pg)
}

/// Time between keepalive probes once they start, on both sides of every connection.
const KEEPALIVE_PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Unanswered keepalive probes after which either side drops the connection.
const KEEPALIVE_PROBES: u32 = 3;

/// How long this side waits on a silent peer before dropping the connection (`TCP_USER_TIMEOUT`):
/// as long as the keepalives take to give up on an idle one.
fn dead_peer_timeout(cfg: &DatabaseConfig) -> Duration {
    cfg.keepalive_idle
        .saturating_add(KEEPALIVE_PROBE_INTERVAL.saturating_mul(KEEPALIVE_PROBES))
}

/// The session settings sent in the startup packet of a session for `role`.
fn options(cfg: &DatabaseConfig, role: &str) -> String {
    // Server-side keepalives too: without them the server keeps a vanished client's backend
    // (and its locks, such as a replica's owner lock) for the kernel default, about two hours.
    let mut options = format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={} \
         -c tcp_keepalives_idle={} -c tcp_keepalives_interval={} -c tcp_keepalives_count={}",
        cfg.statement_timeout.as_millis(),
        cfg.lock_timeout.as_millis(),
        cfg.idle_in_transaction_timeout.as_millis(),
        cfg.keepalive_idle.as_secs().max(1),
        KEEPALIVE_PROBE_INTERVAL.as_secs(),
        KEEPALIVE_PROBES,
    );
    // No planner switches here: they would reach every statement of the session, a library
    // user's effects included (with sorts off, a group commit's lock step walked the whole
    // primary key). The claim pins its own plan (`worker::claimer`).
    if !cfg.client_check_interval.is_zero() {
        options.push_str(&format!(
            " -c client_connection_check_interval={}",
            cfg.client_check_interval.as_millis()
        ));
    }
    // A cell's schema alone: a statement finds its own cell's objects or fails, never another's.
    // On the Citus node that holds the cell, its node views come first (`citus`); elsewhere
    // that schema does not exist. A migration works on the cell's tables themselves. Cell names
    // need no quoting (`config::cell_name_ok`).
    if let Some(cell) = &cfg.cell {
        if role == "migrate" {
            options.push_str(&format!(" -c search_path={cell}"));
        } else {
            // On Citus, no statement of the cell's processes goes through Citus's distributed
            // execution: on a node that no longer holds the cell (after a move) every statement
            // on its tables fails rather than reaching them on another node. Plain PostgreSQL
            // keeps the setting as a placeholder.
            let views = citus::node_schema(cell);
            options.push_str(&format!(
                " -c search_path={views},{cell} -c citus.use_secondary_nodes=always"
            ));
        }
    }
    options
}

/// Opens the pool for `role` and proves the database answers by taking one connection.
///
/// # Errors
/// [`Error::Config`] for a bad URL; [`Error::Unavailable`] when no connection can be opened.
pub async fn connect_pool(cfg: &DatabaseConfig, role: &str) -> Result<Pool, Error> {
    build_pool(pg_config(cfg, role)?, cfg, cfg.pool_max_size).await
}

/// Finds the name of the protocol-level statement prepared from the text `$1` on a session (the
/// driver does not tell it), to `EXPLAIN` its plan.
///
/// Locks: none (reads the session's own `pg_prepared_statements`).
pub(crate) const PREPARED_NAME_SQL: &str =
    "SELECT name FROM pg_prepared_statements WHERE statement = $1 AND NOT from_sql LIMIT 1";

/// A pool of at most `size` connections made with `pg`, proven by taking one.
async fn build_pool(
    pg: tokio_postgres::Config,
    cfg: &DatabaseConfig,
    size: u32,
) -> Result<Pool, Error> {
    build_pool_of(Manager::new(Connector::new(cfg, pg)?), cfg, size).await
}

/// A pool of at most `size` sessions that `manager` opens, proven by taking one.
///
/// # Errors
/// [`Error::Unavailable`] (or the database's error) when no session can be opened.
pub async fn build_pool_of<M>(
    manager: M,
    cfg: &DatabaseConfig,
    size: u32,
) -> Result<bb8::Pool<M>, Error>
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
    M::Connection: Session,
{
    let pool = bb8::Pool::builder()
        .max_size(size)
        // A checkout waits for a new session as long as trying every host may take.
        .connection_timeout(connect::all_hosts_bound(cfg))
        // No validation query on checkout (it would cost a round trip on every claim and
        // commit); `checkout` skips connections already known closed instead.
        .test_on_check_out(false)
        .build(manager)
        .await?;
    // The first session is opened here rather than by the pool, whose own attempts keep
    // their errors to themselves and end as a bare timeout: a refused password, role or
    // database would read "database unavailable" after retrying for nothing.
    let first = pool
        .dedicated_connection()
        .await
        .map_err(|e| connect_error(cfg, e))?;
    // A new pool has room for it; were it refused, the pool opens its own.
    let _ = pool.add(first);
    Ok(pool)
}

/// The error of a failed attempt to connect with `cfg`: [`Error::Refused`], naming the target,
/// when retrying cannot fix it; else as any database error.
pub fn connect_error(cfg: &DatabaseConfig, e: tokio_postgres::Error) -> Error {
    match cfg.driver_url() {
        Ok((pg, _)) => refused_or(&pg, e),
        Err(_) => Error::from(e),
    }
}

/// Where connections made with `cfg` go: address, database and role, never the password.
///
/// # Errors
/// [`ConfigError::DatabaseUrl`] if the URL does not parse.
pub fn target(cfg: &DatabaseConfig) -> Result<Target, ConfigError> {
    Ok(Target::of(&cfg.driver_url()?.0))
}

/// The error of a failed attempt to connect with `pg`, as [`connect_error`]. A named prepared
/// statement missing or already there (a claim or commit session preparing its statements
/// behind a transaction-mode pooler the configuration did not declare) is
/// [`ConfigError::TransactionPooler`].
fn refused_or(pg: &tokio_postgres::Config, e: tokio_postgres::Error) -> Error {
    if e.code().is_some_and(is_prepared_statement_miss) {
        return ConfigError::TransactionPooler.into();
    }
    if crate::error::is_refusal(&e) {
        Error::Refused {
            target: Target::of(pg),
            source: e,
        }
    } else {
        Error::from(e)
    }
}

/// A pooled connection that is not known to be closed. Connections whose backend ended while
/// idle (terminated, server restarted) are skipped (the pool discards them when they return);
/// one whose loss is not yet noticed fails its first statement, which callers treat as any lost
/// connection.
///
/// # Errors
/// [`Error::Unavailable`] when the pool cannot hand out a live connection in time.
pub async fn checkout<M>(pool: &bb8::Pool<M>) -> Result<bb8::PooledConnection<'_, M>, Error>
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
    M::Connection: Session,
{
    first_live(pool, || pool.get()).await
}

/// [`checkout`], owned: the connection does not borrow the pool, so it can outlive the caller
/// (the API settles a connection whose request was cut in a task of its own).
///
/// # Errors
/// As [`checkout`].
pub async fn checkout_owned<M>(
    pool: &bb8::Pool<M>,
) -> Result<bb8::PooledConnection<'static, M>, Error>
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
    M::Connection: Session,
{
    first_live(pool, || pool.get_owned()).await
}

/// Opens sessions of `pool` until it holds at least `n` (at most its size), each proven by
/// its manager's `connect`, and leaves them idle in the pool: a role that needs several
/// sessions at once from its first moment (the commit lanes) then finds them open, instead of
/// paying a connection's start-up inside its first batch.
///
/// # Errors
/// The database's error when a session cannot be opened (the pool keeps those it opened).
pub async fn open_sessions<M>(pool: &bb8::Pool<M>, n: u32) -> Result<(), tokio_postgres::Error>
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
{
    for _ in pool.state().connections..n {
        let session = pool.dedicated_connection().await?;
        // A pool that filled meanwhile (a checkout opened one) drops the extra session.
        let _ = pool.add(session);
    }
    Ok(())
}

/// The first connection `get` hands out that is not known to be closed, trying once per
/// connection of `pool` (then whatever `get` gives).
async fn first_live<'a, M, F, Fut>(
    pool: &bb8::Pool<M>,
    mut get: F,
) -> Result<bb8::PooledConnection<'a, M>, Error>
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
    M::Connection: Session,
    F: FnMut() -> Fut,
    Fut: std::future::Future<
        Output = Result<bb8::PooledConnection<'a, M>, bb8::RunError<tokio_postgres::Error>>,
    >,
{
    for _ in 0..=pool.state().connections {
        let conn = prodding(pool, get()).await.map_err(pool_error)?;
        if !conn.is_closed() {
            return Ok(conn);
        }
    }
    prodding(pool, get()).await.map_err(pool_error)
}

/// How long a checkout waits before it asks the pool for a connection again meanwhile.
const PROD_EVERY: Duration = Duration::from_millis(250);

/// Waits for `get` (a checkout of `pool`), asking the pool for a connection every
/// [`PROD_EVERY`] meanwhile: `bb8` starts opening a connection only when a checkout begins, and
/// gives up on it after its own checkout time, so a checkout that began while every opening
/// under way was about to give up would otherwise wait out its time with none under way (after
/// an outage, up to the whole checkout time after the server is back). The ask ends at once; a
/// connection it takes goes straight back.
async fn prodding<'a, M, Fut>(pool: &bb8::Pool<M>, get: Fut) -> Fut::Output
where
    M: bb8::ManageConnection<Error = tokio_postgres::Error>,
    Fut: std::future::Future<
        Output = Result<bb8::PooledConnection<'a, M>, bb8::RunError<tokio_postgres::Error>>,
    >,
{
    tokio::pin!(get);
    loop {
        tokio::select! {
            got = &mut get => return got,
            () = tokio::time::sleep(PROD_EVERY) => {
                // Polled once, which is when `bb8` starts an opening if it has room for one.
                let _ = tokio::time::timeout(Duration::ZERO, pool.get()).await;
            }
        }
    }
}

/// A pooled session whose loss may already be known without a round trip.
pub trait Session {
    /// Whether its connection is known to be closed.
    fn is_closed(&self) -> bool;
}

impl Session for Client {
    fn is_closed(&self) -> bool {
        Client::is_closed(self)
    }
}

/// Runs `statement` (a future of one or a few statements on one connection) within `limit`, so a
/// half-open connection can never hang its caller: the server bounds a statement it is running
/// (`statement_timeout`), but only the client can bound one whose connection died silently.
///
/// # Errors
/// The statement's own error; [`Error::Unavailable`] when `limit` passed first (the connection is
/// presumed lost; its socket's own timeouts close it).
pub async fn bounded<T, E>(
    limit: Duration,
    statement: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Error>
where
    Error: From<E>,
{
    match tokio::time::timeout(limit, statement).await {
        Ok(done) => done.map_err(Error::from),
        Err(_) => Err(Error::Unavailable(None)),
    }
}

/// Asks the server to cancel what the session of `token` runs, over TLS when the session's
/// `sslmode` asks for it ([`tls::MakeRustls::unverified`]).
///
/// # Errors
/// The driver's, when the cancel request could not be sent.
pub async fn cancel(token: &tokio_postgres::CancelToken) -> Result<(), tokio_postgres::Error> {
    token.cancel_query(tls::MakeRustls::unverified()).await
}

/// Maps a pool checkout failure to [`Error`].
pub fn pool_error(e: bb8::RunError<tokio_postgres::Error>) -> Error {
    match e {
        bb8::RunError::User(e) => Error::from(e),
        bb8::RunError::TimedOut => Error::Unavailable(None),
    }
}

/// Opens one dedicated session outside the pool, driven by a spawned task.
///
/// # Errors
/// [`Error::Config`] for a bad URL; [`Error::Unavailable`] when the connection fails.
pub async fn connect(cfg: &DatabaseConfig, role: &str) -> Result<Client, Error> {
    open(&Connector::for_role(cfg, role)?).await
}

/// Opens one session with `connector`, driven by a spawned task.
///
/// # Errors
/// [`Error::Refused`] when retrying cannot help; else as any database error.
async fn open(connector: &Connector) -> Result<Client, Error> {
    connector
        .client()
        .await
        .map_err(|e| refused_or(connector.config(), e))
}

/// The session settings every session needs, as the server applies them (milliseconds). Read
/// from `pg_settings`, which shows the session's effective values. Locks: none.
pub const SESSION_SETTINGS_SQL: &str = "
SELECT name, setting::int8 FROM pg_settings
 WHERE name IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')";

/// Checks that the server applies the session limits `cfg` asks for. The crate sends them as
/// start-up `options`; a pooler may refuse those (PgBouncer: "unsupported startup parameter") or
/// drop them (`ignore_startup_parameters = options`), and then only settings made on the role or
/// the database (`ALTER ROLE … SET statement_timeout = …`) apply. A limit that is off (0) or
/// longer than configured is refused: without it a frozen process could hold row locks forever.
///
/// # Errors
/// [`ConfigError::SessionSetting`] naming the first limit that does not hold; database errors.
pub async fn check_session_settings(
    client: &impl tokio_postgres::GenericClient,
    cfg: &DatabaseConfig,
) -> Result<(), Error> {
    let rows = client.query_typed(SESSION_SETTINGS_SQL, &[]).await?;
    for (name, wanted) in [
        ("statement_timeout", cfg.statement_timeout),
        ("lock_timeout", cfg.lock_timeout),
        (
            "idle_in_transaction_session_timeout",
            cfg.idle_in_transaction_timeout,
        ),
    ] {
        let effective = rows
            .iter()
            .find(|row| row.get::<_, &str>(0) == name)
            .map(|row| row.get::<_, i64>(1));
        let wanted = i64::try_from(wanted.as_millis()).unwrap_or(i64::MAX);
        if !effective.is_some_and(|ms| ms > 0 && ms <= wanted) {
            return Err(ConfigError::SessionSetting(name).into());
        }
    }
    check_cell(client, cfg).await.map(drop)
}

/// Checks that a cell's session finds the cell's objects: the first schema of its `search_path`
/// that exists is the cell's, or its node views' on the Citus node that holds it
/// ([`citus::node_schema`]). On that node, readies the node views first ([`citus::ready`]).
/// Nothing to check outside a cell. Returns the cell when it lives on this Citus node (its
/// processes then watch where it is: it may move), `None` otherwise.
///
/// # Errors
/// [`ConfigError::CellSchema`] when the session does not find the cell;
/// [`ConfigError::CellNode`] when the cell's tables live on another Citus node (connect there:
/// [`citus::find_node`]); database errors.
pub async fn check_cell(
    client: &impl tokio_postgres::GenericClient,
    cfg: &DatabaseConfig,
) -> Result<Option<String>, Error> {
    let Some(cell) = &cfg.cell else {
        return Ok(None);
    };
    let (wanted, on_citus) = match citus::locate(client, cell).await? {
        citus::Placement::Plain => (cell.clone(), None),
        citus::Placement::Here => {
            citus::ready(client, cell).await?;
            (citus::node_schema(cell), Some(cell.clone()))
        }
        citus::Placement::Elsewhere { .. } => return Err(ConfigError::CellNode.into()),
    };
    if current_schema_is(client, &wanted).await? {
        Ok(on_citus)
    } else {
        Err(ConfigError::CellSchema.into())
    }
}

/// Whether the session's current schema (the first schema of its `search_path` that exists) is
/// `schema`.
///
/// # Errors
/// Database errors.
pub async fn current_schema_is(
    client: &impl tokio_postgres::GenericClient,
    schema: &str,
) -> Result<bool, Error> {
    let current: Option<String> = client
        .query_typed_one("SELECT current_schema()::text", &[])
        .await?
        .get(0);
    Ok(current.as_deref() == Some(schema))
}

/// Creates the configured database if it does not exist, connecting to the `postgres` maintenance
/// database of the same server. Returns whether it created it.
///
/// # Errors
/// [`Error::Config`] for a bad URL; [`Error::Unavailable`] or [`Error::Database`] from the server.
pub async fn ensure_database(cfg: &DatabaseConfig) -> Result<bool, Error> {
    let target = pg_config(cfg, "migrate")?;
    let name = target.get_dbname().unwrap_or("postgres").to_owned();
    let mut maintenance = target.clone();
    maintenance.dbname("postgres");
    let client = open(&Connector::new(cfg, maintenance)?).await?;
    let exists = client
        .query_typed_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[(&name, tokio_postgres::types::Type::TEXT)],
        )
        .await?
        .is_some();
    if exists {
        return Ok(false);
    }
    let create = format!("CREATE DATABASE {}", quote_ident(&name));
    match client.batch_execute(&create).await {
        Ok(()) => Ok(true),
        // Another process created it between our look-up and our CREATE.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// A session on the `postgres` maintenance database of `base`'s server.
async fn maintenance(base: &DatabaseConfig) -> Result<tokio_postgres::Client, Error> {
    let mut maintenance = pg_config(base, "admin")?;
    maintenance.dbname("postgres");
    open(&Connector::new(base, maintenance)?).await
}

/// Creates database `name` for `tool` on the server of `base`, marked as the tool's, and opens
/// the tool's first session in it (application name `durable-etl/<role>`). A database of that
/// name that the tool created before and that no session uses is dropped first.
///
/// # Errors
/// [`Error::DatabaseTaken`] when a database of that name exists that `tool` did not create, or
/// that a session uses (another run of the tool, say): nothing is dropped. [`Error::Config`] for
/// a bad URL; [`Error::Unavailable`] when no server answers; [`Error::Database`] from the server.
pub async fn recreate_database(
    base: &DatabaseConfig,
    name: &str,
    tool: &'static str,
    role: &str,
) -> Result<CreatedDatabase, Error> {
    owned::recreate_on(maintenance(base).await?, base, name, tool, role).await
}

/// Drops database `name` on the server of `base` (disconnecting its sessions) if it is still
/// the one of identity `oid` that [`recreate_database`] created; returns whether it dropped it.
///
/// # Errors
/// As [`recreate_database`].
pub async fn drop_created(base: &DatabaseConfig, name: &str, oid: u32) -> Result<bool, Error> {
    owned::drop_created_on(maintenance(base).await?, name, oid).await
}

pub mod citus;
mod connect;
mod dbname;
mod owned;
mod start_up;
pub mod tls;
pub use connect::{all_hosts_bound, Connector, Manager, Opened, Pacer, RETRY_PACE};
pub use dbname::{quote_ident, with_dbname, with_node};
pub use owned::{marker, CreatedDatabase};
pub use start_up::StartUp;

/// Whether `sqlstate` says a named prepared statement was missing (26000, "prepared statement …
/// does not exist") or already there (42P05) on the server connection: what a transaction-mode
/// pooler does to named statements, each transaction landing on another server connection.
pub(crate) fn is_prepared_statement_miss(sqlstate: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    *sqlstate == SqlState::INVALID_SQL_STATEMENT_NAME || *sqlstate == SqlState::DUPLICATE_PSTATEMENT
}

#[cfg(test)]
mod tests;
