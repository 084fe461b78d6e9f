//! The one enumerated list of stable codes.
//!
//! Invariants this module keeps:
//! - Every code that crosses a boundary (an HTTP problem body, a log field, a metric label, a stored
//!   `failure_code`, a process exit message) is a [`Code`], rendered by [`Code::as_str`]. No error
//!   text, SQL, payload or principal ever takes its place.
//! - The strings are stable: renaming one is a breaking change recorded in CHANGELOG.md.
//! - The codes a job row may store ([`Code::is_stored_failure`]) are exactly those the
//!   `etl_job_outcomes.failure_code` CHECK constraint admits; a test compares the two lists.

use std::fmt;

/// A stable, non-sensitive code. See the module documentation for where codes appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// The job's request payload failed validation at execution time.
    InvalidPayload,
    /// A record of the job could not be transformed; the job stores the record's index, never its value.
    RecordInvalid,
    /// A transient failure recurred until the job's `max_attempts` was spent.
    AttemptsExhausted,
    /// The job's lease expired (its worker died or froze) on its last permitted attempt.
    LeaseExpiredExhausted,
    /// The handler panicked; the panic is a failed attempt, never a dead replica.
    HandlerPanicked,
    /// The handler declared a permanent failure.
    HandlerFailed,
    /// The handler ran past the job's execution timeout.
    ExecutionTimeout,
    /// A transient database error (serialization, deadlock, lock timeout, lost connection).
    TransientDatabase,
    /// The job was cancelled by its owner.
    Cancelled,
    /// The job was cancelled because its owner submitted a replacement.
    Replaced,
    /// No handler is registered for the job's kind.
    UnknownKind,
    /// A write conditioned on the job's lease matched no row: another claim owns the job now.
    LeaseLost,
    /// A configuration value is missing, malformed or inconsistent with another.
    ConfigInvalid,
    /// The database could not be reached or stopped answering.
    DatabaseUnavailable,
    /// The database failed a statement for a reason that is not transient.
    DatabaseError,
    /// The database server refused the connection for a reason retrying cannot fix: the role,
    /// its password or its TLS setting (SQLSTATE class 28), or a missing database (3D000).
    DatabaseRefused,
    /// A tool's database name (`demo --demo-database`, `bench --bench-database`) names a
    /// database the tool did not create, or one of its own in use: it drops neither.
    DatabaseTaken,
    /// A local resource that is not the database (a socket, a child process, a local HTTP
    /// endpoint) failed or did not answer in time.
    IoError,
    /// An invariant of this crate did not hold: a bug to report.
    InternalError,
    /// The database has no schema, or one older than this release needs: run `durable-etl migrate`.
    SchemaTooOld,
    /// The database was migrated by a newer release whose schema this release cannot run against.
    SchemaTooNew,
    /// An applied migration differs from the migration of the same version embedded in this release.
    MigrationChecksumMismatch,
    /// A migration or its reversal could not be applied.
    MigrationFailed,
    /// Another live process already runs with this replica's `lease_owner_id`.
    OwnerIdInUse,
    /// The replica's cell moved to another Citus node while it ran: it stopped, to start again on
    /// the cell's new node.
    CellMoved,
    /// The owner is moving, or has moved, to another cell: its requests wait for the move, and
    /// its enqueues go to the cell the directory names now.
    OwnerMoved,
    /// Commits of the database are held waiting for a synchronous standby that does not answer:
    /// nothing can be claimed or end until one is back or none is required.
    SynchronousStandbyWaiting,
    /// The request body is not valid JSON.
    RequestMalformed,
    /// The request is not an object, or has a field v1 does not define.
    RequestInvalid,
    /// The request body is larger than the configured limit.
    RequestTooLarge,
    /// `dataset` is missing or not a name `[a-z][a-z0-9_]{0,62}`.
    DatasetInvalid,
    /// `key` is missing or not a field name of 1 to 128 characters.
    KeyInvalid,
    /// `records` is missing, not an array, or has an element that is not an object.
    RecordsInvalid,
    /// `records` has more elements than the configured limit.
    TooManyRecords,
    /// `transform` is not a valid transform spec.
    TransformInvalid,
    /// `transform` names more fields, or carries larger `defaults`, than a request may.
    TransformTooLarge,
    /// The records would exceed the transform's bound (fields or bytes across all records, before
    /// or after `select`).
    OutputTooLarge,
    /// A number's exponent would expand it beyond the digits a request may store exactly.
    NumberOutOfRange,
    /// `run_at` is not an RFC 3339 instant.
    RunAtInvalid,
    /// The idempotency key is missing, empty or longer than 255 characters.
    IdempotencyKeyInvalid,
    /// The idempotency key was used before by the same owner with a different request.
    IdempotencyKeyReused,
    /// `replaces` is not a job id.
    ReplacesInvalid,
    /// Credentials are missing, malformed, unknown or revoked.
    Unauthorized,
    /// No such job for this owner (the same answer whether it exists for another owner or not),
    /// or no live API key with the id `api-keys revoke` was given.
    NotFound,
    /// The job is in a state that does not allow the request (for example, already terminal).
    Conflict,
    /// No route of the API or the console has this path.
    NoSuchRoute,
    /// The request body is not `application/json`.
    UnsupportedMediaType,
    /// The request took longer than the server allows.
    RequestTimeout,
    /// A query parameter is not valid.
    QueryInvalid,
    /// The resource exists but does not serve this HTTP method (the `Allow` header lists those
    /// it serves).
    MethodNotAllowed,
    /// A schedule's name, cron expression, time zone or policy is not valid (the pointer says
    /// which).
    ScheduleInvalid,
    /// The body sent to replay a dead letter is not the failed job's payload (its keyed
    /// fingerprint differs), or the job was enqueued without an idempotency key and kept no
    /// fingerprint to compare with.
    ReplayBodyMismatch,
    /// A dead letter's replay without a body found no retained payload: its kind and queue did
    /// not retain payloads, or its retained payload outlived its time to keep.
    PayloadNotRetained,
    /// A dead letter's retained payload does not open under the key this deployment holds now:
    /// it was sealed under a key since rotated or destroyed.
    PayloadUnreadable,
}

impl Code {
    /// Every code, in declaration order.
    pub const ALL: &'static [Code] = &[
        Code::InvalidPayload,
        Code::RecordInvalid,
        Code::AttemptsExhausted,
        Code::LeaseExpiredExhausted,
        Code::HandlerPanicked,
        Code::HandlerFailed,
        Code::ExecutionTimeout,
        Code::TransientDatabase,
        Code::Cancelled,
        Code::Replaced,
        Code::UnknownKind,
        Code::LeaseLost,
        Code::ConfigInvalid,
        Code::DatabaseUnavailable,
        Code::DatabaseError,
        Code::DatabaseRefused,
        Code::DatabaseTaken,
        Code::IoError,
        Code::InternalError,
        Code::SchemaTooOld,
        Code::SchemaTooNew,
        Code::MigrationChecksumMismatch,
        Code::MigrationFailed,
        Code::OwnerIdInUse,
        Code::CellMoved,
        Code::OwnerMoved,
        Code::SynchronousStandbyWaiting,
        Code::RequestMalformed,
        Code::RequestInvalid,
        Code::RequestTooLarge,
        Code::DatasetInvalid,
        Code::KeyInvalid,
        Code::RecordsInvalid,
        Code::TooManyRecords,
        Code::TransformInvalid,
        Code::TransformTooLarge,
        Code::OutputTooLarge,
        Code::NumberOutOfRange,
        Code::RunAtInvalid,
        Code::IdempotencyKeyInvalid,
        Code::IdempotencyKeyReused,
        Code::ReplacesInvalid,
        Code::Unauthorized,
        Code::NotFound,
        Code::Conflict,
        Code::NoSuchRoute,
        Code::UnsupportedMediaType,
        Code::RequestTimeout,
        Code::QueryInvalid,
        Code::MethodNotAllowed,
        Code::ScheduleInvalid,
        Code::ReplayBodyMismatch,
        Code::PayloadNotRetained,
        Code::PayloadUnreadable,
    ];

    /// The stable snake_case string of this code.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::InvalidPayload => "invalid_payload",
            Code::RecordInvalid => "record_invalid",
            Code::AttemptsExhausted => "attempts_exhausted",
            Code::LeaseExpiredExhausted => "lease_expired_exhausted",
            Code::HandlerPanicked => "handler_panicked",
            Code::HandlerFailed => "handler_failed",
            Code::ExecutionTimeout => "execution_timeout",
            Code::TransientDatabase => "transient_database",
            Code::Cancelled => "cancelled",
            Code::Replaced => "replaced",
            Code::UnknownKind => "unknown_kind",
            Code::LeaseLost => "lease_lost",
            Code::ConfigInvalid => "config_invalid",
            Code::DatabaseUnavailable => "database_unavailable",
            Code::DatabaseError => "database_error",
            Code::DatabaseRefused => "database_refused",
            Code::DatabaseTaken => "database_taken",
            Code::IoError => "io_error",
            Code::InternalError => "internal_error",
            Code::SchemaTooOld => "schema_too_old",
            Code::SchemaTooNew => "schema_too_new",
            Code::MigrationChecksumMismatch => "migration_checksum_mismatch",
            Code::MigrationFailed => "migration_failed",
            Code::OwnerIdInUse => "owner_id_in_use",
            Code::CellMoved => "cell_moved",
            Code::OwnerMoved => "owner_moved",
            Code::SynchronousStandbyWaiting => "synchronous_standby_waiting",
            Code::RequestMalformed => "request_malformed",
            Code::RequestInvalid => "request_invalid",
            Code::RequestTooLarge => "request_too_large",
            Code::DatasetInvalid => "dataset_invalid",
            Code::KeyInvalid => "key_invalid",
            Code::RecordsInvalid => "records_invalid",
            Code::TooManyRecords => "too_many_records",
            Code::TransformInvalid => "transform_invalid",
            Code::TransformTooLarge => "transform_too_large",
            Code::OutputTooLarge => "output_too_large",
            Code::NumberOutOfRange => "number_out_of_range",
            Code::RunAtInvalid => "run_at_invalid",
            Code::IdempotencyKeyInvalid => "idempotency_key_invalid",
            Code::IdempotencyKeyReused => "idempotency_key_reused",
            Code::ReplacesInvalid => "replaces_invalid",
            Code::Unauthorized => "unauthorized",
            Code::NotFound => "not_found",
            Code::Conflict => "conflict",
            Code::NoSuchRoute => "no_such_route",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::RequestTimeout => "request_timeout",
            Code::QueryInvalid => "query_invalid",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::ScheduleInvalid => "schedule_invalid",
            Code::ReplayBodyMismatch => "replay_body_mismatch",
            Code::PayloadNotRetained => "payload_not_retained",
            Code::PayloadUnreadable => "payload_unreadable",
        }
    }

    /// Whether a job row may store this code in `failure_code`.
    pub const fn is_stored_failure(self) -> bool {
        matches!(
            self,
            Code::InvalidPayload
                | Code::RecordInvalid
                | Code::AttemptsExhausted
                | Code::LeaseExpiredExhausted
                | Code::HandlerPanicked
                | Code::HandlerFailed
                | Code::ExecutionTimeout
                | Code::TransientDatabase
                | Code::Cancelled
                | Code::Replaced
                | Code::UnknownKind
        )
    }

    /// The code with this string, if there is one.
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|code| code.as_str() == s)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;
    use std::collections::HashSet;

    #[test]
    fn every_code_round_trips_through_its_string() {
        for code in Code::ALL {
            assert_eq!(Code::parse(code.as_str()), Some(*code));
            assert_eq!(code.to_string(), code.as_str());
        }
        assert_eq!(Code::parse("no_such_code"), None);
    }

    #[test]
    fn codes_are_unique_snake_case() {
        let strings: HashSet<_> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(strings.len(), Code::ALL.len());
        for s in strings {
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
        }
    }
}
