//! The one error of every configuration check: which setting is wrong and the bound it broke.
//!
//! Invariant this module keeps: a message names the setting and its bound, never a secret (a
//! password, the digest key) or a URL with its password.

use crate::queue::served::QueuesError;

/// A configuration that `validate()` refused. Each variant names the broken relation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The database URL could not be parsed as a PostgreSQL connection string.
    #[error("database url is not a valid PostgreSQL connection string")]
    DatabaseUrl,
    /// The database URL's `sslmode` is not one of libpq's that this release speaks.
    #[error("sslmode must be disable, prefer, require, verify-ca or verify-full")]
    SslMode,
    /// The TLS root certificates (`sslrootcert` or `--database-ssl-root-cert`, else the
    /// system's) could not be read, or hold no certificate.
    #[error("the TLS root certificates could not be read (sslrootcert)")]
    SslRootCert,
    /// The pool size is outside `1..=POOL_MAX_SIZE_MAX`.
    #[error("pool max size must be between 1 and 1000")]
    PoolSize,
    /// A timeout that must be positive is zero.
    #[error("{0} must be greater than zero")]
    ZeroDuration(&'static str),
    /// The server does not apply a session limit the configuration needs: it is off or longer
    /// than configured (behind a pooler that drops start-up options, set it on the role).
    #[error("the server's effective {0} is off or longer than configured; behind a pooler, set it on the role (ALTER ROLE ... SET {0} = ...)")]
    SessionSetting(&'static str),
    /// A duration is longer than its setting allows (the second field names the limit).
    #[error("{0} must be at most {1}")]
    DurationTooLong(&'static str, &'static str),
    /// A duration is shorter than its setting can work with (the second field names the limit).
    #[error("{0} must be at least {1}")]
    DurationTooShort(&'static str, &'static str),
    /// The claim cooldown is longer than the poll interval, which it would hold back.
    #[error("claim cooldown must not exceed the poll interval")]
    ClaimCooldown,
    /// The poll interval is outside `POLL_INTERVAL_MIN..=POLL_INTERVAL_MAX`.
    #[error("poll interval must be between 10ms and 300s")]
    PollInterval,
    /// The slot count is outside `1..=SLOTS_MAX`.
    #[error("slots must be between 1 and 1024")]
    Slots,
    /// The prefetch is above `PREFETCH_MAX`.
    #[error("prefetch must be at most 1024")]
    Prefetch,
    /// Three heartbeats must fit in one lease, so that one lost heartbeat does not lose the lease.
    #[error("heartbeat interval must be under a third of the lease")]
    HeartbeatVsLease,
    /// The retry delays are not ordered.
    #[error("retry min delay must not exceed retry max delay")]
    RetryDelays,
    /// The owner id is empty, too long, or has characters outside `[A-Za-z0-9._:-]`.
    #[error("owner id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
    OwnerId,
    /// `migrate --down-to` names a version this release does not know (the second field is its
    /// newest).
    #[error("--down-to {0} is not a schema version this release knows (0 to {1})")]
    DownTo(i32, i32),
    /// The listen address cannot be bound (in use, or not this host's).
    #[error("the listen address cannot be bound")]
    Listen,
    /// An API limit is outside its bounds: concurrency `1..=MAX_CONCURRENCY_MAX`, records
    /// `1..=intake::MAX_RECORDS_MAX`, bytes `1..=intake::MAX_BYTES_MAX`.
    #[error("max concurrency must be 1 to 65536, max records 1 to 1000000 and max bytes 1 to 1073741824 (1 GiB)")]
    ApiLimits,
    /// The digest secret is missing or shorter than 16 bytes.
    #[error("DURABLE_ETL_SECRET must be set to at least 16 bytes")]
    Secret,
    /// A job kind's name is not one the schema stores (`Job::KIND`, `Handler::kind`).
    #[error("a job kind's name must be 1 to 63 characters of a-z 0-9 _ . starting with a letter")]
    KindName,
    /// A job's priority is outside `queue::PRIORITY_RANGE`.
    #[error("a job's priority must be from 0 to 9")]
    Priority,
    /// A job's attempt bound is outside `enqueue::MAX_ATTEMPTS_RANGE`.
    #[error("a job's max attempts must be from 1 to 100")]
    MaxAttempts,
    /// A job's concurrency key is empty or longer than 255 bytes.
    #[error("a job's concurrency key must be 1 to 255 bytes")]
    ConcurrencyKey,
    /// The database URL leads to a pooler in transaction mode (one client's transactions run on
    /// several server connections) while the configuration says it keeps sessions.
    #[error(
        "the database URL leads to a pooler in transaction mode (a client's transactions run on \
         other server connections, where its prepared statements do not exist): start with \
         --pooler transaction (and --session-database-url, direct, for LISTEN and the owner lock)"
    )]
    TransactionPooler,
    /// The served queues are not a list a replica can claim from.
    #[error(transparent)]
    Queues(#[from] QueuesError),
    /// The schedules file of `work --schedules` is not a list of valid schedules; the text says
    /// which entry (by position, and by name if it is one) and what is wrong, never a value.
    #[error("the schedules file is not valid: {0}")]
    SchedulesFile(String),
    /// A payload key is needed (to retain or replay retained payloads) and none was given, or
    /// its id is not 1 to 64 ASCII letters, digits, `.`, `_` or `-`.
    #[error("the payload key id must be 1 to 64 ASCII letters, digits, '.', '_' or '-'")]
    PayloadKey,
    /// `work --cells` named a cell twice or a name no cell can have, or came with `--cell`,
    /// `--schedules` or `--session-database-url`.
    #[error("--cells takes distinct cell names (1 to 40 characters of a-z 0-9 _ starting with a letter, not pg_), and none of --cell, --schedules, --session-database-url")]
    Cells,
    /// The cell's schema name is not 1 to 40 characters of a-z 0-9 _ starting with a letter, or
    /// starts with `pg_`.
    #[error("a cell's schema name must be 1 to 40 characters of a-z 0-9 _ starting with a letter, and not start with pg_")]
    CellName,
    /// The session does not create and find objects in the configured cell's schema (behind a
    /// pooler that drops start-up options, set `search_path` on the role).
    #[error("the session's schema is not the configured cell's; behind a pooler, set it on the role (ALTER ROLE ... SET search_path = ...)")]
    CellSchema,
    /// The session is connected to a Citus node that does not hold the cell's tables (its
    /// processes must connect to the node that does).
    #[error("the cell's tables live on another Citus node: connect to that node (commands find it themselves from a postgres:// URL)")]
    CellNode,
    /// A cell's tables live on another server (a Citus node, or the server the directory names)
    /// and the connection string cannot be pointed at it: that is done to a `postgres://` URL
    /// whose hosts are not in its parameters.
    #[error("the cell's tables live on another server: give a postgres:// URL (hosts not in its parameters) so it can be pointed there, or that server's own URL")]
    NodeUrl,
    /// The database has no directory of cells (`durable-etl cells init` builds one).
    #[error("the database has no directory of cells: build it with `durable-etl cells init`")]
    NoDirectory,
    /// The directory lists no cell of the name given.
    #[error("the directory lists no cell of that name")]
    UnknownCell,
    /// A cell of the name given is listed in the directory already.
    #[error("the directory lists a cell of that name already")]
    CellListed,
    /// A cell's server was given with an empty host.
    #[error("a cell's server needs a host")]
    CellServer,
    /// An owner without a cell asked for one, and the directory has no cell open to new owners.
    #[error("the directory has no cell open to new owners: add one, or open one")]
    NoOpenCell,
    /// An owner the directory has not placed was asked to move.
    #[error("the owner has no cell yet: place it (cells place) or enqueue for it first")]
    OwnerNotPlaced,
    /// A move of the owner to another cell is under way.
    #[error("the owner is being moved to another cell: carry that move on first (cells move-owner --to that cell)")]
    MoveElsewhere,
    /// Another process is moving the owner right now.
    #[error("another process is moving this owner right now: let it finish, or stop it and run this again")]
    MoveRunning,
    /// The cells of a move cannot take part in one: one is on Citus, they are at different
    /// schema versions, or the role cannot see every session of the old cell's database.
    #[error(
        "owners move between cells on plain PostgreSQL servers migrated to the same version, by a role that sees every session (pg_read_all_stats)"
    )]
    MoveCells,
    /// `--directory` was given without `--cell` (the directory finds a cell's server), or the
    /// `cells` commands were given `--cell` or `--directory` (they act on the directory itself).
    #[error(
        "--directory finds the server of the cell --cell names (serve and api-keys route by owner without one, work --cells finds each cell's); the cells commands take neither"
    )]
    DirectoryCell,
    /// `bench --citus-worker` named a worker past the last of the coordinator's list.
    #[error("bench --citus-worker names a worker the coordinator does not list")]
    BenchCitusWorker,
    /// `bench --citus` was asked for a mode other than burn-down or offered load.
    #[error("bench --citus runs burn-down and offered-load only")]
    BenchCitusMode,
    /// `bench` was given a database name that is not its own (it drops what it creates).
    #[error("the bench database name must start with durable_etl_bench")]
    BenchDatabase,
}
