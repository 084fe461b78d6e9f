//! Queues and priorities as a replica and an enqueue name them: the queue a job waits in, the
//! queues a replica serves (each with a weight), a job's priority within its queue, and what an
//! operator sets per queue: a pause, a cap on its running jobs, and a cap on its running jobs of
//! any one concurrency key.
//!
//! Invariants this module keeps:
//! - A queue's name follows the rule of a kind's name ([`crate::handler::is_kind_name`]: what the
//!   schema's checks store); a job whose enqueue names none is in [`DEFAULT_QUEUE`].
//! - A replica serves at least one queue, each once, each with a weight in [`WEIGHT_RANGE`].
//! - A priority is in [`PRIORITY_RANGE`], 0 the most urgent. The schema turns it into the job's
//!   virtual deadline, `sort_at = run_at + priority × PRIORITY_STEP` (`durable_etl_sort_at`,
//!   migration 0020), set with `run_at` by the enqueue and by every retry; the claim takes due
//!   jobs in `(sort_at, id)` order. So a job is passed only by more urgent jobs due less than
//!   `(its priority - theirs) × PRIORITY_STEP` after it, never by a job due later than that,
//!   and no statement ever rewrites a row to age it.
//! - A capped queue never has more running jobs than its cap (of those claimed since it was set):
//!   each holds one of the queue's permits, taken by its claim and freed by the statement that
//!   moves it out of `running` (migration 0021, `worker::claimer`, the `permits_freed!` SQL).
//! - A key-capped queue never has more running jobs of one concurrency key than its key cap (of
//!   those claimed since it was set): each holds a key permit row, inserted by its claim (unique
//!   per queue, key and slot) and deleted by the statement that moves it out of `running`
//!   (migration 0022).

use crate::error::Error;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// The queue of a job whose enqueue names none, and the queue a replica serves by default.
pub const DEFAULT_QUEUE: &str = "default";

/// The priorities a job may have: 0 (the default, the most urgent) to 9.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i16> = 0..=9;

/// How much later than a job of priority `p` a job of priority `p - 1` may be due and still be
/// claimed first: the step of the virtual deadline (the schema's `durable_etl_sort_at`). A
/// priority-9 job is thus passed by at most 90 s of priority-0 arrivals.
pub const PRIORITY_STEP: Duration = Duration::from_secs(10);

/// The weights a served queue may have.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

/// One queue a replica serves, and its weight: when several of its queues have work, each claim
/// shares the replica's room among them in proportion to their weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedQueue {
    /// The queue's name.
    pub name: String,
    /// Its weight, in [`WEIGHT_RANGE`].
    pub weight: u32,
}

impl ServedQueue {
    /// Queue `name` with weight 1.
    pub fn new(name: &str) -> ServedQueue {
        ServedQueue {
            name: name.to_owned(),
            weight: 1,
        }
    }

    /// This queue, with `weight`.
    pub fn weighted(self, weight: u32) -> ServedQueue {
        ServedQueue { weight, ..self }
    }
}

/// What is wrong with a list of served queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueuesError {
    /// No queue is served.
    #[error("a replica must serve at least one queue")]
    None,
    /// A queue's name is not one the schema stores.
    #[error("a queue's name must be 1 to 63 characters of a-z 0-9 _ . starting with a letter")]
    Name,
    /// A weight is outside [`WEIGHT_RANGE`], or not a number.
    #[error("a queue's weight must be a whole number from 1 to 1000")]
    Weight,
    /// A queue is named twice.
    #[error("each queue may be served once")]
    Duplicate,
    /// A cap is outside [`CAP_RANGE`].
    #[error("a queue's cap must be from 1 to 10000 running jobs")]
    Cap,
}

/// Whether `name` may be a queue's name (the rule of a kind's name).
pub fn is_queue_name(name: &str) -> bool {
    crate::handler::is_kind_name(name)
}

/// Checks a replica's served queues (see the module's invariants).
///
/// # Errors
/// The first [`QueuesError`] found.
pub fn validate(queues: &[ServedQueue]) -> Result<(), QueuesError> {
    if queues.is_empty() {
        return Err(QueuesError::None);
    }
    for (i, queue) in queues.iter().enumerate() {
        if !is_queue_name(&queue.name) {
            return Err(QueuesError::Name);
        }
        if !WEIGHT_RANGE.contains(&queue.weight) {
            return Err(QueuesError::Weight);
        }
        if queues[..i].iter().any(|q| q.name == queue.name) {
            return Err(QueuesError::Duplicate);
        }
    }
    Ok(())
}

/// Parses `work --queues`: comma-separated `name` or `name:weight` (weight 1 when left out).
///
/// # Errors
/// As [`validate`], for what the list names.
pub fn parse(list: &str) -> Result<Vec<ServedQueue>, QueuesError> {
    let queues = list
        .split(',')
        .map(|item| match item.trim().split_once(':') {
            None => Ok(ServedQueue::new(item.trim())),
            Some((name, weight)) => weight
                .trim()
                .parse()
                .map(|w| ServedQueue::new(name.trim()).weighted(w))
                .map_err(|_| QueuesError::Weight),
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate(&queues)?;
    Ok(queues)
}

/// Pauses (`$2` true) or resumes (`$2` false) queue `$1`: the claim reads `etl_queues.paused`
/// itself, so no replica claims a job of a paused queue from the moment this commits; jobs
/// already claimed run to their end. Enqueues into a paused queue are accepted and wait, and wake
/// nobody. A resume wakes every replica waiting for the queue at its commit (`NOTIFY` of
/// `q <queue>`, migration 0028): each claims it, and settles it (an enqueue that found it paused
/// notified nobody and holds the queue's enqueue barrier until it ends).
///
/// Locks: the queue's row of `etl_queues` (inserted, or updated in place), to the end of the
/// caller's transaction; claims only read it. A resume takes the notify lock at its commit.
pub const SET_PAUSED_SQL: &str = "
WITH settings AS (
    INSERT INTO etl_queues (queue, paused) VALUES ($1, $2)
        ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, updated_at = now()
    RETURNING queue, paused
)
SELECT pg_notify('durable_etl_jobs', 'q ' || s.queue) FROM settings s WHERE NOT s.paused";

/// Pauses queue `name` (see [`SET_PAUSED_SQL`]), or resumes it when `paused` is false.
///
/// # Errors
/// [`Error::Config`] for a name that is not a queue's; database errors.
pub async fn set_paused(
    client: &impl GenericClient,
    name: &str,
    paused: bool,
) -> Result<(), Error> {
    checked(name, None)?;
    write_setting(client, SET_PAUSED_SQL, name, (&paused, Type::BOOL)).await
}

/// The caps a queue may have: at most this many of its jobs run at once, across all replicas.
pub const CAP_RANGE: std::ops::RangeInclusive<i32> = 1..=10_000;

/// Sets queue `$1`'s cap to `$2` (NULL: uncapped): its settings row, and one permit row per slot
/// from 1 to the cap (the ones it lacks); the free permits above the cap are deleted, and held
/// ones above it are never taken again once freed; while they are held, a claim takes no slot
/// above the cap minus their number, so no claim starts a job while the queue runs as many as
/// the new cap (`worker::claimer`'s `CLAIM_SQL`). A cap applies to claims made after it commits:
/// jobs already running without a permit (claimed while the queue was uncapped) finish as they
/// are. It wakes every replica waiting for the queue at its commit (`q <queue>`, as a resume
/// does): a raised or lifted cap may have made its due jobs claimable.
///
/// Locks: the queue's settings row; the permit rows it inserts or deletes (a permit a claim is
/// taking is locked by that claim: the delete waits for it, at most `lock_timeout`); the notify
/// lock at its commit.
pub const SET_CAP_SQL: &str = "
WITH settings AS (
    INSERT INTO etl_queues (queue, cap) VALUES ($1, $2)
        ON CONFLICT (queue) DO UPDATE SET cap = excluded.cap, updated_at = now()
    RETURNING queue, cap
), added AS (
    INSERT INTO etl_queue_permits (queue, slot)
    SELECT s.queue, g FROM settings s, generate_series(1, coalesce(s.cap, 0)) AS g
        ON CONFLICT (queue, slot) DO NOTHING
), removed AS (
    DELETE FROM etl_queue_permits AS p
     USING settings s
     WHERE p.queue = s.queue AND p.slot > coalesce(s.cap, 0) AND p.claim_id IS NULL
)
SELECT pg_notify('durable_etl_jobs', 'q ' || s.queue) FROM settings s";

/// Caps queue `name` at `cap` running jobs across all replicas (`None`: uncapped); see
/// [`SET_CAP_SQL`].
///
/// # Errors
/// [`Error::Config`] for a name that is not a queue's or a cap outside [`CAP_RANGE`]; database
/// errors.
pub async fn set_cap(
    client: &impl GenericClient,
    name: &str,
    cap: Option<i32>,
) -> Result<(), Error> {
    checked(name, cap)?;
    write_setting(client, SET_CAP_SQL, name, (&cap, Type::INT4)).await
}

/// Sets queue `$1`'s key cap to `$2` (NULL: none): at most that many of its jobs of one
/// concurrency key run at once. Key permits exist only while held, so nothing else is written; a
/// lowered cap starts no job of a key until the key's held permits (those above the new cap
/// included) fall below it. It wakes every
/// replica waiting for the queue at its commit (`q <queue>`, as a resume does).
///
/// Locks: the queue's settings row; the notify lock at its commit.
pub const SET_KEY_CAP_SQL: &str = "
WITH settings AS (
    INSERT INTO etl_queues (queue, key_cap) VALUES ($1, $2)
        ON CONFLICT (queue) DO UPDATE SET key_cap = excluded.key_cap, updated_at = now()
    RETURNING queue
)
SELECT pg_notify('durable_etl_jobs', 'q ' || s.queue) FROM settings s";

/// Caps queue `name`'s running jobs of any one concurrency key at `cap` across all replicas
/// (`None`: no key cap); see [`SET_KEY_CAP_SQL`].
///
/// # Errors
/// [`Error::Config`] for a name that is not a queue's or a cap outside [`CAP_RANGE`]; database
/// errors.
pub async fn set_key_cap(
    client: &impl GenericClient,
    name: &str,
    cap: Option<i32>,
) -> Result<(), Error> {
    checked(name, cap)?;
    write_setting(client, SET_KEY_CAP_SQL, name, (&cap, Type::INT4)).await
}

/// Runs `sql`, one of this module's settings statements, for queue `name` (`$1`) with `value`
/// (`$2`, of its type).
///
/// # Errors
/// The database error of the statement.
async fn write_setting(
    client: &impl GenericClient,
    sql: &str,
    name: &str,
    value: (&(dyn tokio_postgres::types::ToSql + Sync), Type),
) -> Result<(), Error> {
    client
        .execute_typed(sql, &[(&name, Type::TEXT), value])
        .await?;
    Ok(())
}

/// Checks a queue's name and a cap for it.
///
/// # Errors
/// [`Error::Config`] for a name that is not a queue's or a cap outside [`CAP_RANGE`].
fn checked(name: &str, cap: Option<i32>) -> Result<(), Error> {
    if !is_queue_name(name) {
        return Err(Error::Config(crate::ConfigError::Queues(QueuesError::Name)));
    }
    if cap.is_some_and(|c| !CAP_RANGE.contains(&c)) {
        return Err(Error::Config(crate::ConfigError::Queues(QueuesError::Cap)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse, validate, QueuesError, ServedQueue, DEFAULT_QUEUE};

    #[test]
    fn a_list_of_queues_parses_with_weights_defaulting_to_one() {
        assert_eq!(
            parse("mail:3, reports ,etl.load:1").unwrap(),
            vec![
                ServedQueue::new("mail").weighted(3),
                ServedQueue::new("reports"),
                ServedQueue::new("etl.load"),
            ]
        );
        assert_eq!(
            parse(DEFAULT_QUEUE).unwrap(),
            vec![ServedQueue::new("default")]
        );
    }

    #[test]
    fn a_bad_list_of_queues_names_what_is_wrong() {
        assert_eq!(parse(""), Err(QueuesError::Name));
        assert_eq!(parse("Mail"), Err(QueuesError::Name));
        assert_eq!(parse("a,,b"), Err(QueuesError::Name));
        assert_eq!(parse("mail:0"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:1001"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:x"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:-1"), Err(QueuesError::Weight));
        assert_eq!(parse("mail,mail:2"), Err(QueuesError::Duplicate));
        assert_eq!(parse("mail:1000").unwrap()[0].weight, 1000);
        assert_eq!(validate(&[]), Err(QueuesError::None));
    }
}
