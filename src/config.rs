//! Typed configuration, one struct per component, with documented defaults and `validate()`.
//!
//! Invariants this module keeps:
//! - Every default is a named constant, and every field's doc ends with "Defaults to …".
//! - `validate()` refuses a configuration that could break a guarantee (a heartbeat too slow to keep
//!   a lease alive, a poll too slow to be a backstop) and names the broken relation in its error.
//! - Nothing here reads a file: values come from CLI flags and environment variables (see `cli`).

use crate::queue::served::{ServedQueue, DEFAULT_QUEUE};
pub use pooler::Pooler;

mod error;
mod owner;
mod pooler;
pub use error::ConfigError;
pub use owner::generated_owner_id;
use owner::valid_owner_id;
use std::net::SocketAddr;
use std::time::Duration;

/// The database the binary uses when `DATABASE_URL` is not set: the local server, database `durable_etl`.
pub const DATABASE_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/durable_etl";
/// Default largest number of pooled connections per process.
pub const POOL_MAX_SIZE_DEFAULT: u32 = 8;
/// Largest pool `validate()` accepts: more connections than PostgreSQL's usual
/// `max_connections` many times over, per process, is a typing mistake.
pub const POOL_MAX_SIZE_MAX: u32 = 1_000;
/// Default time allowed to open one database connection.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Shortest connect timeout `validate()` accepts: a shorter one cannot open a connection even
/// to a local server.
pub const CONNECT_TIMEOUT_MIN: Duration = Duration::from_millis(10);
/// Shortest session timeout `validate()` accepts (statement, lock, idle in transaction, and a
/// client check interval that is not zero): PostgreSQL counts them in whole milliseconds, and a
/// shorter one would be sent as 0, which turns the limit off.
pub const SERVER_TIMEOUT_MIN: Duration = Duration::from_millis(1);
/// Default `statement_timeout` of every session.
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default `lock_timeout` of every session.
pub const LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default `idle_in_transaction_session_timeout` of every session.
pub const IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default interval at which a backend running a query checks that its client is still there.
pub const CLIENT_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Default idle time before the first TCP keepalive probe.
pub const KEEPALIVE_IDLE_DEFAULT: Duration = Duration::from_secs(10);

/// Default interval of the backstop poll.
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Shortest backstop poll interval `validate()` accepts.
pub const POLL_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// Longest backstop poll interval `validate()` accepts.
pub const POLL_INTERVAL_MAX: Duration = Duration::from_secs(300);
/// Default least time between two claims that wakes cause: none, every wake claims at once.
pub const CLAIM_COOLDOWN_DEFAULT: Duration = Duration::ZERO;
/// Default number of jobs one replica runs at once.
pub const SLOTS_DEFAULT: usize = 8;
/// Largest number of slots `validate()` accepts.
pub const SLOTS_MAX: usize = 1024;
/// Default of the most jobs a replica claims ahead of its free slots.
pub const PREFETCH_DEFAULT: usize = 128;
/// Largest prefetch `validate()` accepts.
pub const PREFETCH_MAX: usize = 1024;
/// Default lease granted by a claim and by each heartbeat.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(15);
/// Shortest lease `validate()` accepts: a shorter one does not outlast the round trips of a
/// claim, a heartbeat and a commit with any margin, and every job would end
/// `lease_expired_exhausted`.
pub const LEASE_MIN: Duration = Duration::from_secs(1);
/// Default (and longest derived) interval between heartbeats; see [`derived_heartbeat_interval`].
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(4);
/// Shortest heartbeat interval `validate()` accepts: each heartbeat is a statement per replica.
/// The heartbeat derived from any lease of at least [`LEASE_MIN`] is longer.
pub const HEARTBEAT_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// Default execution timeout of one attempt.
pub const EXECUTION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Shortest execution timeout `validate()` accepts: a shorter one times every attempt out.
pub const EXECUTION_TIMEOUT_MIN: Duration = Duration::from_millis(10);
/// Default time running jobs get to finish after a shutdown signal.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// Default first retry delay of a transient failure.
pub const RETRY_MIN_DELAY_DEFAULT: Duration = Duration::from_millis(500);
/// Default longest retry delay of a transient failure.
pub const RETRY_MAX_DELAY_DEFAULT: Duration = Duration::from_secs(60);
/// Longest duration any setting accepts (365 days): longer values are typing mistakes, and
/// arithmetic on them (deadlines, `3 × heartbeat`) could overflow.
pub const DURATION_MAX: Duration = Duration::from_secs(365 * 24 * 3600);
/// Longest session timeout PostgreSQL accepts (`INT_MAX` milliseconds, about 24.8 days).
pub const SERVER_TIMEOUT_MAX: Duration = Duration::from_millis(i32::MAX as u64);

/// The heartbeat interval of a replica whose heartbeat interval is not set: the default ratio of
/// the default lease (4 s per 15 s, so a lease spans 3.75 heartbeats), at most
/// [`HEARTBEAT_INTERVAL_DEFAULT`]. `--lease 3s` alone thus heartbeats every 800 ms.
pub fn derived_heartbeat_interval(lease: Duration) -> Duration {
    HEARTBEAT_INTERVAL_DEFAULT.min(lease.mul_f64(4.0 / 15.0))
}

/// The `idle_in_transaction_session_timeout` of a replica whose timeout is not set: the lease, at
/// most [`IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT`]. A frozen replica's session, idle inside a
/// transaction that holds its jobs' row locks, is then ended by the server no later than its
/// leases expire, so recovery does not wait for the locks beyond the lease.
pub fn derived_idle_in_transaction_timeout(lease: Duration) -> Duration {
    IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT.min(lease)
}

/// Refuses `value` (the setting `name`) if it is zero or shorter than `min` (named `limit` in
/// the error).
fn at_least(
    name: &'static str,
    value: Duration,
    min: Duration,
    limit: &'static str,
) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::ZeroDuration(name));
    }
    if value < min {
        return Err(ConfigError::DurationTooShort(name, limit));
    }
    Ok(())
}

/// Refuses `value` (the setting `name`) if it is longer than `max` (named `limit` in the error).
fn at_most(
    name: &'static str,
    value: Duration,
    max: Duration,
    limit: &'static str,
) -> Result<(), ConfigError> {
    if value > max {
        return Err(ConfigError::DurationTooLong(name, limit));
    }
    Ok(())
}

/// Default listen address of the HTTP API.
pub const API_LISTEN_DEFAULT: &str = "127.0.0.1:8080";

/// How every process connects to PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseConfig {
    /// The PostgreSQL connection string. Defaults to [`DATABASE_URL_DEFAULT`].
    pub url: String,
    /// Largest number of pooled connections, 1 to [`POOL_MAX_SIZE_MAX`]. Defaults to
    /// [`POOL_MAX_SIZE_DEFAULT`].
    pub pool_max_size: u32,
    /// Time allowed to open a connection, at least [`CONNECT_TIMEOUT_MIN`]. Defaults to
    /// [`CONNECT_TIMEOUT_DEFAULT`].
    pub connect_timeout: Duration,
    /// Session `statement_timeout`, [`SERVER_TIMEOUT_MIN`] to [`SERVER_TIMEOUT_MAX`]. Defaults
    /// to [`STATEMENT_TIMEOUT_DEFAULT`].
    pub statement_timeout: Duration,
    /// Session `lock_timeout`, [`SERVER_TIMEOUT_MIN`] to [`SERVER_TIMEOUT_MAX`]. Defaults to
    /// [`LOCK_TIMEOUT_DEFAULT`].
    pub lock_timeout: Duration,
    /// Session `idle_in_transaction_session_timeout`, so a frozen process cannot hold a row lock
    /// forever; [`SERVER_TIMEOUT_MIN`] to [`SERVER_TIMEOUT_MAX`]. Defaults to
    /// [`IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT`].
    pub idle_in_transaction_timeout: Duration,
    /// Idle time before TCP keepalive probes start. Defaults to [`KEEPALIVE_IDLE_DEFAULT`].
    pub keepalive_idle: Duration,
    /// Session `client_connection_check_interval` (PostgreSQL 14+): a backend still running a
    /// query for a process that died (say, waiting for a row lock) notices within this interval,
    /// rolls back and frees the job's row. Zero leaves the server's setting (required on 13);
    /// any other is [`SERVER_TIMEOUT_MIN`] to [`SERVER_TIMEOUT_MAX`]. Defaults to
    /// [`CLIENT_CHECK_INTERVAL_DEFAULT`].
    pub client_check_interval: Duration,
    /// The pooler on [`DatabaseConfig::url`], if any: behind a transaction-mode one no statement
    /// is prepared by name and no session state is kept ([`Pooler`]). Defaults to
    /// [`Pooler::None`].
    pub pooler: Pooler,
    /// The PEM file of root certificates that TLS connections trust when the URL names none
    /// (`sslrootcert`, which wins); see [`tls::TlsRequest`]. Defaults to none: the system's.
    pub ssl_root_cert: Option<std::path::PathBuf>,
    /// The cell this process runs in: the schema its tables live in, alone in it with its own
    /// wake channel and lock keys, so that several cells may share one database (see
    /// [`cell_name_ok`]). Sessions put it first on their `search_path`. Defaults to none: the
    /// session's own `search_path` (one deployment per database, as before cells).
    pub cell: Option<String>,
}

/// Longest cell name: the wake channel `durable_etl_jobs.<cell>` must fit PostgreSQL's 63
/// bytes.
pub const CELL_NAME_MAX: usize = 40;

/// Whether `name` can name a cell's schema: 1 to [`CELL_NAME_MAX`] characters of `a-z 0-9 _`,
/// starting with a letter, and not `pg_…` (reserved by PostgreSQL).
pub fn cell_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && name.len() <= CELL_NAME_MAX
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: DATABASE_URL_DEFAULT.to_owned(),
            pool_max_size: POOL_MAX_SIZE_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            statement_timeout: STATEMENT_TIMEOUT_DEFAULT,
            lock_timeout: LOCK_TIMEOUT_DEFAULT,
            idle_in_transaction_timeout: IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
            keepalive_idle: KEEPALIVE_IDLE_DEFAULT,
            client_check_interval: CLIENT_CHECK_INTERVAL_DEFAULT,
            pooler: Pooler::None,
            ssl_root_cert: None,
            cell: None,
        }
    }
}

impl DatabaseConfig {
    /// The defaults, connecting to `url` (a `postgres://` URL).
    pub fn new(url: impl Into<String>) -> DatabaseConfig {
        DatabaseConfig {
            url: url.into(),
            ..DatabaseConfig::default()
        }
    }

    /// The URL's driver settings, parsed by tokio-postgres, and what it asks of TLS (its
    /// `sslrootcert`, else [`DatabaseConfig::ssl_root_cert`]); see [`tls::split_url`].
    ///
    /// # Errors
    /// [`ConfigError::DatabaseUrl`] if the URL does not parse; [`ConfigError::SslMode`] for an
    /// `sslmode` libpq does not know.
    pub fn driver_url(&self) -> Result<(tokio_postgres::Config, tls::TlsRequest), ConfigError> {
        let (url, mut request) = tls::split_url(&self.url)?;
        let pg = url.parse().map_err(|_| ConfigError::DatabaseUrl)?;
        if request.root_cert.is_none() {
            request.root_cert.clone_from(&self.ssl_root_cert);
        }
        Ok((pg, request))
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// The first broken rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.driver_url()?;
        if self.cell.as_deref().is_some_and(|cell| !cell_name_ok(cell)) {
            return Err(ConfigError::CellName);
        }
        if !(1..=POOL_MAX_SIZE_MAX).contains(&self.pool_max_size) {
            return Err(ConfigError::PoolSize);
        }
        for (name, value, min, limit) in [
            (
                "connect timeout",
                self.connect_timeout,
                CONNECT_TIMEOUT_MIN,
                "10ms",
            ),
            ("keepalive idle", self.keepalive_idle, Duration::ZERO, "0"),
        ] {
            at_least(name, value, min, limit)?;
            at_most(name, value, DURATION_MAX, "365 days")?;
        }
        // A zero client check interval leaves the server's (PostgreSQL 13 has none).
        for (name, value, may_be_zero) in [
            ("statement timeout", self.statement_timeout, false),
            ("lock timeout", self.lock_timeout, false),
            (
                "idle in transaction timeout",
                self.idle_in_transaction_timeout,
                false,
            ),
            ("client check interval", self.client_check_interval, true),
        ] {
            if !(may_be_zero && value.is_zero()) {
                at_least(name, value, SERVER_TIMEOUT_MIN, "1ms")?;
            }
            at_most(name, value, SERVER_TIMEOUT_MAX, "2147483647ms")?;
        }
        Ok(())
    }
}

/// How one worker replica claims, leases and runs jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The replica's stable `lease_owner_id` (a pod or host name). Defaults to the host name
    /// followed by a random suffix, generated once per process (see [`generated_owner_id`]).
    pub owner_id: String,
    /// Jobs this replica runs at once. Defaults to [`SLOTS_DEFAULT`].
    pub slots: usize,
    /// The most jobs this replica claims ahead of its free slots, into a local buffer from which
    /// freed slots start at once (so claims stay batches of about half of `slots + prefetch`
    /// whatever the slot count, and commit batches may hold up to `slots + prefetch` jobs). It
    /// claims ahead only what it starts in half a second at its recent start rate: none after an
    /// idle spell (so replicas share a burst), few for long jobs. The buffered jobs are leased,
    /// renewed by heartbeats and released at shutdown like running ones, and released after a
    /// second's wait for a slot. 0 claims only for free slots. Defaults to [`PREFETCH_DEFAULT`].
    pub prefetch: usize,
    /// Interval of the backstop poll. Defaults to [`POLL_INTERVAL_DEFAULT`].
    pub poll_interval: Duration,
    /// The least time between two claims that wakes cause (a notification, the poll, a due
    /// job, a registration as waiting): a wake sooner after the last claim waits out the rest,
    /// and every wake meanwhile joins it, so jobs arriving alone are claimed, run and committed
    /// together. It trades pickup latency (up to this much more) for database CPU per job at a
    /// steady load. Claims under a backlog (slots freed, permits freed) never wait. At most the
    /// poll interval. Defaults to [`CLAIM_COOLDOWN_DEFAULT`].
    pub claim_cooldown: Duration,
    /// Lease granted by a claim and renewed by each heartbeat, at least [`LEASE_MIN`]. Defaults
    /// to [`LEASE_DEFAULT`].
    pub lease: Duration,
    /// Interval between heartbeats; at least [`HEARTBEAT_INTERVAL_MIN`] and under a third of
    /// the lease. Defaults to
    /// [`HEARTBEAT_INTERVAL_DEFAULT`], which is [`derived_heartbeat_interval`] of the default lease
    /// (the command line derives it from `--lease` when only the lease is set).
    pub heartbeat_interval: Duration,
    /// Time budget of an attempt's compute phase, and separately of its effects, counted from
    /// when they start applying; at least [`EXECUTION_TIMEOUT_MIN`]. Defaults to
    /// [`EXECUTION_TIMEOUT_DEFAULT`].
    pub execution_timeout: Duration,
    /// Time running jobs get to finish after a shutdown signal. Defaults to
    /// [`SHUTDOWN_GRACE_DEFAULT`].
    pub shutdown_grace: Duration,
    /// First retry delay after a transient failure. Defaults to [`RETRY_MIN_DELAY_DEFAULT`].
    pub retry_min_delay: Duration,
    /// Longest retry delay. Defaults to [`RETRY_MAX_DELAY_DEFAULT`].
    pub retry_max_delay: Duration,
    /// Where the worker serves `/metrics`, if anywhere. Defaults to none.
    pub metrics_listen: Option<SocketAddr>,
    /// Poll-only mode, for deployments behind a transaction-mode pooler: no LISTEN; the poll alone
    /// finds work. Without [`WorkerConfig::session_database_url`] there is then no direct session
    /// for the owner lock either, and a dead replica's jobs are recovered by lease expiry only.
    /// Defaults to false.
    pub poll_only: bool,
    /// A direct (not pooled) connection string for the replica's long-lived session (LISTEN and
    /// owner lock). Defaults to none: the session uses the main database URL, unless `poll_only`.
    pub session_database_url: Option<String>,
    /// The queues this replica claims from, each with its weight: it claims only jobs of these
    /// queues (and of the kinds it has registered). Defaults to [`DEFAULT_QUEUE`] alone.
    pub queues: Vec<ServedQueue>,
}

impl WorkerConfig {
    /// Whether a replica with this configuration on `db` holds alive locks on its own
    /// connections (`worker::alive`): all but one in poll-only mode or behind a
    /// transaction-mode pooler, where a session-level lock would stick to a server connection
    /// other clients share.
    pub fn alive_locked(&self, db: &DatabaseConfig) -> bool {
        !self.poll_only && db.pooler.keeps_sessions()
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            owner_id: generated_owner_id(),
            slots: SLOTS_DEFAULT,
            prefetch: PREFETCH_DEFAULT,
            poll_interval: POLL_INTERVAL_DEFAULT,
            claim_cooldown: CLAIM_COOLDOWN_DEFAULT,
            lease: LEASE_DEFAULT,
            heartbeat_interval: HEARTBEAT_INTERVAL_DEFAULT,
            execution_timeout: EXECUTION_TIMEOUT_DEFAULT,
            shutdown_grace: SHUTDOWN_GRACE_DEFAULT,
            retry_min_delay: RETRY_MIN_DELAY_DEFAULT,
            retry_max_delay: RETRY_MAX_DELAY_DEFAULT,
            metrics_listen: None,
            poll_only: false,
            session_database_url: None,
            queues: vec![ServedQueue::new(DEFAULT_QUEUE)],
        }
    }
}

impl WorkerConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// The first broken rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !valid_owner_id(&self.owner_id) {
            return Err(ConfigError::OwnerId);
        }
        if !(1..=SLOTS_MAX).contains(&self.slots) {
            return Err(ConfigError::Slots);
        }
        crate::queue::served::validate(&self.queues).map_err(ConfigError::Queues)?;
        if self.prefetch > PREFETCH_MAX {
            return Err(ConfigError::Prefetch);
        }
        if !(POLL_INTERVAL_MIN..=POLL_INTERVAL_MAX).contains(&self.poll_interval) {
            return Err(ConfigError::PollInterval);
        }
        if self.claim_cooldown > self.poll_interval {
            return Err(ConfigError::ClaimCooldown);
        }
        for (name, value, min, limit) in [
            ("lease", self.lease, LEASE_MIN, "1s"),
            (
                "heartbeat interval",
                self.heartbeat_interval,
                HEARTBEAT_INTERVAL_MIN,
                "100ms",
            ),
            (
                "execution timeout",
                self.execution_timeout,
                EXECUTION_TIMEOUT_MIN,
                "10ms",
            ),
            ("retry min delay", self.retry_min_delay, Duration::ZERO, "0"),
        ] {
            at_least(name, value, min, limit)?;
        }
        for (name, value) in [
            ("lease", self.lease),
            ("heartbeat interval", self.heartbeat_interval),
            ("execution timeout", self.execution_timeout),
            ("shutdown grace", self.shutdown_grace),
            ("retry min delay", self.retry_min_delay),
            ("retry max delay", self.retry_max_delay),
        ] {
            at_most(name, value, DURATION_MAX, "365 days")?;
        }
        if self.heartbeat_interval * 3 >= self.lease {
            return Err(ConfigError::HeartbeatVsLease);
        }
        if self.retry_min_delay > self.retry_max_delay {
            return Err(ConfigError::RetryDelays);
        }
        if let Some(url) = &self.session_database_url {
            DatabaseConfig::new(url.clone()).driver_url()?;
        }
        Ok(())
    }
}

/// Default time one HTTP request may take.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default number of HTTP requests served at once (more wait their turn).
pub const MAX_CONCURRENCY_DEFAULT: usize = 256;
/// Largest number of HTTP requests served at once that `validate()` accepts.
pub const MAX_CONCURRENCY_MAX: usize = 65_536;

/// How the HTTP API serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// The address the API listens on. Defaults to [`API_LISTEN_DEFAULT`].
    pub listen: SocketAddr,
    /// Time one request may take before it is answered `503 request_timeout`. Defaults to
    /// [`REQUEST_TIMEOUT_DEFAULT`].
    pub request_timeout: Duration,
    /// Requests served at once, 1 to [`MAX_CONCURRENCY_MAX`]. Defaults to
    /// [`MAX_CONCURRENCY_DEFAULT`].
    pub max_concurrency: usize,
    /// Request size limits (1 to [`crate::intake::MAX_RECORDS_MAX`] records, 1 to
    /// [`crate::intake::MAX_BYTES_MAX`] bytes). Default to 10,000 records and 1 MiB.
    pub limits: crate::intake::IntakeLimits,
    /// The id of the key retained payloads are sealed under and opened with, derived from the
    /// secret ([`crate::dead_letters::PayloadKey`]): a new id rotates the key, and payloads
    /// sealed under the old one no longer open. Defaults to [`PAYLOAD_KEY_ID_DEFAULT`].
    pub payload_key_id: String,
    /// Keep each ETL job's request, sealed, this long after the job fails (at most
    /// [`RETAIN_TTL_MAX`]), so that its dead letter replays without the
    /// body. `None`, the default: nothing is kept, and a letter replays only with the request
    /// sent again.
    pub retain_payloads: Option<Duration>,
}

/// The longest a retained payload is kept after its job failed: a year (what the schema
/// admits).
pub const RETAIN_TTL_MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// The payload key id a deployment uses unless it names another.
pub const PAYLOAD_KEY_ID_DEFAULT: &str = "1";

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            max_concurrency: MAX_CONCURRENCY_DEFAULT,
            limits: crate::intake::IntakeLimits::default(),
            payload_key_id: PAYLOAD_KEY_ID_DEFAULT.to_owned(),
            retain_payloads: None,
        }
    }
}

impl ApiConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// The first broken rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.request_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration("request timeout"));
        }
        if !crate::names::is_key_id(&self.payload_key_id) {
            return Err(ConfigError::PayloadKey);
        }
        if let Some(keep) = self.retain_payloads {
            if keep.is_zero() {
                return Err(ConfigError::ZeroDuration("payload retention"));
            }
            at_most("payload retention", keep, RETAIN_TTL_MAX, "365 days")?;
        }
        at_most(
            "request timeout",
            self.request_timeout,
            DURATION_MAX,
            "365 days",
        )?;
        use crate::intake::{MAX_BYTES_MAX, MAX_RECORDS_MAX};
        if !(1..=MAX_CONCURRENCY_MAX).contains(&self.max_concurrency)
            || !(1..=MAX_RECORDS_MAX).contains(&self.limits.max_records)
            || !(1..=MAX_BYTES_MAX).contains(&self.limits.max_bytes)
        {
            return Err(ConfigError::ApiLimits);
        }
        Ok(())
    }
}

pub mod tls;

#[cfg(test)]
mod tests;
