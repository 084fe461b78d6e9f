//! The wake a completer owes the waiting replicas for permits it freed and will not claim again.
//!
//! Invariants this module keeps:
//! - A completion of a capped queue's job frees its permits and wakes nobody (migration 0023);
//!   its caller claims the queue again or sends [`WAKE_WAITING_SQL`] after the commit, so no
//!   permit with a due job waits for a poll.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// Wakes every replica listening for work of the queues `$1` (`NOTIFY` of `q <queue>`, on the
/// enqueue channel): what a completer sends after a commit that freed permits it will not claim
/// again itself. Each replica that waits for such a queue claims it and settles it (tries its
/// enqueue barrier: an enqueue that found no free permit before this commit notified nobody).
/// Sent after that commit, a replica that registers as waiting later claims in a snapshot that
/// sees the permits free.
///
/// Locks: none (the notify lock, for the commit of this one statement).
pub const WAKE_WAITING_SQL: &str =
    "SELECT pg_notify(durable_etl_channel(), 'q ' || q) FROM unnest($1::text[]) AS q";

/// Wakes the replicas waiting for `queues` ([`WAKE_WAITING_SQL`]): for a caller that completed
/// jobs of a capped queue ([`super::succeed_many`], [`super::retry`], [`super::fail`]) and will
/// not claim those queues again itself at once.
///
/// # Errors
/// The database error of the statement.
pub async fn wake_waiting(
    client: &impl GenericClient,
    queues: &[&str],
) -> Result<(), tokio_postgres::Error> {
    client
        .query_typed(WAKE_WAITING_SQL, &[(&queues, Type::TEXT_ARRAY)])
        .await
        .map(drop)
}
