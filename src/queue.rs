//! Queues and priorities as a replica and an enqueue name them: the queue a job waits in, the
//! queues a replica serves (each with a weight), a job's priority within its queue, and what an
//! operator sets per queue: a pause, a cap on its running jobs, and a cap on its running jobs of
//! any one concurrency key.
//!
//! Invariants this module keeps:
//! - The served queues keep `served`'s invariants: names by the rule of a kind's name, a job
//!   whose enqueue names none in [`DEFAULT_QUEUE`], weights in [`WEIGHT_RANGE`].
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

pub(crate) mod served;
pub use served::{
    is_queue_name, parse, validate, QueuesError, ServedQueue, DEFAULT_QUEUE, WEIGHT_RANGE,
};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// The priorities a job may have: 0 (the default, the most urgent) to 9.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i16> = 0..=9;

/// How much later than a job of priority `p` a job of priority `p - 1` may be due and still be
/// claimed first: the step of the virtual deadline (the schema's `durable_etl_sort_at`). A
/// priority-9 job is thus passed by at most 90 s of priority-0 arrivals.
pub const PRIORITY_STEP: Duration = Duration::from_secs(10);

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
    INSERT INTO etl_queues (queue, paused, updated_at) VALUES ($1, $2, now())
        ON CONFLICT (queue) DO UPDATE
       SET paused = excluded.paused, updated_at = excluded.updated_at
    RETURNING queue, paused
)
SELECT pg_notify(durable_etl_channel(), 'q ' || s.queue) FROM settings s WHERE NOT s.paused";

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
    INSERT INTO etl_queues (queue, cap, updated_at) VALUES ($1, $2, now())
        ON CONFLICT (queue) DO UPDATE SET cap = excluded.cap, updated_at = excluded.updated_at
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
SELECT pg_notify(durable_etl_channel(), 'q ' || s.queue) FROM settings s";

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
    INSERT INTO etl_queues (queue, key_cap, updated_at) VALUES ($1, $2, now())
        ON CONFLICT (queue) DO UPDATE
       SET key_cap = excluded.key_cap, updated_at = excluded.updated_at
    RETURNING queue
)
SELECT pg_notify(durable_etl_channel(), 'q ' || s.queue) FROM settings s";

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
