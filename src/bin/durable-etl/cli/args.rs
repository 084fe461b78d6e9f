//! The flags and environment variables of every command, as clap parses them, and how they
//! turn into the library's configurations (durations, derived worker timings, secrets).
//!
//! Invariants: see the parent module (`cli`), whose contract these types spell out.

use clap::{Args, Parser, Subcommand};
use durable_etl::config::{DatabaseConfig, WorkerConfig, DATABASE_URL_DEFAULT};
use durable_etl::digest::Secret;
use durable_etl::error::Error;
use durable_etl::telemetry::LogFormat;
use durable_etl::{config, db};
use std::net::SocketAddr;
use std::time::Duration;

/// durable-etl: durable jobs run out of PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "durable-etl", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Database options shared by every command.
    #[command(flatten)]
    pub(crate) database: DatabaseArgs,
    /// Log line format.
    #[arg(
        long,
        env = "DURABLE_ETL_LOG_FORMAT",
        value_enum,
        default_value = "human",
        global = true,
        help_heading = "Logging (every command)"
    )]
    pub(crate) log_format: LogFormat,
    /// The command to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Database options shared by every command, listed after each command's own under their
/// heading.
#[derive(Debug, Args)]
#[command(next_help_heading = "Database connection (every command)")]
pub(crate) struct DatabaseArgs {
    /// PostgreSQL connection string.
    #[arg(long, env = "DATABASE_URL", default_value = DATABASE_URL_DEFAULT, global = true, hide_env_values = true)]
    pub(crate) database_url: String,
    /// Largest number of pooled connections (1 to 1000).
    #[arg(long, env = "DURABLE_ETL_POOL_SIZE", default_value_t = config::POOL_MAX_SIZE_DEFAULT, global = true)]
    pub(crate) pool_size: u32,
    /// Time allowed to open a database connection (at least 10ms).
    #[arg(long, env = "DURABLE_ETL_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration, global = true)]
    pub(crate) connect_timeout: Duration,
    /// Session statement_timeout (1ms to 2147483647ms).
    #[arg(long, env = "DURABLE_ETL_STATEMENT_TIMEOUT", default_value = "30s", value_parser = parse_duration, global = true)]
    pub(crate) statement_timeout: Duration,
    /// Session lock_timeout (1ms to 2147483647ms).
    #[arg(long, env = "DURABLE_ETL_LOCK_TIMEOUT", default_value = "5s", value_parser = parse_duration, global = true)]
    pub(crate) lock_timeout: Duration,
    /// Session idle_in_transaction_session_timeout (1ms to 2147483647ms). Defaults to 10s; for
    /// `work`, to the lease when --lease is shorter, so a frozen replica's row locks go no later
    /// than its leases.
    #[arg(long, env = "DURABLE_ETL_IDLE_IN_TRANSACTION_TIMEOUT", value_parser = parse_duration, global = true)]
    pub(crate) idle_in_transaction_timeout: Option<Duration>,
    /// Session client_connection_check_interval (PostgreSQL 14+; 1ms to 2147483647ms, or 0 to
    /// leave the server's, as 13 needs).
    #[arg(long, env = "DURABLE_ETL_CLIENT_CHECK_INTERVAL", default_value = "1s", value_parser = parse_duration, global = true)]
    pub(crate) client_check_interval: Duration,
    /// PEM file of the root certificates TLS connections to the database trust (sslmode
    /// verify-ca or verify-full; require verifies as verify-ca with one) when the URL names
    /// none (sslrootcert, which wins). Without either, the system's roots.
    #[arg(long, env = "DURABLE_ETL_DATABASE_SSL_ROOT_CERT", global = true)]
    pub(crate) database_ssl_root_cert: Option<std::path::PathBuf>,
    /// Time start-up may take (connecting, schema and session checks, owner lock, release of a
    /// previous incarnation's jobs); lost connections are retried with backoff within it, and the
    /// process exits 3 when it is spent. At most 365 days.
    #[arg(long, env = "DURABLE_ETL_STARTUP_TIMEOUT", default_value = "60s", value_parser = parse_duration, global = true)]
    pub(crate) startup_timeout: Duration,
    /// The pooler on --database-url: none, session or transaction (PgBouncer's pool_mode).
    /// Behind a transaction-mode pooler no statement is prepared by name and no session state is
    /// kept; give workers a direct --session-database-url for LISTEN and the owner lock.
    #[arg(
        long,
        env = "DURABLE_ETL_POOLER",
        value_enum,
        default_value = "none",
        global = true
    )]
    pub(crate) pooler: config::Pooler,
    /// The cell to run in: the schema (1 to 40 characters of a-z 0-9 _) that holds its tables,
    /// with its own wake channel and lock keys, so several cells share one database. `migrate`
    /// creates it. Without it, the session's search_path (one deployment per database).
    #[arg(long, env = "DURABLE_ETL_CELL", global = true)]
    pub(crate) cell: Option<String>,
    /// Find the server of the cell --cell names in the directory of cells at --database-url
    /// (`cells init` builds it), and run there with this URL's database, role and password.
    /// Without --cell, `serve` serves every cell (each request in its key owner's cell) and
    /// `api-keys` acts in the owner's cell.
    #[arg(long, env = "DURABLE_ETL_DIRECTORY", global = true)]
    pub(crate) directory: bool,
}

impl DatabaseArgs {
    /// The validated database configuration.
    ///
    /// # Errors
    /// [`Error::Config`] naming the broken rule.
    pub(crate) fn config(&self) -> Result<DatabaseConfig, Error> {
        self.config_for_lease(None)
    }

    /// The validated database configuration of a process that holds leases of `lease` (a worker
    /// replica): an unset idle-in-transaction timeout is derived from it
    /// ([`config::derived_idle_in_transaction_timeout`]).
    ///
    /// # Errors
    /// [`Error::Config`] naming the broken rule.
    pub(crate) fn config_for_lease(
        &self,
        lease: Option<Duration>,
    ) -> Result<DatabaseConfig, Error> {
        let idle_in_transaction_timeout = match (self.idle_in_transaction_timeout, lease) {
            (Some(set), _) => set,
            (None, Some(lease)) => config::derived_idle_in_transaction_timeout(lease),
            (None, None) => config::IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
        };
        let cfg = DatabaseConfig {
            url: self.database_url.clone(),
            pool_max_size: self.pool_size,
            connect_timeout: self.connect_timeout,
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
            idle_in_transaction_timeout,
            client_check_interval: self.client_check_interval,
            pooler: self.pooler,
            ssl_root_cert: self.database_ssl_root_cert.clone(),
            cell: self.cell.clone(),
            ..DatabaseConfig::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The start-up bounds, from now: the deadline of the whole start-up, and one attempt at most
    /// a connection plus a statement.
    ///
    /// # Errors
    /// [`Error::Config`] when the budget is zero or absurdly long.
    pub(crate) fn start_up(
        &self,
        shutdown: &durable_etl::shutdown::Shutdown,
    ) -> Result<db::StartUp, Error> {
        if self.startup_timeout.is_zero() {
            return Err(config::ConfigError::ZeroDuration("startup timeout").into());
        }
        if self.startup_timeout > config::DURATION_MAX {
            return Err(config::ConfigError::DurationTooLong("startup timeout", "365 days").into());
        }
        let target = db::target(&self.config()?)?;
        Ok(db::StartUp {
            deadline: tokio::time::Instant::now() + self.startup_timeout,
            attempt: db::all_hosts_bound(&self.config()?).saturating_add(self.statement_timeout),
            shutdown: shutdown.clone(),
            target,
        })
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the schema migrations this release embeds (or reverse them with --down-to).
    Migrate(MigrateArgs),
    /// Serve the HTTP API.
    Serve(ServeArgs),
    /// Run a worker replica: claim, execute and complete jobs.
    Work(WorkArgs),
    /// Create or revoke API keys.
    #[command(subcommand)]
    ApiKeys(ApiKeysCommand),
    /// Pause, resume or cap a queue: a paused queue's jobs are not claimed (running ones finish).
    #[command(subcommand)]
    Queues(super::queues::QueuesCommand),
    /// List, pause, resume or delete an owner's recurring schedules.
    Schedules(super::schedules::SchedulesArgs),
    /// The directory of cells at --database-url: which cells there are, on which servers, and
    /// which cell each owner's jobs live in.
    #[command(subcommand)]
    Cells(super::cells::CellsCommand),
    /// Run the whole product once on a local database: API, two replicas, sample jobs.
    Demo(DemoArgs),
    /// Measure throughput and latency of real replicas on a throw-away database.
    #[command(subcommand)]
    Bench(super::bench_args::BenchCommand),
}

/// Options of `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// The database the demo creates (fresh) on the server of DATABASE_URL. A database of that
    /// name is dropped and recreated only if an earlier demo created it and no session uses it;
    /// any other is left alone and the demo stops (exit 2, database_taken).
    #[arg(
        long,
        env = "DURABLE_ETL_DEMO_DATABASE",
        default_value = "durable_etl_demo"
    )]
    pub(crate) demo_database: String,
    /// Keep the API and the web console serving after the demo, until Ctrl-C or SIGTERM, and
    /// print the console's address and the demo's API key to sign in with.
    #[arg(long)]
    pub(crate) serve: bool,
    /// Secret key of the keyed digests (at least 16 bytes), so that `api-keys create` with the
    /// same secret makes keys the demo's server accepts. Random when unset (then printed with
    /// --serve).
    #[arg(long, env = "DURABLE_ETL_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
}

/// Options of `migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Reverse migrations until the schema is at this version (0 removes everything).
    #[arg(long, env = "DURABLE_ETL_DOWN_TO")]
    pub(crate) down_to: Option<i32>,
    /// Create the database of DATABASE_URL first if it does not exist (the role needs CREATEDB).
    /// Without it, a missing database is refused at once (exit 2, database_refused).
    #[arg(long, env = "DURABLE_ETL_CREATE_DATABASE")]
    pub(crate) create_database: bool,
}

/// Options of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "DURABLE_ETL_LISTEN", default_value = config::API_LISTEN_DEFAULT)]
    pub(crate) listen: SocketAddr,
    /// Time one request may take (at most 365 days).
    #[arg(long, env = "DURABLE_ETL_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub(crate) request_timeout: Duration,
    /// Requests served at once, more wait their turn (1 to 65536).
    #[arg(long, env = "DURABLE_ETL_MAX_CONCURRENCY", default_value_t = config::MAX_CONCURRENCY_DEFAULT)]
    pub(crate) max_concurrency: usize,
    /// Largest number of records in one request (1 to 1000000).
    #[arg(long, env = "DURABLE_ETL_MAX_RECORDS", default_value_t = durable_etl::intake::MAX_RECORDS_DEFAULT)]
    pub(crate) max_records: usize,
    /// Largest request body, in bytes (1 to 1073741824, 1 GiB).
    #[arg(long, env = "DURABLE_ETL_MAX_BYTES", default_value_t = durable_etl::intake::MAX_BYTES_DEFAULT)]
    pub(crate) max_bytes: usize,
    /// Secret key of the keyed digests (at least 16 bytes).
    #[arg(long, env = "DURABLE_ETL_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
    /// Id of the key retained payloads are sealed under, derived from the secret; a new id
    /// rotates the key (payloads sealed under the old one no longer open).
    #[arg(long, env = "DURABLE_ETL_PAYLOAD_KEY_ID", default_value = config::PAYLOAD_KEY_ID_DEFAULT)]
    pub(crate) payload_key_id: String,
    /// Keep each job's request, sealed, this long after the job fails (e.g. `7d`), so its dead
    /// letter replays without the body; unset, nothing is kept.
    #[arg(long, env = "DURABLE_ETL_RETAIN_PAYLOADS", value_parser = humantime::parse_duration)]
    pub(crate) retain_payloads: Option<Duration>,
}

impl ServeArgs {
    /// The validated API configuration and secret.
    ///
    /// # Errors
    /// [`Error::Config`] naming the broken rule.
    pub(crate) fn config(&self) -> Result<(config::ApiConfig, Secret), Error> {
        let api = config::ApiConfig {
            listen: self.listen,
            request_timeout: self.request_timeout,
            max_concurrency: self.max_concurrency,
            limits: durable_etl::intake::IntakeLimits {
                max_records: self.max_records,
                max_bytes: self.max_bytes,
            },
            payload_key_id: self.payload_key_id.clone(),
            retain_payloads: self.retain_payloads,
        };
        api.validate()?;
        let secret = self
            .secret
            .clone()
            .and_then(|s| Secret::new(s.into_bytes()))
            .ok_or(config::ConfigError::Secret)?;
        Ok((api, secret))
    }
}

/// Options of `work`.
#[derive(Debug, Args)]
pub(crate) struct WorkArgs {
    /// This replica's stable lease owner id (for example the pod name); generated when unset.
    #[arg(long, env = "DURABLE_ETL_OWNER_ID")]
    pub(crate) owner_id: Option<String>,
    /// Jobs this replica runs at once (1 to 1024).
    #[arg(long, env = "DURABLE_ETL_SLOTS", default_value_t = config::SLOTS_DEFAULT)]
    pub(crate) slots: usize,
    /// Jobs this replica may claim ahead of its free slots while a backlog lasts (0: none; at
    /// most 1024).
    #[arg(long, env = "DURABLE_ETL_PREFETCH", default_value_t = config::PREFETCH_DEFAULT)]
    pub(crate) prefetch: usize,
    /// Interval of the backstop poll (10ms to 300s).
    #[arg(long, env = "DURABLE_ETL_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub(crate) poll_interval: Duration,
    /// The least time between two claims that wakes cause (at most the poll interval): wakes
    /// sooner wait and are claimed together, trading pickup latency for database CPU per job.
    #[arg(long, env = "DURABLE_ETL_CLAIM_COOLDOWN", default_value = "0ms", value_parser = parse_duration)]
    pub(crate) claim_cooldown: Duration,
    /// Lease granted by a claim and renewed by each heartbeat (1s to 365 days).
    #[arg(long, env = "DURABLE_ETL_LEASE", default_value = "15s", value_parser = parse_duration)]
    pub(crate) lease: Duration,
    /// Interval between heartbeats (at least 100ms, and under a third of the lease). Defaults to
    /// 4s, or lease × 4/15 when --lease is under 15s (800ms for a 3s lease).
    #[arg(long, env = "DURABLE_ETL_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub(crate) heartbeat_interval: Option<Duration>,
    /// Execution timeout of one attempt (10ms to 365 days).
    #[arg(long, env = "DURABLE_ETL_EXECUTION_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub(crate) execution_timeout: Duration,
    /// Time running jobs get to finish after SIGTERM or SIGINT (0 to 365 days).
    #[arg(long, env = "DURABLE_ETL_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub(crate) shutdown_grace: Duration,
    /// First retry delay after a transient failure (more than 0, at most --retry-max-delay).
    #[arg(long, env = "DURABLE_ETL_RETRY_MIN_DELAY", default_value = "500ms", value_parser = parse_duration)]
    pub(crate) retry_min_delay: Duration,
    /// Longest retry delay (at most 365 days).
    #[arg(long, env = "DURABLE_ETL_RETRY_MAX_DELAY", default_value = "60s", value_parser = parse_duration)]
    pub(crate) retry_max_delay: Duration,
    /// Address to serve Prometheus metrics on.
    #[arg(long, env = "DURABLE_ETL_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Poll only: no LISTEN (behind a transaction-mode pooler). Without --session-database-url,
    /// dead replicas' jobs are then recovered by lease expiry only.
    #[arg(long, env = "DURABLE_ETL_POLL_ONLY")]
    pub(crate) poll_only: bool,
    /// Direct (not pooled) connection string for the LISTEN and owner-lock session.
    #[arg(long, env = "DURABLE_ETL_SESSION_DATABASE_URL", hide_env_values = true)]
    pub(crate) session_database_url: Option<String>,
    /// The queues to claim from, comma-separated, each `name` or `name:weight` (1 to 1000,
    /// default 1): when several have work, each claim shares the free slots among them by weight.
    #[arg(long, env = "DURABLE_ETL_QUEUES", default_value = durable_etl::queue::DEFAULT_QUEUE)]
    pub(crate) queues: String,
    /// A JSON file of schedules of ETL loads to declare at start-up, each an entry with `owner`,
    /// `name` and the fields of `PUT /v1/schedules/{name}` (docs/schedules.md); needs
    /// --secret. Declaring never deletes a schedule the file does not name.
    #[arg(long, env = "DURABLE_ETL_SCHEDULES")]
    pub(crate) schedules: Option<std::path::PathBuf>,
    /// The secret owners are digested under (as `serve`'s), for --schedules.
    #[arg(long, env = "DURABLE_ETL_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
    /// Serve several cells (comma-separated): a replica of each, with its own sessions, claims
    /// and commits, in this one process, all under --owner-id (each cell's locks are its own).
    /// With --directory, each cell's server is found there. Not with --cell, --schedules or
    /// --session-database-url.
    #[arg(long, env = "DURABLE_ETL_CELLS", value_delimiter = ',')]
    pub(crate) cells: Vec<String>,
    /// Bench only (hidden): record each handler start (job id, wall-clock time) in memory and
    /// write them to this file when the replica stops. Unset in production.
    #[arg(long, env = crate::bench::starts::STARTS_FILE_ENV, hide = true)]
    pub(crate) record_handler_starts: Option<std::path::PathBuf>,
}

impl WorkArgs {
    /// The cells `--cells` names (none: the replica serves `--cell`'s, or none), checked.
    ///
    /// # Errors
    /// [`ConfigError::Cells`] for a name no cell can have, a cell named twice, or `--cells` with
    /// `--cell` (`cell_given`), `--schedules` or `--session-database-url` (one URL cannot be each
    /// cell's session).
    pub(crate) fn cells(&self, cell_given: bool) -> Result<&[String], Error> {
        let names = &self.cells;
        let distinct = names
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == names.len();
        let alone = names.is_empty()
            || (!cell_given && self.schedules.is_none() && self.session_database_url.is_none());
        if !(distinct && alone && names.iter().all(|n| config::cell_name_ok(n))) {
            return Err(config::ConfigError::Cells.into());
        }
        Ok(names)
    }

    /// The schedules file's text and the secret its owners are digested under, if `--schedules`
    /// names one.
    ///
    /// # Errors
    /// [`ConfigError::SchedulesFile`] when the file cannot be read; [`ConfigError::Secret`]
    /// without a secret of at least 16 bytes.
    pub(crate) fn schedules_file(&self) -> Result<Option<(String, Secret)>, Error> {
        let Some(path) = &self.schedules else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|_| config::ConfigError::SchedulesFile("it cannot be read".to_owned()))?;
        let secret = self
            .secret
            .clone()
            .and_then(|s| Secret::new(s.into_bytes()))
            .ok_or(config::ConfigError::Secret)?;
        Ok(Some((text, secret)))
    }

    /// The validated worker configuration.
    ///
    /// # Errors
    /// [`Error::Config`] naming the broken rule.
    pub(crate) fn config(&self) -> Result<WorkerConfig, Error> {
        let cfg = WorkerConfig {
            owner_id: self
                .owner_id
                .clone()
                .unwrap_or_else(config::generated_owner_id),
            slots: self.slots,
            prefetch: self.prefetch,
            poll_interval: self.poll_interval,
            claim_cooldown: self.claim_cooldown,
            lease: self.lease,
            heartbeat_interval: self
                .heartbeat_interval
                .unwrap_or_else(|| config::derived_heartbeat_interval(self.lease)),
            execution_timeout: self.execution_timeout,
            shutdown_grace: self.shutdown_grace,
            retry_min_delay: self.retry_min_delay,
            retry_max_delay: self.retry_max_delay,
            metrics_listen: self.metrics_listen,
            poll_only: self.poll_only,
            session_database_url: self.session_database_url.clone(),
            queues: durable_etl::queue::parse(&self.queues).map_err(config::ConfigError::Queues)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The `api-keys` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ApiKeysCommand {
    /// Create an API key for an owner and print it once.
    Create(CreateKeyArgs),
    /// Revoke an API key by id.
    Revoke(RevokeKeyArgs),
}

/// Whose: an owner (principal) and the secret of the keyed digest it is known by (`cells
/// place`, `api-keys create`, `schedules`).
#[derive(Debug, Args)]
pub(crate) struct OwnerArgs {
    /// The owner (principal); stored and shown only as its keyed digest.
    #[arg(long, env = "DURABLE_ETL_OWNER")]
    pub(crate) owner: String,
    /// Secret key of the keyed digests (at least 16 bytes).
    #[arg(long, env = "DURABLE_ETL_SECRET", hide_env_values = true)]
    pub(crate) secret: String,
}

impl OwnerArgs {
    /// The secret of the keyed digests.
    ///
    /// # Errors
    /// [`config::ConfigError::Secret`] for one shorter than 16 bytes.
    pub(crate) fn secret(&self) -> Result<Secret, Error> {
        let secret = Secret::new(self.secret.clone().into_bytes());
        Ok(secret.ok_or(config::ConfigError::Secret)?)
    }

    /// The owner's jobs (its key, its schedules), under the secret.
    ///
    /// # Errors
    /// As [`OwnerArgs::secret`].
    pub(crate) fn jobs(&self) -> Result<durable_etl::Jobs, Error> {
        Ok(durable_etl::Jobs::new(self.secret()?, &self.owner))
    }
}

/// Options of `api-keys create`.
#[derive(Debug, Args)]
pub(crate) struct CreateKeyArgs {
    /// The owner the key acts for, and the secret.
    #[command(flatten)]
    pub(crate) whose: OwnerArgs,
    /// Make it an operator key: it also reads the console's fleet-wide operator view.
    #[arg(long)]
    pub(crate) operator: bool,
}

/// Options of `api-keys revoke`.
#[derive(Debug, Args)]
pub(crate) struct RevokeKeyArgs {
    /// The id printed by `api-keys create`.
    pub(crate) id: uuid::Uuid,
}

/// Parses a duration such as `500ms`, `2s` or `1m`.
///
/// # Errors
/// A fixed message when the text is not a duration.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|_| "expected a duration such as 500ms, 2s or 1m".to_owned())
}
