//! The audit log (`etl_audit_log`, migrations 0037 and 0039): one entry per action taken with
//! an operator's authority, from the web console or the HTTP API, and the read of the newest
//! entries that the operators' audit page shows.
//!
//! Invariants this module keeps:
//! - An action is an operator's when the key that takes it is an operator's ([`Role::Operator`]),
//!   whichever owner's jobs or letters it takes, and from either source ([`Source`]). An owner's
//!   key acting on its own owner's jobs or letters takes no operator action: [`record`] writes
//!   nothing for it, so both sources follow the one rule.
//! - An entry says who (the key's id, never an owner), what ([`Action`]), on what (a queue's name,
//!   a job's id, or a filter summary from [`filter_target`] that never names an owner; never a
//!   payload), how many, from where ([`Source`]), and when (the database's clock).
//! - An action that acts writes exactly one entry; one that is refused or finds nothing to act on
//!   (a letter or job that does not exist, a replay an earlier one made) writes none.
//! - The entry is written in the transaction of its action, so one is never kept without the
//!   other; a bulk replay, which commits in chunks, writes its entry after its last chunk, with
//!   the count it made.
//! - [`newest`] reads at most [`SHOWN`] entries along the primary key, however long the log.

use crate::dead_letters::LetterFilter;
use crate::service::api_keys::{KeyHolder, Role};
use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// The most entries [`newest`] reads.
pub(crate) const SHOWN: i64 = 200;

/// The longest target an entry keeps, in characters (the table's CHECK).
const TARGET_MAX: usize = 512;

/// Appends an entry: key `$1` took action `$2` on `$3`, affecting `$4`, from source `$5`.
///
/// Locks: none beyond the new row.
const RECORD_SQL: &str = "
INSERT INTO etl_audit_log (key_id, action, target, affected, source) VALUES ($1, $2, $3, $4, $5)";

/// The newest `$1` entries, newest first.
///
/// Locks: none; walks the primary key backwards and stops at `$1`.
const NEWEST_SQL: &str = "
SELECT at, key_id, action, target, affected, source FROM etl_audit_log ORDER BY id DESC LIMIT $1";

/// Where an action came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The web console (a signed-in session).
    Console,
    /// The HTTP API (a bearer key).
    Api,
}

impl Source {
    /// The source's stored name (the table's CHECK allows these two).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Console => "console",
            Source::Api => "api",
        }
    }
}

/// An operator action.
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
    /// Where it came from (`console` or `api`).
    pub(crate) source: String,
}

/// Whether what `by` does is an operator action, so audited: whether its key is an operator's.
pub(crate) fn audited(by: &KeyHolder) -> bool {
    by.role == Role::Operator
}

/// Appends the entry of `action` taken by `by` from `source` on `target`, affecting
/// `affected`, on `client` (the action's transaction), when it is an operator action
/// ([`audited`]); writes nothing otherwise. A target longer than the table keeps is cut.
///
/// # Errors
/// Database errors.
pub(crate) async fn record(
    client: &impl GenericClient,
    by: &KeyHolder,
    source: Source,
    action: Action,
    target: &str,
    affected: u64,
) -> Result<(), tokio_postgres::Error> {
    if !audited(by) {
        return Ok(());
    }
    let target: String = target.chars().take(TARGET_MAX).collect();
    let affected = i64::try_from(affected).unwrap_or(i64::MAX);
    client
        .execute_typed(
            RECORD_SQL,
            &[
                (&by.id, Type::UUID),
                (&action.as_str(), Type::TEXT),
                (&target, Type::TEXT),
                (&affected, Type::INT8),
                (&source.as_str(), Type::TEXT),
            ],
        )
        .await?;
    Ok(())
}

/// The target of a bulk action over the letters matching `filter`: its fields in words
/// (`queue=mail code=x`), the owner as `one owner` when `one_owner` (never a principal nor its
/// digest); `all letters` for no filter.
pub(crate) fn filter_target(filter: &LetterFilter<'_>, one_owner: bool) -> String {
    let time = |at: DateTime<Utc>| at.format("%Y-%m-%dT%H:%M:%S").to_string();
    let mut parts: Vec<String> = [
        ("queue", filter.queue.map(str::to_owned)),
        ("kind", filter.kind.map(str::to_owned)),
        ("code", filter.code.map(str::to_owned)),
        ("since", filter.since.map(time)),
        ("until", filter.until.map(time)),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.map(|v| format!("{name}={v}")))
    .collect();
    if one_owner {
        parts.push("one owner".to_owned());
    }
    if parts.is_empty() {
        "all letters".to_owned()
    } else {
        parts.join(" ")
    }
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
                source: r.try_get(5)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_filter_target_names_its_fields_and_never_an_owner() {
        assert_eq!(
            filter_target(&LetterFilter::default(), false),
            "all letters"
        );
        assert_eq!(filter_target(&LetterFilter::default(), true), "one owner");
        let since = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).single();
        let filter = LetterFilter {
            queue: Some("mail"),
            code: Some("mailbox_gone"),
            since,
            ..LetterFilter::default()
        };
        assert_eq!(
            filter_target(&filter, true),
            "queue=mail code=mailbox_gone since=2026-01-02T03:04:05 one owner"
        );
    }

    #[test]
    fn only_operator_keys_take_audited_actions() {
        let holder = |role| KeyHolder {
            id: Uuid::nil(),
            owner_key: [0; 32],
            role,
        };
        assert!(audited(&holder(Role::Operator)));
        assert!(!audited(&holder(Role::Owner)));
    }
}
