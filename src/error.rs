//! The crate's error type and its mapping to stable codes and process exit codes, with the
//! schema's refusals ([`SchemaError`]). The component errors it carries live below it
//! ([`ConfigError`] in `config`, [`Rejection`] in `intake`), so no module it imports imports it
//! back.
//!
//! Invariants this module keeps:
//! - `Display` of every variant is a fixed sentence: it never interpolates a database error, SQL
//!   text, a payload or a principal. The source error is kept for programmatic inspection only
//!   ([`Error::db_code`]) and is never formatted at a boundary.
//! - Every variant maps to one [`Code`] and one exit code.

use crate::codes::Code;
use crate::config::ConfigError;
use crate::intake::Rejection;
use tokio_postgres::error::SqlState;

/// Exit code of a successful run.
pub const EXIT_OK: u8 = 0;
/// Exit code of a failure that has no more specific code.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code of a usage or configuration error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the database cannot be reached.
pub const EXIT_DATABASE_UNREACHABLE: u8 = 3;
/// Exit code when the database schema is not one this release supports.
pub const EXIT_SCHEMA_INCOMPATIBLE: u8 = 4;
/// Exit code when a local resource that is not the database failed ([`Error::Io`]).
pub const EXIT_IO: u8 = 5;
/// Exit code of a broken internal invariant ([`Error::Internal`]): a bug to report.
pub const EXIT_INTERNAL: u8 = 6;

/// Why a database's schema cannot be used or changed by this release.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The database is older than this release needs (`found` 0: never migrated).
    #[error("database schema is at version {found} but this release needs {required}: run `durable-etl migrate`")]
    TooOld {
        /// The newest version applied to the database.
        found: i32,
        /// The version this release needs.
        required: i32,
    },
    /// A newer release migrated the database to a schema this release cannot run against.
    #[error("database schema version {found} needs a release that knows version {needs} or later; this release knows {supported}")]
    TooNew {
        /// The newest version applied to the database.
        found: i32,
        /// The oldest schema version a release must know to run against it.
        needs: i32,
        /// The newest version this release knows.
        supported: i32,
    },
    /// A version this release must reverse is not one it knows.
    #[error(
        "database schema version {version} is unknown to this release and cannot be reversed by it"
    )]
    UnknownVersion {
        /// The unknown version.
        version: i32,
    },
    /// An applied migration differs from this release's migration of the same version.
    #[error(
        "applied migration {version} differs from the one in this release (checksum mismatch)"
    )]
    ChecksumMismatch {
        /// The version whose checksum differs.
        version: i32,
    },
    /// The SQL of a migration failed; its transaction was rolled back.
    #[error("migration {version} failed and was rolled back")]
    Failed {
        /// The version that failed.
        version: i32,
        /// The database error (never displayed).
        #[source]
        source: tokio_postgres::Error,
    },
}

impl SchemaError {
    /// The stable code of this error.
    pub fn code(&self) -> Code {
        match self {
            SchemaError::TooOld { .. } => Code::SchemaTooOld,
            SchemaError::TooNew { .. } | SchemaError::UnknownVersion { .. } => Code::SchemaTooNew,
            SchemaError::ChecksumMismatch { .. } => Code::MigrationChecksumMismatch,
            SchemaError::Failed { .. } => Code::MigrationFailed,
        }
    }
}

/// Everything that can go wrong in durable-etl, by kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// No connection to the database could be opened, or an open one was lost.
    #[error("database unavailable")]
    Unavailable(#[source] Option<tokio_postgres::Error>),
    /// The database failed a statement.
    #[error("database error")]
    Database(#[source] tokio_postgres::Error),
    /// The database schema is not one this release can run against.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// Another live process runs with this replica's owner id.
    #[error("another live process holds this owner id")]
    OwnerIdInUse,
    /// The replica's cell moved to another Citus node while it ran (its claim met the node
    /// fence, `db::citus`): it stopped and released what it held; start it again on the cell's
    /// new node (`work` does so itself).
    #[error("the cell moved to another node")]
    CellMoved,
    /// The owner is moving to another cell (`directory::moving`), or has moved: nothing was
    /// written. Find the owner's cell again (`directory::place`) and retry; during a move, the
    /// owner's cell refuses its enqueues until the move ends.
    #[error("the owner is moving, or has moved, to another cell; find its cell again and retry")]
    OwnerMoved,
    /// A request was refused at intake.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The job changed state under every attempt to act on it (a pathological race with its
    /// claims); nothing was written, and trying again is safe.
    #[error("the job kept changing state; retry")]
    Contended,
    /// A local resource that is not the database failed or did not answer in time: a socket, a
    /// child process, an HTTP endpoint of this process or of its children. The source, when
    /// there is one, is kept for programmatic inspection only.
    #[error("local I/O failed")]
    Io(#[source] Option<Box<dyn std::error::Error + Send + Sync>>),
    /// An invariant this crate keeps did not hold: a bug, never a condition of the environment.
    #[error("internal error")]
    Internal,
    /// The connection was refused for a reason that retrying cannot fix: SQLSTATE class 28 (a
    /// wrong password, a missing role, no `pg_hba.conf` entry, a server that requires TLS, a
    /// pooler that does not know the user), 3D000 (no such database), a pooler's permanent
    /// refusal under 08P01 (an unknown database or role), or a failure of the
    /// connection's own set-up (a server that does not speak the TLS the URL's `sslmode`
    /// requires, or a TLS handshake that refused the server's certificate).
    #[error(
        "the database server at {target} refused the connection: {}",
        refusal_reason(.source)
    )]
    Refused {
        /// Where the connection went.
        target: Target,
        /// The server's error (never displayed: only its SQLSTATE).
        #[source]
        source: tokio_postgres::Error,
    },
    /// Start-up opened no connection before its deadline.
    #[error("database unavailable at {target}: {}", unreachable_cause(.source.as_ref()))]
    Unreachable {
        /// Where the connections went.
        target: Target,
        /// The last attempt's error, if it ended with one (never displayed: only its kind).
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// `api-keys revoke` named no live key.
    #[error("no live API key has the id {0}")]
    NoLiveKey(uuid::Uuid),
    /// A one-shot command (`bench`) stopped at a shutdown signal before it finished.
    #[error("interrupted by a shutdown signal before it finished")]
    Interrupted,
    /// A tool (`demo`, `bench`) found the name of its database taken: by a database it did not
    /// create, or by one of its own that a session uses (another run, say). Nothing was dropped.
    #[error(
        "the database \"{name}\" {}, so durable-etl {tool} leaves it alone: pick another name with --{tool}-database NAME",
        taken_reason(*.reason)
    )]
    DatabaseTaken {
        /// The database's name.
        name: String,
        /// The tool (`demo`, `bench`).
        tool: &'static str,
        /// Why the tool may not drop and recreate it.
        reason: Taken,
    },
    /// A statement on a sqlx connection failed (the `sqlx` feature): a lost connection counts as
    /// [`Error::Unavailable`] does, a database error by its SQLSTATE as [`Error::Database`]
    /// does ([`Error::code`]).
    #[cfg(feature = "sqlx")]
    #[error("database error")]
    Sqlx(#[from] sqlx::Error),
    /// A listening socket could not be opened.
    #[error("cannot listen on {address}: {}", listen_cause(.source))]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        /// Why (never displayed: only its kind).
        #[source]
        source: std::io::Error,
    },
}

/// Why a tool may not drop and recreate the database of the name it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The database exists and the tool did not create it (it has no marker of the tool's).
    NotCreated,
    /// The tool created it, and a session is connected to it.
    InUse,
}

/// What a [`Taken`] means, as a fixed phrase.
fn taken_reason(reason: Taken) -> &'static str {
    match reason {
        Taken::NotCreated => {
            "exists without this tool's mark (a database it did not create, or one an older release left)"
        }
        Taken::InUse => "is in use (by another run of this tool, or a session of yours)",
    }
}

/// Where a process connects, as an error names it: the URL's first host and port, the database
/// and the role, never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` (a Unix socket's directory in place of the host).
    pub address: String,
    /// The database.
    pub database: String,
    /// The role.
    pub user: String,
}

impl Target {
    /// The target of connections made with `config`.
    pub fn of(config: &tokio_postgres::Config) -> Target {
        use tokio_postgres::config::Host;
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(Host::Unix(dir)) => dir.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or("(none)").to_owned();
        // PostgreSQL's default database is the role's name.
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        Target {
            address: format!("{host}:{port}"),
            database,
            user,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Target {
            address,
            database,
            user,
        } = self;
        write!(f, "{address} (database \"{database}\", role \"{user}\")")
    }
}

/// Whether a failed connection attempt is one that retrying cannot fix (see [`Error::Refused`]):
/// an authorization refusal or a missing database, or any failure that is neither a lost
/// connection nor transient.
pub fn is_refusal(e: &tokio_postgres::Error) -> bool {
    let refused = e.code().is_some_and(|code| {
        code.code().starts_with("28") || *code == SqlState::INVALID_CATALOG_NAME
    });
    refused || pooler_refusal(e).is_some() || !is_transient(e)
}

/// What a pooler (PgBouncer up to 1.18) says, under SQLSTATE 08P01, when it refuses a login that
/// retrying cannot let in, and what that means. Its other 08P01 refusals (no server reachable,
/// too many clients, a server login that keeps failing) may pass, and are retried.
const POOLER_REFUSALS: [(&str, &str); 5] = [
    (
        "unsupported startup parameter",
        "a pooler rejects the startup parameter `options`, which carries the session limits \
         (set `ignore_startup_parameters = options` in PgBouncer: the limits are then checked \
         at start)",
    ),
    ("no such database", "a pooler does not know the database"),
    ("no such user", "a pooler does not know the role"),
    (
        "authentication failed",
        "a pooler refused the role's authentication (a role it does not know or a wrong password)",
    ),
    (
        "SSL required",
        "a pooler requires TLS: set sslmode=require (or verify-ca, verify-full) in the URL",
    ),
];

/// What a pooler's refusal of `e` means, if `e` is one retrying cannot fix (see
/// [`POOLER_REFUSALS`]). The server's text is matched here only, never shown.
fn pooler_refusal(e: &tokio_postgres::Error) -> Option<&'static str> {
    let db = e.as_db_error()?;
    if *db.code() != SqlState::PROTOCOL_VIOLATION {
        return None;
    }
    POOLER_REFUSALS
        .iter()
        .find(|(said, _)| db.message().contains(said))
        .map(|(_, meaning)| *meaning)
}

/// What a refusal means, by its SQLSTATE (shown) or its kind: a fixed sentence, never the
/// server's text.
fn refusal_reason(e: &tokio_postgres::Error) -> String {
    if let Some(meaning) = pooler_refusal(e) {
        return format!("{meaning} (SQLSTATE 08P01)");
    }
    let reason = match e.code() {
        Some(&SqlState::INVALID_PASSWORD) => {
            "password authentication failed (check the password of DATABASE_URL or PGPASSWORD)"
        }
        Some(&SqlState::INVALID_CATALOG_NAME) => {
            "the database does not exist (`durable-etl migrate --create-database` creates it)"
        }
        Some(code) if code.code().starts_with("28") => {
            "the role may not connect (a missing role, no pg_hba.conf entry for it, a server \
             that requires TLS, or a pooler that does not know it)"
        }
        Some(_) => "the server refused it",
        None => {
            return tls_refusal(e)
                .unwrap_or("the connection could not be set up")
                .to_owned()
        }
    };
    match e.code() {
        Some(code) => format!("{reason} (SQLSTATE {})", code.code()),
        None => reason.to_owned(),
    }
}

/// What a refusal of TLS means, if `e` is one: the server's certificate refused by this side
/// ([`crate::db::tls::TlsRefused`]), or a server that does not speak TLS although the URL's
/// `sslmode` requires it (the driver's text, matched here only, never shown).
fn tls_refusal(e: &tokio_postgres::Error) -> Option<&'static str> {
    let source = std::error::Error::source(e)?;
    if source.is::<crate::db::tls::TlsRefused>() {
        return Some(
            "the TLS handshake was refused: the server's certificate is not signed by a trusted \
             root (sslrootcert, else the system's) or does not name the host (verify-full)",
        );
    }
    (source.to_string() == "server does not support TLS").then_some(
        "the server does not speak TLS, which the URL's sslmode requires \
         (require, verify-ca or verify-full)",
    )
}

/// Why the last connection attempt failed, by its kind: a fixed phrase, never the error's text.
fn unreachable_cause(e: Option<&tokio_postgres::Error>) -> String {
    let Some(e) = e else {
        return "no answer within the start-up timeout".to_owned();
    };
    if let Some(code) = e.code() {
        return format!(
            "the server kept answering SQLSTATE {} until the start-up timeout",
            code.code()
        );
    }
    format!("{} (until the start-up timeout)", attempt_cause(Some(e)))
}

/// What one failed attempt to reach the database met, by its kind: a fixed phrase, never the
/// error's text (a server's error is named by its SQLSTATE, beside it). `None`: the attempt
/// got no answer within its bound.
pub fn attempt_cause(e: Option<&tokio_postgres::Error>) -> &'static str {
    let Some(e) = e else {
        return "no answer in time";
    };
    if e.code().is_some() {
        return "the server answered with an error";
    }
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    match io.map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => {
            "connection refused: is the server running and listening there?"
        }
        Some(std::io::ErrorKind::TimedOut) => "the connection timed out",
        Some(_) => "the connection failed",
        None if e.is_closed() => "the server closed the connection",
        None => "the connection failed",
    }
}

/// Why a listening socket could not be opened, by its kind: a fixed phrase.
fn listen_cause(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "the address is in use",
        std::io::ErrorKind::AddrNotAvailable => "the address is not one of this host's",
        std::io::ErrorKind::PermissionDenied => "permission denied",
        _ => "the socket could not be opened",
    }
}

impl Error {
    /// The stable code of this error.
    pub fn code(&self) -> Code {
        match self {
            Error::Config(_) => Code::ConfigInvalid,
            Error::Unavailable(_) => Code::DatabaseUnavailable,
            Error::Database(e) if is_transient(e) => Code::TransientDatabase,
            Error::Database(e) if e.code().is_some_and(|c| c.code() == CELL_MOVED) => {
                Code::CellMoved
            }
            Error::Database(_) => Code::DatabaseError,
            Error::Schema(e) => e.code(),
            Error::OwnerIdInUse => Code::OwnerIdInUse,
            Error::CellMoved => Code::CellMoved,
            Error::OwnerMoved => Code::OwnerMoved,
            Error::Rejected(r) => r.code,
            Error::Contended => Code::TransientDatabase,
            Error::Io(_) | Error::Listen { .. } => Code::IoError,
            Error::Internal => Code::InternalError,
            Error::Refused { .. } => Code::DatabaseRefused,
            Error::NoLiveKey(_) => Code::NotFound,
            Error::Interrupted => Code::Cancelled,
            Error::Unreachable { .. } => Code::DatabaseUnavailable,
            Error::DatabaseTaken { .. } => Code::DatabaseTaken,
            #[cfg(feature = "sqlx")]
            Error::Sqlx(e) => sqlx_code(e),
        }
    }

    /// An [`Error::Io`] keeping `source`.
    pub fn io(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Io(Some(source.into()))
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_)
            | Error::Rejected(_)
            | Error::Refused { .. }
            | Error::DatabaseTaken { .. } => EXIT_USAGE,
            Error::Unavailable(_) | Error::Unreachable { .. } => EXIT_DATABASE_UNREACHABLE,
            Error::Schema(e) if e.code() != Code::MigrationFailed => EXIT_SCHEMA_INCOMPATIBLE,
            Error::Io(_) | Error::Listen { .. } => EXIT_IO,
            Error::Internal => EXIT_INTERNAL,
            _ => EXIT_FAILURE,
        }
    }

    /// The SQLSTATE of the underlying database error, if there is one.
    pub fn db_code(&self) -> Option<&SqlState> {
        match self {
            Error::Unavailable(Some(e))
            | Error::Database(e)
            | Error::Refused { source: e, .. }
            | Error::Unreachable {
                source: Some(e), ..
            } => e.code(),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    /// A closed connection or a failure to connect is `Unavailable`; anything else is `Database`.
    fn from(e: tokio_postgres::Error) -> Self {
        if is_connection_loss(&e) {
            Error::Unavailable(Some(e))
        } else if e.code().is_some_and(|c| c.code() == OWNER_MOVED) {
            Error::OwnerMoved
        } else {
            Error::Database(e)
        }
    }
}

/// The SQLSTATE a write through a Citus cell's node views fails with once the cell's shards have
/// moved to another node (`db::citus`; class 55, object not in prerequisite state, an
/// implementation-defined subclass).
pub const CELL_MOVED: &str = "55M01";

/// The SQLSTATE a cell's intake refuses a job of an owner it holds no longer with (migration
/// 0042; class 55, object not in prerequisite state, an implementation-defined subclass).
pub const OWNER_MOVED: &str = "55M02";

/// Whether an error means the session is gone or was never opened: a closed connection, an I/O
/// failure, or a connection-class SQLSTATE.
pub fn is_connection_loss(e: &tokio_postgres::Error) -> bool {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    e.is_closed() || io || e.code().is_some_and(is_connection_class)
}

/// Whether a SQLSTATE is of class 08 (connection exception) or an administrator shutdown.
fn is_connection_class(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
}

/// Whether a database error is worth retrying: serialization failure, deadlock, lock not available,
/// query cancelled (statement or lock timeout), too many connections, or a lost connection.
pub fn is_transient(e: &tokio_postgres::Error) -> bool {
    is_connection_loss(e) || e.code().is_some_and(is_transient_state)
}

/// Whether a SQLSTATE says trying again may pass: serialization failure, deadlock, lock not
/// available, query cancelled (statement or lock timeout), too many connections, or a session
/// ended idle in its transaction.
fn is_transient_state(code: &SqlState) -> bool {
    [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
        SqlState::TOO_MANY_CONNECTIONS,
        SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
    ]
    .contains(code)
}

/// The stable code of a sqlx error, by the rules of a tokio-postgres one: a lost or unopened
/// connection is `database_unavailable`, a database error `transient_database` or
/// `database_error` by its SQLSTATE.
#[cfg(feature = "sqlx")]
fn sqlx_code(e: &sqlx::Error) -> Code {
    match e {
        sqlx::Error::Database(db) => match db.code().map(|c| SqlState::from_code(&c)) {
            Some(code) if is_connection_class(&code) => Code::DatabaseUnavailable,
            Some(code) if is_transient_state(&code) => Code::TransientDatabase,
            Some(code) if code.code() == OWNER_MOVED => Code::OwnerMoved,
            _ => Code::DatabaseError,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Code::DatabaseUnavailable,
        _ => Code::DatabaseError,
    }
}

#[cfg(test)]
mod tests;
