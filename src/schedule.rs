//! Recurring schedules: a job of a kind, made at each fire of a cron expression in an IANA time
//! zone, by whichever replica evaluates the schedule first ([`crate::worker`]'s scheduler), with
//! no leader.
//!
//! Invariants this module keeps:
//! - A schedule is owner-scoped (`(owner, name)`), like a job: [`Schedules`] acts only on its
//!   owner's, and one of another owner is indistinguishable from one that does not exist.
//! - What is stored was validated first: the expression and the zone parse
//!   ([`recurrence`]), the kind, queue, priority and attempt bound are those an enqueue admits;
//!   a refusal is a [`Rejection`] with `schedule_invalid` (or the enqueue's own code) and a
//!   pointer, and writes nothing.
//! - Writing a schedule never fires it and never moves a fire back: the next fire is the first
//!   after the database's clock, and is kept as it was unless the expression or the zone change.
//!   Declaring schedules ([`Schedules::declare`]) inserts or updates those named and never
//!   deletes another, so two releases declaring different sets both keep firing.
//! - A [`ScheduleSet`] (the schedules a release ships with) is declared in one transaction:
//!   every schedule it names is written, or, if one is refused, none is, and the refusal's
//!   pointer starts with that schedule's position in the set.

pub mod recurrence;

use crate::codes::Code;
use crate::error::Error;
use crate::intake::Rejection;
use crate::job::Job;
use crate::jobs::enqueue::MAX_ATTEMPTS_RANGE;
use crate::names::is_kind_name;
use crate::queue::{is_queue_name, PRIORITY_RANGE};
use chrono::{DateTime, Utc};
use recurrence::{Recurrence, RecurrenceError};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// What a schedule does with the fires no replica evaluated in time (every replica down, or
/// the schedule's row busy), when one next does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// One job for any number of missed fires, at the latest of them (the default).
    #[default]
    Coalesce,
    /// A job for each missed fire, the latest `n` at most (1 to 1,000); older ones make none.
    CatchUp(u16),
    /// No job for a fire more than [`SKIP_LATER_THAN`] late.
    Skip,
}

/// How late a fire may be evaluated and still make a job under [`Missed::Skip`].
pub const SKIP_LATER_THAN: std::time::Duration = std::time::Duration::from_secs(5);

/// The largest [`Missed::CatchUp`] bound.
pub const CATCH_UP_MAX: u16 = 1000;

/// What a schedule does at a fire while the job of its previous fire is still pending or running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Makes the job anyway (the default).
    #[default]
    Allow,
    /// Makes none: the fire is recorded as `overlapped`.
    Skip,
}

/// How a schedule's jobs are made; every field may be left out.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScheduleOptions<'a> {
    /// The IANA time zone its expression is read in; `None` is `UTC`.
    pub time_zone: Option<&'a str>,
    /// The queue its jobs wait in; `None` is the kind's [`Job::QUEUE`].
    pub queue: Option<&'a str>,
    /// Its jobs' priority; `None` is the kind's [`Job::PRIORITY`].
    pub priority: Option<i16>,
    /// Its jobs' attempt bound; `None` is the kind's [`Job::MAX_ATTEMPTS`].
    pub max_attempts: Option<i32>,
    /// What it does with missed fires.
    pub missed: Missed,
    /// What it does while its previous job still runs.
    pub overlap: Overlap,
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleInfo {
    /// Its name, unique per owner.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its IANA time zone.
    pub time_zone: String,
    /// The kind of the jobs it makes.
    pub kind: String,
    /// The queue they wait in.
    pub queue: String,
    /// Their priority.
    pub priority: i16,
    /// Their attempt bound.
    pub max_attempts: i32,
    /// Its missed-fire policy.
    pub missed: Missed,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// Whether it is paused (it then makes no job and misses no fire).
    pub paused: bool,
    /// Whether it was declared in code ([`Schedules::declare`]) rather than put at run time.
    pub declared: bool,
    /// Its next fire.
    pub next_fire_at: DateTime<Utc>,
    /// Its last fire evaluated, if any.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// The job its last fire made, if any.
    pub last_job_id: Option<Uuid>,
}

/// One fire of a schedule, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The fire instant (UTC).
    pub fire_at: DateTime<Utc>,
    /// When a replica fired it: the database's clock once its job was inserted, in the
    /// transaction that commits it (later than it was found due, so never before `fire_at`).
    /// Its lateness is `fired_at - fire_at`.
    pub fired_at: DateTime<Utc>,
    /// The job it made, if it made one.
    pub job_id: Option<Uuid>,
    /// `enqueued`, `missed` (too late under [`Missed::Skip`], or beyond a catch-up bound) or
    /// `overlapped` (under [`Overlap::Skip`]).
    pub outcome: String,
}

/// What a schedule makes, whatever its job's type: the kind, the arguments (`None` if they did
/// not serialize) and the kind's defaults.
#[derive(Debug, Clone)]
pub(crate) struct Makes {
    /// The kind ([`Job::KIND`]).
    pub(crate) kind: &'static str,
    /// The job's arguments, as JSON.
    pub(crate) args: Option<serde_json::Value>,
    /// The kind's queue ([`Job::QUEUE`]).
    pub(crate) queue: &'static str,
    /// The kind's priority ([`Job::PRIORITY`]).
    pub(crate) priority: i16,
    /// The kind's attempt bound ([`Job::MAX_ATTEMPTS`]).
    pub(crate) max_attempts: i32,
}

impl Makes {
    /// What a schedule of `job` makes.
    pub(crate) fn of<J: Job>(job: &J) -> Makes {
        Makes {
            kind: J::KIND,
            args: serde_json::to_value(job).ok(),
            queue: J::QUEUE,
            priority: J::PRIORITY,
            max_attempts: J::MAX_ATTEMPTS,
        }
    }
}

/// Creates, changes, pauses, resumes, deletes and reads the schedules of one owner.
#[derive(Debug, Clone)]
pub struct Schedules {
    /// The digest of the owner calls act for.
    owner: [u8; 32],
}

/// Inserts or replaces one schedule (`$1` owner … `$13` declared, `$14` its next fire if new or
/// if its expression or zone change). Locks: the schedule's row (a replica firing it holds it,
/// so a change waits for that fire's commit, and the fire it made stays made).
const PUT_SQL: &str = "
INSERT INTO etl_schedules AS s
       (owner_key, name, cron, time_zone, kind, args, queue, priority, max_attempts, missed,
        catch_up_limit, overlap, declared, next_fire_at)
VALUES ($1::bytea, $2::text, $3, $4, $5::text, $6, $7::text, $8::int2, $9::int4, $10, $11, $12, $13,
        $14)
ON CONFLICT (owner_key, name) DO UPDATE
   SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, kind = EXCLUDED.kind,
       args = EXCLUDED.args, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
       max_attempts = EXCLUDED.max_attempts, missed = EXCLUDED.missed,
       catch_up_limit = EXCLUDED.catch_up_limit, overlap = EXCLUDED.overlap,
       declared = EXCLUDED.declared,
       next_fire_at = CASE WHEN (s.cron, s.time_zone) = (EXCLUDED.cron, EXCLUDED.time_zone)
                           THEN s.next_fire_at ELSE EXCLUDED.next_fire_at END,
       updated_at = now()";

/// The columns of a [`ScheduleInfo`], in [`info_of`] order.
const INFO_COLUMNS: &str = "name, cron, time_zone, kind, queue, priority, max_attempts, missed, \
     catch_up_limit, overlap, paused, declared, next_fire_at, last_fire_at, last_job_id";

impl Schedules {
    /// The schedules of the owner whose digest `owner` is (a [`crate::Jobs`] handle's,
    /// [`crate::Jobs::schedules`]).
    pub(crate) fn of(owner: [u8; 32]) -> Schedules {
        Schedules { owner }
    }

    /// Creates schedule `name` (1 to 63 characters, as a kind's name), or replaces its
    /// definition: at each fire of `cron` in the options' time zone it enqueues `job` (its
    /// arguments, serialized once now). Its next fire is the first after the database's clock,
    /// and stays as it was when only other fields change.
    ///
    /// # Errors
    /// [`Error::Rejected`] with `schedule_invalid` (a bad name, expression, zone or catch-up
    /// bound; the pointer names which), or the enqueue's own codes for the queue, priority and
    /// attempt bound; a database error.
    pub async fn put<J: Job>(
        &self,
        client: &impl GenericClient,
        name: &str,
        cron: &str,
        job: &J,
        options: ScheduleOptions<'_>,
    ) -> Result<ScheduleInfo, Error> {
        self.write(client, name, cron, &Makes::of(job), options, false)
            .await
    }

    /// [`Schedules::put`] for a schedule the application declares in its code at start-up:
    /// the same, marked `declared`. Declaring never deletes a schedule the code does not name,
    /// so a rolling deploy of two versions keeps both versions' schedules firing, each fire once.
    ///
    /// # Errors
    /// As [`Schedules::put`].
    pub async fn declare<J: Job>(
        &self,
        client: &impl GenericClient,
        name: &str,
        cron: &str,
        job: &J,
        options: ScheduleOptions<'_>,
    ) -> Result<ScheduleInfo, Error> {
        self.write(client, name, cron, &Makes::of(job), options, true)
            .await
    }

    /// Validates and stores one schedule of a job of any type, erased to what it `makes`,
    /// declared in code (`declared`) or put at run time (see [`Schedules::put`]).
    pub(crate) async fn write(
        &self,
        client: &impl GenericClient,
        name: &str,
        cron: &str,
        makes: &Makes,
        options: ScheduleOptions<'_>,
        declared: bool,
    ) -> Result<ScheduleInfo, Error> {
        let invalid = |pointer: &str| Error::from(Rejection::new(Code::ScheduleInvalid, pointer));
        if !is_kind_name(name) {
            return Err(invalid("/name"));
        }
        let time_zone = options.time_zone.unwrap_or("UTC");
        let recurrence = Recurrence::parse(cron, time_zone).map_err(|e| match e {
            RecurrenceError::TimeZone => invalid("/time_zone"),
            RecurrenceError::Cron | RecurrenceError::Never => invalid("/cron"),
        })?;
        let queue = options.queue.unwrap_or(makes.queue);
        if !is_queue_name(queue) {
            return Err(invalid("/queue"));
        }
        let priority = options.priority.unwrap_or(makes.priority);
        if !PRIORITY_RANGE.contains(&priority) {
            return Err(invalid("/priority"));
        }
        let max_attempts = options.max_attempts.unwrap_or(makes.max_attempts);
        if !MAX_ATTEMPTS_RANGE.contains(&max_attempts) {
            return Err(invalid("/max_attempts"));
        }
        let (missed, catch_up) = match options.missed {
            Missed::Coalesce => ("coalesce", 0),
            Missed::CatchUp(n) if (1..=CATCH_UP_MAX).contains(&n) => ("catch_up", i32::from(n)),
            Missed::CatchUp(_) => return Err(invalid("/missed")),
            Missed::Skip => ("skip", 0),
        };
        let overlap = match options.overlap {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
        };
        let args = (makes.args.as_ref())
            .ok_or_else(|| Error::from(Rejection::new(Code::InvalidPayload, "")))?;
        let now: DateTime<Utc> = client
            .query_one("SELECT clock_timestamp()", &[])
            .await?
            .get(0);
        let next = recurrence.next_after(now).ok_or_else(|| invalid("/cron"))?;
        client
            .execute(
                PUT_SQL,
                &[
                    &&self.owner[..],
                    &name,
                    &cron,
                    &time_zone,
                    &makes.kind,
                    args,
                    &queue,
                    &priority,
                    &max_attempts,
                    &missed,
                    &catch_up,
                    &overlap,
                    &declared,
                    &next,
                ],
            )
            .await?;
        self.get(client, name).await?.ok_or(Error::Internal)
    }

    /// Schedule `name`, if this owner has one.
    ///
    /// # Errors
    /// A database error.
    pub async fn get(
        &self,
        client: &impl GenericClient,
        name: &str,
    ) -> Result<Option<ScheduleInfo>, Error> {
        // A name no schedule can have is not looked up (nor sent to the database).
        if !is_kind_name(name) {
            return Ok(None);
        }
        let sql =
            format!("SELECT {INFO_COLUMNS} FROM etl_schedules WHERE owner_key = $1::bytea AND name = $2::text");
        let row = client.query_opt(&sql, &[&&self.owner[..], &name]).await?;
        Ok(row.as_ref().map(info_of))
    }

    /// This owner's schedules, by name.
    ///
    /// # Errors
    /// A database error.
    pub async fn list(&self, client: &impl GenericClient) -> Result<Vec<ScheduleInfo>, Error> {
        let sql = format!(
            "SELECT {INFO_COLUMNS} FROM etl_schedules WHERE owner_key = $1::bytea ORDER BY name"
        );
        let rows = client.query(&sql, &[&&self.owner[..]]).await?;
        Ok(rows.iter().map(info_of).collect())
    }

    /// Pauses schedule `name`: it makes no job until resumed, and the fires it passes while
    /// paused are not missed. Returns whether this owner has it.
    ///
    /// # Errors
    /// A database error.
    pub async fn pause(&self, client: &impl GenericClient, name: &str) -> Result<bool, Error> {
        if !is_kind_name(name) {
            return Ok(false);
        }
        let changed = client
            .execute(
                "UPDATE etl_schedules SET paused = true, updated_at = now()
                  WHERE owner_key = $1::bytea AND name = $2::text",
                &[&&self.owner[..], &name],
            )
            .await?;
        Ok(changed == 1)
    }

    /// Resumes schedule `name`: its next fire is the first after the database's clock (the
    /// fires it passed while paused make no job). Returns whether this owner has it.
    ///
    /// # Errors
    /// A database error.
    pub async fn resume(&self, client: &impl GenericClient, name: &str) -> Result<bool, Error> {
        let Some(info) = self.get(client, name).await? else {
            return Ok(false);
        };
        if !info.paused {
            return Ok(true);
        }
        let recurrence = Recurrence::parse(&info.cron, &info.time_zone)
            .map_err(|_| Error::from(Rejection::new(Code::ScheduleInvalid, "/cron")))?;
        let now: DateTime<Utc> = client
            .query_one("SELECT clock_timestamp()", &[])
            .await?
            .get(0);
        let next = recurrence.next_after(now).ok_or(Error::Internal)?;
        let changed = client
            .execute(
                "UPDATE etl_schedules SET paused = false, next_fire_at = $3, updated_at = now()
                  WHERE owner_key = $1::bytea AND name = $2::text AND paused",
                &[&&self.owner[..], &name, &next],
            )
            .await?;
        // Resumed meanwhile by another call: resumed all the same.
        Ok(changed <= 1)
    }

    /// Deletes schedule `name` and its fire records; the jobs it made stay. Returns whether
    /// this owner had it.
    ///
    /// # Errors
    /// A database error.
    pub async fn delete(&self, client: &impl GenericClient, name: &str) -> Result<bool, Error> {
        if !is_kind_name(name) {
            return Ok(false);
        }
        let deleted = client
            .query_one(
                "WITH gone AS (
                     DELETE FROM etl_schedules WHERE owner_key = $1::bytea AND name = $2::text RETURNING name
                 ), fires AS (
                     DELETE FROM etl_schedule_fires
                      WHERE owner_key = $1::bytea AND name = $2::text AND EXISTS (SELECT FROM gone)
                 )
                 SELECT count(*) FROM gone",
                &[&&self.owner[..], &name],
            )
            .await?
            .get::<_, i64>(0);
        Ok(deleted == 1)
    }

    /// The latest `limit` fires of schedule `name`, newest first.
    ///
    /// # Errors
    /// A database error.
    pub async fn fires(
        &self,
        client: &impl GenericClient,
        name: &str,
        limit: i64,
    ) -> Result<Vec<Fire>, Error> {
        if !is_kind_name(name) {
            return Ok(Vec::new());
        }
        let rows = client
            .query(
                "SELECT fire_at, fired_at, job_id, outcome FROM etl_schedule_fires
                  WHERE owner_key = $1::bytea AND name = $2::text ORDER BY fire_at DESC LIMIT $3",
                &[&&self.owner[..], &name, &limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Fire {
                fire_at: r.get(0),
                fired_at: r.get(1),
                job_id: r.get(2),
                outcome: r.get(3),
            })
            .collect())
    }
}

/// The [`ScheduleInfo`] of a row of [`INFO_COLUMNS`].
fn info_of(row: &Row) -> ScheduleInfo {
    let catch_up: i32 = row.get(8);
    ScheduleInfo {
        name: row.get(0),
        cron: row.get(1),
        time_zone: row.get(2),
        kind: row.get(3),
        queue: row.get(4),
        priority: row.get(5),
        max_attempts: row.get(6),
        missed: match row.get::<_, &str>(7) {
            "catch_up" => Missed::CatchUp(u16::try_from(catch_up).unwrap_or(CATCH_UP_MAX)),
            "skip" => Missed::Skip,
            _ => Missed::Coalesce,
        },
        overlap: match row.get::<_, &str>(9) {
            "skip" => Overlap::Skip,
            _ => Overlap::Allow,
        },
        paused: row.get(10),
        declared: row.get(11),
        next_fire_at: row.get(12),
        last_fire_at: row.get(13),
        last_job_id: row.get(14),
    }
}

/// The schedules of one owner that an application declares in its code, built once and declared
/// at start-up, before [`crate::Worker::start`]:
///
/// ```no_run
/// # use durable_etl::{Job, Jobs};
/// # use durable_etl::schedule::{ScheduleOptions, ScheduleSet};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Report;
/// # impl Job for Report { const KIND: &'static str = "report"; }
/// # async fn start(jobs: Jobs, client: &mut tokio_postgres::Client) -> Result<(), durable_etl::Error> {
/// ScheduleSet::new()
///     .schedule("nightly_report", "30 1 * * *", &Report, ScheduleOptions {
///         time_zone: Some("America/New_York"),
///         ..ScheduleOptions::default()
///     })
///     .schedule("hourly_report", "@hourly", &Report, ScheduleOptions::default())
///     .declare(client, &jobs.schedules())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScheduleSet {
    /// The schedules, in the order they were added.
    entries: Vec<Entry>,
}

/// One schedule of a [`ScheduleSet`], its options owned.
#[derive(Debug, Clone)]
struct Entry {
    /// Its name.
    name: String,
    /// Its cron expression.
    cron: String,
    /// What it makes.
    makes: Makes,
    /// [`ScheduleOptions::time_zone`].
    time_zone: Option<String>,
    /// [`ScheduleOptions::queue`].
    queue: Option<String>,
    /// [`ScheduleOptions::priority`].
    priority: Option<i16>,
    /// [`ScheduleOptions::max_attempts`].
    max_attempts: Option<i32>,
    /// [`ScheduleOptions::missed`].
    missed: Missed,
    /// [`ScheduleOptions::overlap`].
    overlap: Overlap,
}

impl ScheduleSet {
    /// An empty set.
    pub fn new() -> ScheduleSet {
        ScheduleSet::default()
    }

    /// The set with schedule `name` added: at each fire of `cron` it enqueues `job` (its
    /// arguments, serialized now), as [`Schedules::declare`] would. Nothing is checked until the
    /// set is declared.
    #[must_use]
    pub fn schedule<J: Job>(
        mut self,
        name: &str,
        cron: &str,
        job: &J,
        options: ScheduleOptions<'_>,
    ) -> ScheduleSet {
        self.entries.push(Entry {
            name: name.to_owned(),
            cron: cron.to_owned(),
            makes: Makes::of(job),
            time_zone: options.time_zone.map(str::to_owned),
            queue: options.queue.map(str::to_owned),
            priority: options.priority,
            max_attempts: options.max_attempts,
            missed: options.missed,
            overlap: options.overlap,
        });
        self
    }

    /// How many schedules the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set holds no schedule.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Declares every schedule of the set for `schedules`' owner, in one transaction on
    /// `client`; returns them as stored, in the set's order.
    ///
    /// # Errors
    /// The first refusal ([`Schedules::put`]'s: `schedule_invalid` with its pointer, or the
    /// enqueue's own codes), its pointer prefixed with the schedule's position (`/2/cron`);
    /// nothing of the set is written then. Database errors, likewise.
    pub async fn declare(
        &self,
        client: &mut tokio_postgres::Client,
        schedules: &Schedules,
    ) -> Result<Vec<ScheduleInfo>, Error> {
        let tx = client.transaction().await?;
        let mut stored = Vec::with_capacity(self.entries.len());
        for (i, e) in self.entries.iter().enumerate() {
            let options = ScheduleOptions {
                time_zone: e.time_zone.as_deref(),
                queue: e.queue.as_deref(),
                priority: e.priority,
                max_attempts: e.max_attempts,
                missed: e.missed,
                overlap: e.overlap,
            };
            let info = schedules
                .write(&tx, &e.name, &e.cron, &e.makes, options, true)
                .await
                .map_err(|error| match error {
                    Error::Rejected(mut refusal) => {
                        refusal.pointer = format!("/{i}{}", refusal.pointer);
                        Error::Rejected(refusal)
                    }
                    other => other,
                })?;
            stored.push(info);
        }
        tx.commit().await?;
        Ok(stored)
    }
}
