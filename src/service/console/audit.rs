//! The console's audit log (`etl_audit_log`, migration 0037): every action taken from the
//! console, and the operators' page that lists the newest.
//!
//! Invariants this module keeps:
//! - Every console action writes exactly one entry when it acts (a preview writes none): who
//!   (the signed-in key's id, never its owner), what ([`Action`]), on what (a queue's name, a
//!   job's id, or a filter summary that never names an owner), how many, and when (the
//!   database's clock).
//! - The entry is written in the transaction of its action, so one is never kept without the
//!   other; a bulk replay, which commits in chunks, writes its entry after its last chunk, with
//!   the count it made.
//! - The page is for operator keys only ([`OperatorViewer`]) and reads at most [`SHOWN`] entries
//!   along the primary key, however long the log.

use super::access::{page, OperatorViewer};
use super::pages::layout;
use super::when;
use crate::service::api_keys::Role;
use crate::service::problem::Problem;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{html, Markup};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// The most entries the page shows.
pub(crate) const SHOWN: i64 = 200;

/// The longest target an entry keeps, in characters (the table's CHECK).
const TARGET_MAX: usize = 512;

/// Appends an entry: key `$1` took action `$2` on `$3`, affecting `$4`.
///
/// Locks: none beyond the new row.
const RECORD_SQL: &str =
    "INSERT INTO etl_audit_log (key_id, action, target, affected) VALUES ($1, $2, $3, $4)";

/// The newest `$1` entries, newest first.
///
/// Locks: none; walks the primary key backwards and stops at `$1`.
const NEWEST_SQL: &str = "
SELECT at, key_id, action, target, affected FROM etl_audit_log ORDER BY id DESC LIMIT $1";

/// An action the console takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// One dead letter replayed.
    LetterReplay,
    /// One dead letter discarded.
    LetterDiscard,
    /// The dead letters matching a filter replayed.
    LettersReplay,
    /// The dead letters matching a filter discarded.
    LettersDiscard,
    /// A job cancelled (or its cancel requested).
    JobCancel,
    /// A queue paused.
    QueuePause,
    /// A queue resumed.
    QueueResume,
    /// A queue's cap set or lifted.
    QueueCap,
    /// A queue's key cap set or lifted.
    QueueKeyCap,
}

impl Action {
    /// The action's stored name (an identifier).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::LetterReplay => "letter_replay",
            Action::LetterDiscard => "letter_discard",
            Action::LettersReplay => "letters_replay",
            Action::LettersDiscard => "letters_discard",
            Action::JobCancel => "job_cancel",
            Action::QueuePause => "queue_pause",
            Action::QueueResume => "queue_resume",
            Action::QueueCap => "queue_cap",
            Action::QueueKeyCap => "queue_key_cap",
        }
    }
}

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// When it was taken.
    pub(crate) at: DateTime<Utc>,
    /// The key that took it.
    pub(crate) key_id: Uuid,
    /// The action's name.
    pub(crate) action: String,
    /// What it was taken on.
    pub(crate) target: String,
    /// How many jobs or letters it took.
    pub(crate) affected: i64,
}

/// Appends the entry of `action` taken by key `key_id` on `target`, affecting `affected`, on
/// `client` (the action's transaction). A target longer than the table keeps is cut.
///
/// # Errors
/// Database errors.
pub(crate) async fn record(
    client: &impl GenericClient,
    key_id: Uuid,
    action: Action,
    target: &str,
    affected: u64,
) -> Result<(), tokio_postgres::Error> {
    let target: String = target.chars().take(TARGET_MAX).collect();
    let affected = i64::try_from(affected).unwrap_or(i64::MAX);
    client
        .execute_typed(
            RECORD_SQL,
            &[
                (&key_id, Type::UUID),
                (&action.as_str(), Type::TEXT),
                (&target, Type::TEXT),
                (&affected, Type::INT8),
            ],
        )
        .await?;
    Ok(())
}

/// The newest [`SHOWN`] entries, newest first.
///
/// # Errors
/// Database errors.
pub(crate) async fn newest(
    client: &impl GenericClient,
) -> Result<Vec<Entry>, tokio_postgres::Error> {
    let rows = client
        .query_typed(NEWEST_SQL, &[(&SHOWN, Type::INT8)])
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Entry {
                at: r.try_get(0)?,
                key_id: r.try_get(1)?,
                action: r.try_get(2)?,
                target: r.try_get(3)?,
                affected: r.try_get(4)?,
            })
        })
        .collect()
}

/// The operators' audit page: the newest entries.
pub(super) async fn audit_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
) -> Result<Response, Problem> {
    let entries = conn.run(|c| newest(&*c)).await?;
    Ok(page(
        StatusCode::OK,
        audit(super::access::shown(&viewer), &entries),
    ))
}

/// The audit page's markup.
fn audit(viewer: (Role, &str), entries: &[Entry]) -> Markup {
    layout(
        "Audit",
        Some(viewer),
        html! {
            h1 { "Audit" }
            p { "The newest " (SHOWN) " actions taken from the console: who (the key's id), what, on what, how many, when." }
            @if entries.is_empty() {
                p.empty { "No action has been taken from the console." }
            } @else {
                table {
                    thead { tr { th { "When" } th { "Key" } th { "Action" } th { "Target" } th { "How many" } } }
                    tbody {
                        @for entry in entries {
                            tr {
                                td { (when::at(entry.at)) }
                                td { span.id { (entry.key_id) } }
                                td { code { (entry.action) } }
                                td {
                                    @match Uuid::parse_str(&entry.target) {
                                        Ok(job) => a.id href={ "/console/jobs/" (job) } { (job) },
                                        Err(_) => code { (entry.target) },
                                    }
                                }
                                td { (entry.affected) }
                            }
                        }
                    }
                }
            }
        },
    )
}
