//! Error codes, exit codes and the messages that name a target, checked without a database.

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
    for (reason, says) in [
        (Taken::NotCreated, "exists without this tool's mark"),
        (Taken::InUse, "is in use"),
    ] {
        let taken = Error::DatabaseTaken {
            name: "durable_etl_demo".to_owned(),
            tool: "demo",
            reason,
        };
        assert_eq!(
            (taken.code(), taken.exit_code()),
            (Code::DatabaseTaken, EXIT_USAGE)
        );
        let text = taken.to_string();
        assert!(text.contains(says), "{text}");
        assert!(
            text.contains("pick another name with --demo-database NAME"),
            "{text}"
        );
    }
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
fn a_target_names_address_database_and_role_never_the_password() {
    let pg: tokio_postgres::Config = "postgres://etl:canary-pw@db.example:6543/jobs"
        .parse()
        .unwrap_or_else(|_| tokio_postgres::Config::new());
    let shown = Target::of(&pg).to_string();
    assert_eq!(shown, "db.example:6543 (database \"jobs\", role \"etl\")");
    let no_db: tokio_postgres::Config = "postgres://etl@db.example"
        .parse()
        .unwrap_or_else(|_| tokio_postgres::Config::new());
    let defaulted = Target::of(&no_db);
    assert_eq!(defaulted.address, "db.example:5432");
    assert_eq!(defaulted.database, "etl", "PostgreSQL's default database");
    let unreachable = Error::Unreachable {
        target: Target::of(&pg),
        source: None,
    };
    assert_eq!(
        (unreachable.code(), unreachable.exit_code()),
        (Code::DatabaseUnavailable, EXIT_DATABASE_UNREACHABLE)
    );
    assert!(!unreachable.to_string().contains("canary-pw"));
}

#[test]
fn a_listen_failure_names_the_address_and_exits_5() {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], 8080));
    let e = Error::Listen {
        address,
        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
    };
    assert_eq!((e.code(), e.exit_code()), (Code::IoError, EXIT_IO));
    assert_eq!(
        e.to_string(),
        "cannot listen on 127.0.0.1:8080: the address is in use"
    );
    let missing = Error::NoLiveKey(uuid::Uuid::nil());
    assert_eq!(
        (missing.code(), missing.exit_code()),
        (Code::NotFound, EXIT_FAILURE)
    );
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

#[cfg(feature = "sqlx")]
#[test]
fn a_sqlx_error_without_a_sqlstate_is_unavailable_or_a_database_error() {
    assert_eq!(
        Error::from(sqlx::Error::PoolTimedOut).code(),
        Code::DatabaseUnavailable
    );
    assert_eq!(
        Error::from(sqlx::Error::WorkerCrashed).code(),
        Code::DatabaseUnavailable
    );
    assert_eq!(
        Error::from(sqlx::Error::RowNotFound).code(),
        Code::DatabaseError
    );
}
