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
}

impl Error {
    /// The stable code of this error.
    pub fn code(&self) -> Code {
        match self {
            Error::Config(_) => Code::ConfigInvalid,
            Error::Unavailable(_) => Code::DatabaseUnavailable,
            Error::Database(e) if is_transient(e) => Code::TransientDatabase,
            Error::Database(_) => Code::DatabaseError,
            Error::Schema(e) => e.code(),
            Error::OwnerIdInUse => Code::OwnerIdInUse,
            Error::Rejected(r) => r.code,
            Error::Contended => Code::TransientDatabase,
            Error::Io(_) => Code::IoError,
            Error::Internal => Code::InternalError,
        }
    }

    /// An [`Error::Io`] keeping `source`.
    pub fn io(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Io(Some(source.into()))
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Rejected(_) => EXIT_USAGE,
            Error::Unavailable(_) => EXIT_DATABASE_UNREACHABLE,
            Error::Schema(e) if e.code() != Code::MigrationFailed => EXIT_SCHEMA_INCOMPATIBLE,
            Error::Io(_) => EXIT_IO,
            Error::Internal => EXIT_INTERNAL,
            _ => EXIT_FAILURE,
        }
    }

    /// The SQLSTATE of the underlying database error, if there is one.
    pub fn db_code(&self) -> Option<&SqlState> {
        match self {
            Error::Unavailable(Some(e)) | Error::Database(e) => e.code(),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    /// A closed connection or a failure to connect is `Unavailable`; anything else is `Database`.
    fn from(e: tokio_postgres::Error) -> Self {
        if is_connection_loss(&e) {
            Error::Unavailable(Some(e))
        } else {
            Error::Database(e)
        }
    }
}

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
    is_connection_loss(e)
        || e.code().is_some_and(|code| {
            [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::QUERY_CANCELED,
                SqlState::TOO_MANY_CONNECTIONS,
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            ]
            .contains(code)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_owner_errors_map_to_codes_and_exits() {
        let e = Error::from(ConfigError::Slots);
        assert_eq!(e.code(), Code::ConfigInvalid);
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert_eq!(e.db_code(), None);
        assert_eq!(Error::OwnerIdInUse.code(), Code::OwnerIdInUse);
        assert_eq!(Error::OwnerIdInUse.exit_code(), EXIT_FAILURE);
        let rejected = Error::from(Rejection::new(Code::DatasetInvalid, "/dataset"));
        assert_eq!(
            (rejected.code(), rejected.exit_code()),
            (Code::DatasetInvalid, EXIT_USAGE)
        );
        let unavailable = Error::Unavailable(None);
        assert_eq!(unavailable.code(), Code::DatabaseUnavailable);
        assert_eq!(unavailable.exit_code(), EXIT_DATABASE_UNREACHABLE);
        assert_eq!(unavailable.db_code(), None);
    }

    #[test]
    fn failures_beside_the_database_say_what_failed() {
        let io = Error::io(std::io::Error::other("no such file"));
        assert_eq!((io.code(), io.exit_code()), (Code::IoError, EXIT_IO));
        assert!(std::error::Error::source(&io).is_some());
        assert_eq!(
            io.to_string(),
            "local I/O failed",
            "no source text in Display"
        );
        let silent = Error::Io(None);
        assert_eq!(
            (silent.code(), silent.exit_code()),
            (Code::IoError, EXIT_IO)
        );
        assert_eq!(
            (Error::Internal.code(), Error::Internal.exit_code()),
            (Code::InternalError, EXIT_INTERNAL)
        );
        let contended = Error::Contended;
        assert_eq!(
            (contended.code(), contended.exit_code()),
            (Code::TransientDatabase, EXIT_FAILURE)
        );
        for e in [io, Error::Internal, Error::Contended] {
            assert_eq!(e.db_code(), None);
            assert_ne!(e.code(), Code::DatabaseUnavailable);
        }
        let exits = [
            EXIT_OK,
            EXIT_FAILURE,
            EXIT_USAGE,
            EXIT_DATABASE_UNREACHABLE,
            EXIT_SCHEMA_INCOMPATIBLE,
            EXIT_IO,
            EXIT_INTERNAL,
        ];
        let distinct: std::collections::HashSet<_> = exits.iter().collect();
        assert_eq!(distinct.len(), exits.len());
    }

    #[test]
    fn connection_class_covers_08_and_shutdowns() {
        assert!(is_connection_class(&SqlState::CONNECTION_FAILURE));
        assert!(is_connection_class(&SqlState::ADMIN_SHUTDOWN));
        assert!(!is_connection_class(&SqlState::UNIQUE_VIOLATION));
    }

    #[test]
    fn schema_errors_map_to_codes() {
        assert_eq!(
            SchemaError::TooOld {
                found: 0,
                required: 1
            }
            .code(),
            Code::SchemaTooOld
        );
        let too_new = SchemaError::TooNew {
            found: 3,
            needs: 3,
            supported: 1,
        };
        assert_eq!(too_new.code(), Code::SchemaTooNew);
        assert_eq!(
            SchemaError::UnknownVersion { version: 9 }.code(),
            Code::SchemaTooNew
        );
        assert_eq!(
            SchemaError::ChecksumMismatch { version: 1 }.code(),
            Code::MigrationChecksumMismatch
        );
    }
}
