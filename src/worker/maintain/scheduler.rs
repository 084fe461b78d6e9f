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
//! - A tick with nothing due costs one statement, one probe of `etl_schedules_due_idx`
//!   ([`NEXT_DUE_SQL`]), however many schedules there are; a batch of due schedules costs the
//!   same six statements (begin, take, one insert per owner and kind, record, advance, commit)
//!   whatever its size.

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
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};
use tokio_util::sync::CancellationToken;

/// The most schedules one transaction fires. A batch costs the same statements whatever its
/// size, so a larger one fires a crowded second sooner (`bench schedules`, 1,000 schedules each
/// second on 3 replicas: fire-to-insert p99 about 120 ms at 64 and at 128, under 100 ms at
/// 256), while each transaction still holds its rows for tens of milliseconds only.
pub const DUE_BATCH: i64 = 256;

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

/// Moves each evaluated schedule (owner `$1`, name `$2`, pairwise) past its fires: next fire
/// `$3`, last fire `$4`, and the last job `$5` when one was made. Locks: the rows, already held
/// by [`DUE_SQL`].
const ADVANCE_SQL: &str = "
UPDATE etl_schedules s
   SET next_fire_at = a.next, last_fire_at = a.last, last_job_id = coalesce(a.job, s.last_job_id),
       updated_at = now()
  FROM unnest($1::bytea[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::uuid[])
       AS a(owner_key, name, next, last, job)
 WHERE s.owner_key = a.owner_key AND s.name = a.name";

/// Records fires (owner `$1`, schedule `$2`, instant `$3`, job `$4`, outcome `$5`, pairwise),
/// with the database's clock now, once their jobs are inserted, as when they were fired: later
/// than [`DUE_SQL`] found them due, so never before their instant. Returns that clock. Locks:
/// the new rows only.
const RECORD_SQL: &str = "
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS at),
recorded AS (
    INSERT INTO etl_schedule_fires (owner_key, name, fire_at, job_id, outcome, fired_at)
    SELECT f.*, clock.at
      FROM unnest($1::bytea[], $2::text[], $3::timestamptz[], $4::uuid[], $5::text[]) AS f,
           clock
        ON CONFLICT DO NOTHING
)
SELECT at FROM clock";

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

/// Fires that made no job of their own, not overlapped, by their schedule's missed-fire policy:
/// coalesced into a later fire, beyond a catch-up bound, or too late under `skip`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MissedFires {
    /// Of schedules under [`Missed::Coalesce`].
    pub coalesce: u64,
    /// Of schedules under [`Missed::CatchUp`].
    pub catch_up: u64,
    /// Of schedules under [`Missed::Skip`].
    pub skip: u64,
}

impl MissedFires {
    /// Counts `n` fires of a schedule under `policy`.
    fn add(&mut self, policy: Missed, n: u64) {
        match policy {
            Missed::Coalesce => self.coalesce += n,
            Missed::CatchUp(_) => self.catch_up += n,
            Missed::Skip => self.skip += n,
        }
    }
}

/// What one pass of [`fire_due`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fired {
    /// Schedules taken: evaluated, or paused because they cannot fire again.
    pub schedules: u64,
    /// Jobs made (a replayed fire's job, made before, not counted).
    pub jobs: u64,
    /// Fires that made no job of their own, overlapped ones included.
    pub without_job: u64,
    /// The fires of [`Fired::without_job`] that were not overlapped, by the schedule's
    /// missed-fire policy.
    pub missed: MissedFires,
    /// Fires that made no job because the previous one still lived.
    pub overlapped: u64,
    /// The lateness of each fire that made a job: the database's clock once its job was
    /// inserted, minus its instant.
    pub lateness: Vec<Duration>,
}

/// Fires the due schedules, at most [`DUE_BATCH`], in one transaction on `client` (see the
/// module's invariants): one statement takes them, one insert per owner and kind makes their
/// jobs, one records their fires and one moves them on, however many there are.
///
/// # Errors
/// A database error (the transaction is rolled back: no fire is made or lost).
pub async fn fire_due(client: &mut Client) -> Result<Fired, Error> {
    let secret = Secret::new(FIRE_KEY).ok_or(Error::Internal)?;
    let tx = client.transaction().await?;
    let rows = tx.query(DUE_SQL, &[&DUE_BATCH]).await?;
    let (mut writes, mut paused) = (Writes::default(), 0);
    for row in &rows {
        match Evaluated::of(row) {
            Some(evaluated) => writes.evaluated.push(evaluated),
            None => {
                pause_invalid(&tx, row).await?;
                paused += 1;
            }
        }
    }
    let mut fired = writes.commit_to(&tx, &secret).await?;
    fired.schedules += paused;
    if !rows.is_empty() {
        crash_point!("schedule.before_commit");
    }
    tx.commit().await?;
    if !rows.is_empty() {
        crash_point!("schedule.after_commit");
    }
    Ok(fired)
}

/// Pauses the schedule of [`DUE_SQL`] row `row`, which cannot fire again: it was stored only
/// once validated, so its expression or zone no longer parse (a zone tzdata dropped), or it has
/// no fire left.
async fn pause_invalid(tx: &tokio_postgres::Transaction<'_>, row: &Row) -> Result<(), Error> {
    tracing::warn!(code = %Code::ScheduleInvalid, "a schedule that cannot fire again is paused");
    tx.execute(
        "UPDATE etl_schedules SET paused = true, updated_at = now()
          WHERE owner_key = $1::bytea AND name = $2::text",
        &[&row.get::<_, &[u8]>(0), &row.get::<_, &str>(1)],
    )
    .await?;
    Ok(())
}

/// One due schedule, evaluated: what its fires make.
struct Evaluated<'r> {
    /// Its owner's digest.
    owner: [u8; 32],
    /// Its name.
    name: &'r str,
    /// The kind of its jobs.
    kind: &'r str,
    /// Its jobs' arguments.
    args: serde_json::Value,
    /// Its jobs' queue.
    queue: &'r str,
    /// Its jobs' priority.
    priority: i16,
    /// Its jobs' attempt bound.
    max_attempts: i32,
    /// Its missed-fire policy.
    missed: Missed,
    /// What its evaluation does.
    plan: Plan,
}

impl<'r> Evaluated<'r> {
    /// The evaluation of [`DUE_SQL`] row `row`, or `None` if it cannot fire again.
    fn of(row: &'r Row) -> Option<Evaluated<'r>> {
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
        let now: DateTime<Utc> = row.get(13);
        let recurrence = Recurrence::parse(row.get(2), row.get(3)).ok()?;
        Some(Evaluated {
            owner: row.get::<_, &[u8]>(0).try_into().ok()?,
            name: row.get(1),
            kind: row.get(4),
            args: row.get(5),
            queue: row.get(6),
            priority: row.get(7),
            max_attempts: row.get(8),
            missed: policy.0,
            plan: plan(&recurrence, row.get(12), now, policy)?,
        })
    }

    /// The idempotency key of this schedule's fire at `fire`.
    fn key(&self, fire: DateTime<Utc>) -> String {
        format!("schedule:{}:{}", self.name, fire.to_rfc3339())
    }
}

/// The schedules whose jobs one enqueue makes: of one owner (its digest) and one kind.
type Group<'a> = (&'a [u8; 32], &'a str);

/// The writes of one transaction's evaluated schedules, made together.
#[derive(Default)]
struct Writes<'r> {
    /// The schedules, in the order they were taken.
    evaluated: Vec<Evaluated<'r>>,
}

impl Writes<'_> {
    /// Makes the jobs of every evaluated schedule (one enqueue per owner and kind), records
    /// their fires and moves the schedules on, on `tx`; returns what that did.
    async fn commit_to(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        secret: &Secret,
    ) -> Result<Fired, Error> {
        let mut fired = Fired::default();
        if self.evaluated.is_empty() {
            return Ok(fired);
        }
        let jobs = self.enqueue(tx, secret).await?;
        let (mut owners, mut names, mut instants, mut job_ids, mut outcomes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut next, mut last, mut last_jobs) = (Vec::new(), Vec::new(), Vec::new());
        let mut made_at = Vec::new();
        for (e, made) in self.evaluated.iter().zip(&jobs) {
            let recorded = e
                .plan
                .recorded
                .iter()
                .map(|&(fire, outcome)| (fire, None, outcome));
            let enqueued = (e.plan.enqueue.iter().zip(made))
                .map(|(&fire, job)| (fire, Some(job.id), "enqueued"));
            for (fire, job, outcome) in enqueued.chain(recorded) {
                owners.push(&e.owner[..]);
                names.push(e.name);
                instants.push(fire);
                job_ids.push(job);
                outcomes.push(outcome);
            }
            next.push(e.plan.next);
            last.push(e.plan.last);
            last_jobs.push(made.last().map(|job| job.id));
            fired.schedules += 1;
            // A replayed fire (its job made before) counts no new job.
            fired.jobs += made.iter().filter(|job| !job.replayed).count() as u64;
            fired.without_job += e.plan.without_job;
            fired.overlapped += u64::from(e.plan.overlapped);
            (fired.missed).add(e.missed, e.plan.without_job - u64::from(e.plan.overlapped));
            made_at.extend(
                (made.iter().zip(&e.plan.enqueue))
                    .filter(|(job, _)| !job.replayed)
                    .map(|(_, &fire)| fire),
            );
        }
        let record = [
            &owners as &(dyn ToSql + Sync),
            &names,
            &instants,
            &job_ids,
            &outcomes,
        ];
        let clock: DateTime<Utc> = tx.query_one(RECORD_SQL, &record).await?.get(0);
        fired.lateness = (made_at.iter())
            .map(|&fire| (clock - fire).to_std().unwrap_or_default())
            .collect();
        let taken: (Vec<&[u8]>, Vec<&str>) = self
            .evaluated
            .iter()
            .map(|e| (&e.owner[..], e.name))
            .unzip();
        tx.execute(ADVANCE_SQL, &[&taken.0, &taken.1, &next, &last, &last_jobs])
            .await?;
        Ok(fired)
    }

    /// Enqueues the fires' jobs, one enqueue per owner and kind, each dated at its fire and
    /// keyed by (schedule, fire); returns each schedule's jobs, in its fires' order.
    async fn enqueue(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        secret: &Secret,
    ) -> Result<Vec<Vec<enqueue::Enqueued>>, Error> {
        let keys: Vec<Vec<String>> = (self.evaluated.iter())
            .map(|e| e.plan.enqueue.iter().map(|&fire| e.key(fire)).collect())
            .collect();
        let mut groups: Vec<(Group<'_>, Vec<usize>)> = Vec::new();
        for (i, e) in self.evaluated.iter().enumerate() {
            let group = (&e.owner, e.kind);
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, members)) => members.push(i),
                None => groups.push((group, vec![i])),
            }
        }
        let mut jobs: Vec<Vec<enqueue::Enqueued>> = vec![Vec::new(); self.evaluated.len()];
        for ((owner, kind), members) in groups {
            let submissions = members
                .iter()
                .flat_map(|&i| {
                    let e = &self.evaluated[i];
                    (e.plan.enqueue.iter().zip(&keys[i])).map(|(&fire, key)| Submission {
                        payload: e.args.clone(),
                        idempotency_key: Some(key),
                        max_attempts: e.max_attempts,
                        run_at: Some(fire),
                        dated: true,
                        retain: None,
                        replaces: None,
                        queue: Some(e.queue),
                        priority: e.priority,
                        concurrency_key: None,
                    })
                })
                .collect();
            let mut made = enqueue::submit(tx, secret, owner, kind, submissions)
                .await?
                .into_iter();
            for &i in &members {
                jobs[i] = made
                    .by_ref()
                    .take(self.evaluated[i].plan.enqueue.len())
                    .collect();
            }
        }
        Ok(jobs)
    }
}

/// How long the role waits before looking again when every due schedule is held by another
/// replica (firing it: once it commits, none is due).
const HELD_BACK_OFF: Duration = Duration::from_millis(20);

/// The scheduler role: probes when the next fire is (by the database's clock), sleeps until
/// then or [`LOOK_AT_MOST_EVERY`], whichever is sooner, and fires what is due, until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let wait = once(&shared).await.unwrap_or_else(|e| {
            tracing::warn!(code = %e.code(), "firing schedules failed; trying again");
            LOOK_AT_MOST_EVERY
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One tick: one probe of the next fire ([`NEXT_DUE_SQL`]) and, if one is due, every due
/// schedule fired, a batch a transaction; returns how long to wait before the next tick.
async fn once(shared: &Shared) -> Result<Duration, Error> {
    let mut conn = db::checkout(&shared.pool).await?;
    let until: Option<f64> = conn.query_one(NEXT_DUE_SQL, &[]).await?.get(0);
    match until {
        None => return Ok(LOOK_AT_MOST_EVERY),
        Some(s) if s > 0.0 => return Ok(Duration::from_secs_f64(s).min(LOOK_AT_MOST_EVERY)),
        Some(_) => {}
    }
    let mut any = false;
    loop {
        let fired = db::bounded(shared.statement_bound, fire_due(&mut conn)).await?;
        let missed = [
            fired.missed.coalesce,
            fired.missed.catch_up,
            fired.missed.skip,
        ];
        shared
            .stats
            .record_schedules((fired.jobs, missed, fired.overlapped), &fired.lateness);
        if fired.schedules > 0 {
            any = true;
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
    // Having fired, probe again at once; having found every due schedule held, let its holder
    // commit first.
    Ok(if any { Duration::ZERO } else { HELD_BACK_OFF })
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
