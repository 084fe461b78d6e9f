//! What is the infrastructure's fault, never the job's: the database errors after which a
//! job's computed result is committed again under the same claim, or the job is given back, its
//! attempt not charged.
//!
//! Invariants this module keeps:
//! - Only faults of the path between the replica and the database count: a lost session, a
//!   terminated backend, a server shutting down or in recovery, a failover's read-only server, a
//!   statement cancelled by a bound or an operator, a session ended idle in its transaction, no
//!   connection to spare. An error the job's own writes caused (a constraint, a conflict with
//!   another transaction's writes, a lock its effects waited for too long) is the job's, and is
//!   charged as before.

use crate::error::is_connection_loss;
use tokio_postgres::error::SqlState;

/// The SQLSTATEs, beside a lost connection ([`is_connection_loss`]), that are the
/// infrastructure's fault.
const INFRASTRUCTURE: [SqlState; 4] = [
    SqlState::QUERY_CANCELED,
    SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
    SqlState::READ_ONLY_SQL_TRANSACTION,
    SqlState::TOO_MANY_CONNECTIONS,
];

/// Whether database error `e` is the infrastructure's fault, never the job's (see the module).
pub(crate) fn is_infrastructure(e: &tokio_postgres::Error) -> bool {
    is_connection_loss(e) || e.code().is_some_and(|code| INFRASTRUCTURE.contains(code))
}
