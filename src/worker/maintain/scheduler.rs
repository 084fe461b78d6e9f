//! The scheduler role: every replica fires the due schedules ([`crate::schedule`]), with no
//! leader.
//!
//! Invariants this module keeps:
//! - A fire makes its job at most once, whoever evaluates it: the due schedule row is taken with
//!   `FOR UPDATE SKIP LOCKED`, and its job's insert, the fire's record and the move of
//!   `next_fire_at` past it commit in one transaction. A crash before the commit leaves none of
//!   the three; another replica skips the locked row and takes it once free, by then past the
//!   fire. The job also carries a key derived from (schedule, fire instant), so even a replayed
//!   fire returns the job it made.
//! - The database's clock decides what is due ([`DUE_SQL`] compares with `clock_timestamp()`);
//!   a replica's own clock only times its sleep, so a skewed clock makes no fire early or twice.
//! - A fire's job is due at the fire instant (`run_at`), in the schedule's queue, priority and
//!   attempt bound, owned by the schedule's owner.
//! - Missed fires follow the schedule's policy ([`plan`]), and under [`Overlap::Skip`] a fire
//!   whose previous job is still pending or running makes none.

use crate::codes::Code;
use crate::db;
use crate::digest::Secret;
use crate::error::Error;
use crate::jobs::enqueue::{self, Submission};
use crate::schedule::recurrence::Recurrence;
use crate::schedule::{Missed, Overlap, CATCH_UP_MAX, SKIP_LATER_THAN};
use crate::worker::shared::Shared;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{Client, Row};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The most schedules one transaction fires.
pub const DUE_BATCH: i64 = 64;

/// The longest the role sleeps between looks, so a schedule created or resumed meanwhile is
/// seen within it.
pub const LOOK_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// How many fires a missed stretch is walked through (a schedule firing every second that
/// missed a day walks 86,400); past it, the next fire is the first after now, and the walked
/// ones are all the stretch makes jobs for.
const WALK_AT_MOST: usize = 100_000;

/// The due schedules (at most `$1`), oldest fire first, each row-locked, skipping those another
/// replica holds; with the database's clock and whether the job of the last fire still lives.
/// Locks: `FOR UPDATE` on the returned schedule rows (only those: the subquery reads the live
/// job's row without a lock). The clock is read once, in a subquery, so it bounds the walk of
/// `etl_schedules_due_idx` (compared with `clock_timestamp()` itself, volatile, it would only
/// filter, and a look would read every unpaused schedule's entry).
pub const DUE_SQL: &str = "
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT s.owner_key, s.name, s.cron, s.time_zone, s.kind, s.args, s.queue, s.priority,
       s.max_attempts, s.missed, s.catch_up_limit, s.overlap, s.next_fire_at,
       (SELECT now FROM clock) AS now,
       EXISTS (SELECT FROM etl_job_records j WHERE j.id = s.last_job_id) AS overlapping
  FROM etl_schedules s
 WHERE NOT s.paused AND s.next_fire_at <= (SELECT now FROM clock)
 ORDER BY s.next_fire_at
 LIMIT $1
   FOR UPDATE OF s SKIP LOCKED";

/// Seconds until the earliest unpaused fire (negative when due), or NULL with none. Locks:
/// none; one probe of `etl_schedules_due_idx`.
pub const NEXT_DUE_SQL: &str = "
SELECT extract(epoch FROM min(next_fire_at) - clock_timestamp())::float8
  FROM etl_schedules WHERE NOT paused";

/// Moves schedule (`$1`, `$2`) past its evaluated fires: next fire `$3`, last fire `$4`, and
/// the last job `$5` when one was made. Locks: the row, already held by [`DUE_SQL`].
const ADVANCE_SQL: &str = "
UPDATE etl_schedules
   SET next_fire_at = $3, last_fire_at = $4, last_job_id = coalesce($5, last_job_id),
       updated_at = now()
 WHERE owner_key = $1::bytea AND name = $2::text";

/// Records fires of schedule (`$1`, `$2`): instants `$3`, jobs `$4`, outcomes `$5`, pairwise.
const RECORD_SQL: &str = "
INSERT INTO etl_schedule_fires (owner_key, name, fire_at, job_id, outcome)
SELECT $1::bytea, $2::text, f.fire_at, f.job_id, f.outcome
  FROM unnest($3::timestamptz[], $4::uuid[], $5::text[]) AS f(fire_at, job_id, outcome)
    ON CONFLICT DO NOTHING";

/// The key fire idempotency keys are digested under: fixed, since the worker holds no
/// deployment secret, and enough, since a key holds no secret (a schedule's name and an
/// instant). It only has to differ from any key a client's digest could match.
const FIRE_KEY: &[u8] = b"durable-etl: the fires of recurring schedules";

/// What one evaluation of a schedule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The fires that make a job, oldest first.
    pub enqueue: Vec<DateTime<Utc>>,
    /// The latest fire, recorded as `missed` or `overlapped` when it made no job.
    pub recorded: Option<(DateTime<Utc>, &'static str)>,
    /// The fire after the evaluated ones.
    pub next: DateTime<Utc>,
    /// The latest fire evaluated.
    pub last: DateTime<Utc>,
    /// The fires that made no job of their own (coalesced into another, missed or
    /// overlapped).
    pub without_job: u64,
    /// Whether the latest fire made no job because the previous one still lived.
    pub overlapped: bool,
}

/// What the schedule with expression `recurrence`, first due at `due`, does at `now` under
/// `missed` and `overlap` (`overlapping`: its last job still lives), or `None` if it never
/// fires again.
pub fn plan(
    recurrence: &Recurrence,
    due: DateTime<Utc>,
    now: DateTime<Utc>,
    (missed, overlap, overlapping): (Missed, Overlap, bool),
) -> Option<Plan> {
    let keep = match missed {
        Missed::CatchUp(n) => usize::from(n.clamp(1, CATCH_UP_MAX)),
        Missed::Coalesce | Missed::Skip => 1,
    };
    // The due fires: `due` and every one after it up to `now`, the latest `keep` kept.
    let mut latest = std::collections::VecDeque::with_capacity(keep);
    let (mut fire, mut count) = (due, 0u64);
    let next = loop {
        if latest.len() == keep {
            latest.pop_front();
        }
        latest.push_back(fire);
        count += 1;
        match recurrence.next_after(fire)? {
            after if after > now => break after,
            _ if count as usize >= WALK_AT_MOST => break recurrence.next_after(now)?,
            after => fire = after,
        }
    };
    let last = *latest.back()?;
    let mut enqueue: Vec<DateTime<Utc>> = latest.into_iter().collect();
    let (mut recorded, mut overlapped) = (None, false);
    if missed == Missed::Skip
        && (now - last)
            .to_std()
            .is_ok_and(|late| late > SKIP_LATER_THAN)
    {
        enqueue.clear();
        recorded = Some((last, "missed"));
    }
    if overlap == Overlap::Skip && !enqueue.is_empty() {
        if overlapping {
            enqueue.clear();
            recorded = Some((last, "overlapped"));
            overlapped = true;
        } else {
            // Every fire after the first would overlap the first's job.
            enqueue.drain(..enqueue.len() - 1);
        }
    }
    Some(Plan {
        without_job: count - enqueue.len() as u64,
        enqueue,
        recorded,
        next,
        last,
        overlapped,
    })
}

/// What one pass of [`fire_due`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fired {
    /// Schedules evaluated.
    pub schedules: u64,
    /// Jobs made (a replayed fire's job, made before, not counted).
    pub jobs: u64,
    /// Fires that made no job of their own, overlapped ones included.
    pub without_job: u64,
    /// Fires that made no job because the previous one still lived.
    pub overlapped: u64,
    /// The lateness of each fire that made a job (database clock minus fire instant).
    pub lateness: Vec<Duration>,
}

/// Fires the due schedules, at most [`DUE_BATCH`], in one transaction on `client` (see the
/// module's invariants).
///
/// # Errors
/// A database error (the transaction is rolled back: no fire is made or lost).
pub async fn fire_due(client: &mut Client) -> Result<Fired, Error> {
    let secret = Secret::new(FIRE_KEY).ok_or(Error::Internal)?;
    let tx = client.transaction().await?;
    let rows = tx.query(DUE_SQL, &[&DUE_BATCH]).await?;
    let mut fired = Fired::default();
    for row in &rows {
        fire_one(&tx, &secret, row, &mut fired).await?;
    }
    if fired.schedules > 0 {
        crash_point!("schedule.before_commit");
    }
    tx.commit().await?;
    if fired.schedules > 0 {
        crash_point!("schedule.after_commit");
    }
    Ok(fired)
}

/// Evaluates the schedule of [`DUE_SQL`] row `row` on `tx`, adding what it did to `fired`.
async fn fire_one(
    tx: &tokio_postgres::Transaction<'_>,
    secret: &Secret,
    row: &Row,
    fired: &mut Fired,
) -> Result<(), Error> {
    let owner: Vec<u8> = row.get(0);
    let name: &str = row.get(1);
    let now: DateTime<Utc> = row.get(13);
    let policy = (
        match (row.get::<_, &str>(9), row.get::<_, i32>(10)) {
            ("catch_up", n) => Missed::CatchUp(u16::try_from(n).unwrap_or(CATCH_UP_MAX)),
            ("skip", _) => Missed::Skip,
            _ => Missed::Coalesce,
        },
        match row.get::<_, &str>(11) {
            "skip" => Overlap::Skip,
            _ => Overlap::Allow,
        },
        row.get::<_, bool>(14),
    );
    // Stored only once validated: a row that no longer parses (a zone tzdata dropped) pauses.
    let plan = Recurrence::parse(row.get(2), row.get(3))
        .ok()
        .and_then(|r| plan(&r, row.get(12), now, policy));
    let Some(plan) = plan else {
        tracing::warn!(code = %Code::ScheduleInvalid, "a schedule that cannot fire again is paused");
        tx.execute(
            "UPDATE etl_schedules SET paused = true, updated_at = now()
              WHERE owner_key = $1::bytea AND name = $2::text",
            &[&owner, &name],
        )
        .await?;
        return Ok(());
    };
    let owner_key: [u8; 32] = owner.as_slice().try_into().map_err(|_| Error::Internal)?;
    let keys: Vec<String> = plan
        .enqueue
        .iter()
        .map(|fire| format!("schedule:{name}:{}", fire.to_rfc3339()))
        .collect();
    let args: serde_json::Value = row.get(5);
    let submissions = plan
        .enqueue
        .iter()
        .zip(&keys)
        .map(|(fire, key)| Submission {
            payload: args.clone(),
            idempotency_key: Some(key),
            max_attempts: row.get(8),
            run_at: Some(*fire),
            replaces: None,
            queue: Some(row.get(6)),
            priority: row.get(7),
            concurrency_key: None,
        })
        .collect();
    let made = enqueue::submit(tx, secret, &owner_key, row.get(4), submissions).await?;
    let mut instants: Vec<DateTime<Utc>> = plan.enqueue.clone();
    let mut jobs: Vec<Option<Uuid>> = made.iter().map(|e| Some(e.id)).collect();
    let mut outcomes: Vec<&str> = vec!["enqueued"; made.len()];
    if let Some((fire, outcome)) = plan.recorded {
        instants.push(fire);
        jobs.push(None);
        outcomes.push(outcome);
    }
    tx.execute(RECORD_SQL, &[&owner, &name, &instants, &jobs, &outcomes])
        .await?;
    let last_job = made.last().map(|e| e.id);
    tx.execute(
        ADVANCE_SQL,
        &[&owner, &name, &plan.next, &plan.last, &last_job],
    )
    .await?;
    fired.schedules += 1;
    // A replayed fire (its job made before) counts no new job.
    fired.jobs += made.iter().filter(|e| !e.replayed).count() as u64;
    fired.without_job += plan.without_job;
    fired.overlapped += u64::from(plan.overlapped);
    fired.lateness.extend(
        made.iter()
            .zip(&plan.enqueue)
            .filter(|(e, _)| !e.replayed)
            .map(|(_, fire)| (now - *fire).to_std().unwrap_or_default()),
    );
    Ok(())
}

/// The scheduler role: fires what is due, then sleeps until the next fire (by the database's
/// clock) or [`LOOK_AT_MOST_EVERY`], whichever is sooner, until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let wait = match once(&shared).await {
            Ok(Some(until_next)) => until_next.min(LOOK_AT_MOST_EVERY),
            Ok(None) => LOOK_AT_MOST_EVERY,
            Err(e) => {
                tracing::warn!(code = %e.code(), "firing schedules failed; trying again");
                LOOK_AT_MOST_EVERY
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Fires every due schedule, a batch a transaction; returns how long until the next fire.
async fn once(shared: &Shared) -> Result<Option<Duration>, Error> {
    let mut conn = db::checkout(&shared.pool).await?;
    loop {
        let fired = db::bounded(shared.statement_bound, fire_due(&mut conn)).await?;
        let missed = fired.without_job - fired.overlapped;
        shared
            .stats
            .record_schedules((fired.jobs, missed, fired.overlapped), &fired.lateness);
        if fired.schedules > 0 {
            tracing::debug!(
                schedules = fired.schedules,
                jobs = fired.jobs,
                without_job = fired.without_job,
                "fired schedules"
            );
        }
        if fired.schedules < DUE_BATCH as u64 {
            break;
        }
    }
    let until: Option<f64> = conn.query_one(NEXT_DUE_SQL, &[]).await?.get(0);
    Ok(until.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
