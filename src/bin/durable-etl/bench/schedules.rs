//! `bench schedules`: what recurring schedules cost the replicas' scheduler role
//! (`durable_etl::worker`'s, see [`durable_etl::schedule`]), in three windows of one run, every
//! figure read from the database.
//!
//! 1. **Baseline**: the replicas idle with no schedule, for `idle_s`: the transactions the
//!    replicas' other roles commit per second, and the scheduler's probes of an empty table.
//! 2. **Idle**: `idle_schedules` schedules none of which is due ([`IDLE_CRON`], yearly), for
//!    `idle_s`: the scans of `etl_schedules` per replica per second (one scheduler tick a second
//!    when nothing is due), and the rows they read.
//! 3. **Lateness**: `schedules` more schedules firing every second ([`EVERY_SECOND`], UTC) whose
//!    jobs go to [`SCHEDULE_QUEUE`], a queue no replica serves, so the replicas do nothing else;
//!    after [`LATENESS_SETTLE`] whole seconds, the fires of the next `duration_s` whole seconds
//!    are the window: their lateness (`fired_at − fire_at`), how many the window expected and got,
//!    and, over the same seconds, transactions and rows per fire.
//!
//! Invariants this module keeps:
//! - Each kind of schedule is put once through the library's API (`Schedules::put`, so its row
//!   is what the product stores) and copied by one statement under other names, same next fire:
//!   the set-up sends no statement per schedule, and is done on a session of its own that is
//!   closed, its statistics flushed, before the next window's first read.
//! - The schedules catch up (`Missed::CatchUp`) rather than coalesce: a late fire still makes
//!   its job and its row, so the lateness counts every fire of the window, and a fire without a
//!   row is a miss, not a late fire hidden by a later one.
//! - The server's statistics lag: a backend sends its counts at a transaction's end at most once
//!   a second, and an idle one up to 10 s later (PostgreSQL 15). So every window is read at both
//!   ends while the replicas do the same thing (never across a change of schedules: a window
//!   begins [`SETTLE`] after one), and the fires per window are counted by the same statistics
//!   (`n_tup_ins` of `etl_schedule_fires`) as the transactions and rows they divide: whatever is
//!   still pending at one end is, on average, pending at the other.
//! - Transactions per fire subtract the baseline's rate over the window's length: what the
//!   replicas would have committed without a fire. Nothing else touches the database during a
//!   window (the bench reads its statistics at the ends only; the replicas' metrics, whose scrape
//!   queries the database, are not read; the replicas' CPU comes from `/proc`).
//! - The table is analyzed after each set-up, as autovacuum soon would: a window measures the
//!   plans of a table of that size, not those of a table the planner has never seen (whose due
//!   read scans every row).
//! - Every wait is bounded ([`WAIT_LIMIT`]).

use super::config::{BenchConfig, Mode, WAIT_LIMIT};
use super::load::{bench_owner, NoopJob, BENCH_PRINCIPAL};
use super::percentiles::Percentiles;
use super::replicas::Replicas;
use chrono::{DateTime, Utc};
use durable_etl::config::DatabaseConfig;
use durable_etl::db;
use durable_etl::error::Error;
use durable_etl::schedule::{Missed, ScheduleOptions, CATCH_UP_MAX};
use durable_etl::Jobs;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// The expression of the schedules that fire: every second (6 fields, seconds first).
pub(crate) const EVERY_SECOND: &str = "* * * * * *";

/// The expression of the idle schedules: once a year, midnight of 1 January (UTC).
pub(crate) const IDLE_CRON: &str = "0 0 1 1 *";

/// The queue the fires' jobs go to: no replica serves it, so they stay pending and the replicas
/// run nothing but the scheduler.
pub(crate) const SCHEDULE_QUEUE: &str = "bench_schedules";

/// Name prefixes of the firing and idle schedules (`fire_0`, `fire_1`, …).
const FIRE_PREFIX: &str = "fire_";
/// See [`FIRE_PREFIX`].
const IDLE_PREFIX: &str = "idle_";

/// How long after the replicas start, or the schedules change, a window's first read waits: the
/// set-up session's statistics and the replicas' first ticks are behind it.
const SETTLE: Duration = Duration::from_secs(2);

/// Whole seconds of fires between the first fire and the lateness window: the first fires'
/// plans, caches and the pool's sessions warm.
const LATENESS_SETTLE: i64 = 3;

/// How far into a second the lateness window's statistics are read: not at the instant every
/// schedule fires, but when the second's fires are usually done.
const READ_INTO_SECOND: Duration = Duration::from_millis(500);

/// The set-up session's role (its backend is waited out before a window begins).
const SETUP_ROLE: &str = "bench-setup";

/// The tables whose rows a fire writes.
const TABLES: [&str; 4] = [
    "etl_schedules",
    "etl_schedule_fires",
    "etl_job_records",
    "etl_job_intake",
];

/// Copies schedule (`$1` owner, `$2` name) as `$3 || g` for g in 1 ..= `$4`, same definition
/// and next fire. Locks: inserts new rows only.
const COPY_SQL: &str = "
INSERT INTO etl_schedules
       (owner_key, name, cron, time_zone, kind, args, queue, priority, max_attempts, missed,
        catch_up_limit, overlap, paused, declared, next_fire_at)
SELECT s.owner_key, $3::text || g, s.cron, s.time_zone, s.kind, s.args, s.queue, s.priority,
       s.max_attempts, s.missed, s.catch_up_limit, s.overlap, s.paused, s.declared,
       s.next_fire_at
  FROM etl_schedules s, generate_series(1, $4::int8) AS g
 WHERE s.owner_key = $1::bytea AND s.name = $2::text";

/// The counters of the statistics views, one row per table of [`TABLES`] (`$1`), each with the
/// database's commits and the clock. Locks: none.
const COUNTERS_SQL: &str = "
SELECT t.relname::text, t.n_tup_ins, t.n_tup_upd, coalesce(t.seq_scan, 0),
       coalesce(t.seq_tup_read, 0), coalesce(i.due, 0)::int8, coalesce(i.key, 0)::int8,
       coalesce(i.read, 0)::int8, d.xact_commit, extract(epoch FROM clock_timestamp())::float8
  FROM pg_stat_user_tables t
 CROSS JOIN (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) d
  LEFT JOIN (SELECT relid,
                    sum(idx_scan) FILTER (WHERE indexrelname = 'etl_schedules_due_idx') AS due,
                    sum(idx_scan) FILTER (WHERE indexrelname = 'etl_schedules_pkey') AS key,
                    sum(idx_tup_read) AS read
               FROM pg_stat_user_indexes GROUP BY relid) i ON i.relid = t.relid
 WHERE t.relname = ANY($1)";

/// The fires of the window (`$1` owner, from `$2` to before `$3`) of the firing schedules:
/// lateness in milliseconds, outcome, job, firing transaction, and whether the job exists.
const FIRES_SQL: &str = "
SELECT extract(epoch FROM f.fired_at - f.fire_at)::float8 * 1000, f.outcome, f.job_id::text,
       f.xmin::text, EXISTS (SELECT FROM etl_job_intake i WHERE i.id = f.job_id)
  FROM etl_schedule_fires f
 WHERE f.owner_key = $1::bytea AND left(f.name, 5) = 'fire_'
   AND f.fire_at >= $2 AND f.fire_at < $3";

/// The (schedule, second) pairs of the window (`$1` owner, from `$2` to before `$3`) without a
/// recorded fire. Locks: none.
const MISSING_SQL: &str = "
SELECT count(*)::int8
  FROM etl_schedules s
 CROSS JOIN generate_series($2::timestamptz, $3::timestamptz - interval '1 second',
                            interval '1 second') AS t(at)
 WHERE s.owner_key = $1::bytea AND left(s.name, 5) = 'fire_'
   AND NOT EXISTS (SELECT FROM etl_schedule_fires f
                    WHERE f.owner_key = s.owner_key AND f.name = s.name AND f.fire_at = t.at)";

/// Jobs of the whole run in [`SCHEDULE_QUEUE`] (`$2`) beyond one per enqueued fire (`$1`
/// owner). Locks: none.
const DUPLICATES_SQL: &str = "
SELECT (SELECT count(*) FROM etl_job_intake WHERE owner_key = $1::bytea AND queue = $2::text)
     - (SELECT count(*) FROM etl_schedule_fires WHERE owner_key = $1::bytea
                                                  AND outcome = 'enqueued')";

/// Firing schedules of `$1` with a fire before `$2` still to evaluate. Locks: none.
const BEHIND_SQL: &str = "
SELECT count(*)::int8 FROM etl_schedules
 WHERE owner_key = $1::bytea AND NOT paused AND next_fire_at < $2";

/// One table's counters (or their difference over a window).
#[derive(Debug, Clone, Copy, Default)]
struct TableCounts {
    /// Rows inserted.
    ins: i64,
    /// Rows updated.
    upd: i64,
    /// Sequential scans.
    seq_scans: i64,
    /// Rows those read.
    seq_rows: i64,
    /// Scans of `etl_schedules_due_idx`.
    due_scans: i64,
    /// Scans of `etl_schedules_pkey`.
    key_scans: i64,
    /// Index entries its index scans read.
    index_rows: i64,
}

/// The statistics views at one instant (or their difference over a window).
#[derive(Debug, Clone, Default)]
struct Counters {
    /// The database's clock, Unix seconds (a difference: the window's length).
    at: f64,
    /// The database's committed transactions.
    commits: i64,
    /// By table of [`TABLES`].
    tables: HashMap<String, TableCounts>,
}

impl Counters {
    /// Reads the counters, after dropping this session's cached snapshot of them.
    async fn read(client: &tokio_postgres::Client) -> Result<Counters, Error> {
        client
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        let rows = client.query(COUNTERS_SQL, &[&TABLES.as_slice()]).await?;
        let mut counters = Counters::default();
        for row in &rows {
            counters.commits = row.get(8);
            counters.at = row.get(9);
            let counts = TableCounts {
                ins: row.get(1),
                upd: row.get(2),
                seq_scans: row.get(3),
                seq_rows: row.get(4),
                due_scans: row.get(5),
                key_scans: row.get(6),
                index_rows: row.get(7),
            };
            counters.tables.insert(row.get(0), counts);
        }
        Ok(counters)
    }

    /// What changed from `earlier` to `self`.
    fn since(&self, earlier: &Counters) -> Counters {
        let tables = self.tables.iter().map(|(name, now)| {
            let then = earlier.tables.get(name).copied().unwrap_or_default();
            let counts = TableCounts {
                ins: now.ins - then.ins,
                upd: now.upd - then.upd,
                seq_scans: now.seq_scans - then.seq_scans,
                seq_rows: now.seq_rows - then.seq_rows,
                due_scans: now.due_scans - then.due_scans,
                key_scans: now.key_scans - then.key_scans,
                index_rows: now.index_rows - then.index_rows,
            };
            (name.clone(), counts)
        });
        Counters {
            at: self.at - earlier.at,
            commits: self.commits - earlier.commits,
            tables: tables.collect(),
        }
    }

    /// Table `name`'s counts (zeros if the view did not list it).
    fn table(&self, name: &str) -> TableCounts {
        self.tables.get(name).copied().unwrap_or_default()
    }
}

/// What one window of idle ticks cost, per replica per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct TickCost {
    /// Schedules in the table (none due).
    pub(crate) schedules: usize,
    /// The window, in seconds (database clock).
    pub(crate) window_s: f64,
    /// Scans of `etl_schedules_due_idx`.
    pub(crate) due_index_scans: f64,
    /// Scans of `etl_schedules_pkey`.
    pub(crate) key_index_scans: f64,
    /// Sequential scans of `etl_schedules`.
    pub(crate) seq_scans: f64,
    /// Index entries of `etl_schedules` the index scans read.
    pub(crate) index_rows_read: f64,
    /// Rows the sequential scans read.
    pub(crate) seq_rows_read: f64,
    /// Transactions the database committed (every role of every replica, and the bench's two
    /// reads of the statistics).
    pub(crate) transactions: f64,
}

impl TickCost {
    /// The cost over window `delta` of `replicas` replicas with `schedules` schedules.
    fn of(delta: &Counters, replicas: usize, schedules: usize) -> TickCost {
        let per = |n: i64| per_replica_second(n, delta.at, replicas);
        let table = delta.table("etl_schedules");
        TickCost {
            schedules,
            window_s: delta.at,
            due_index_scans: per(table.due_scans),
            key_index_scans: per(table.key_scans),
            seq_scans: per(table.seq_scans),
            index_rows_read: per(table.index_rows),
            seq_rows_read: per(table.seq_rows),
            transactions: per(delta.commits),
        }
    }
}

/// `n` per replica per second over `seconds` (0 for an empty window).
fn per_replica_second(n: i64, seconds: f64, replicas: usize) -> f64 {
    let by = seconds * replicas.max(1) as f64;
    if by > 0.0 {
        n as f64 / by
    } else {
        0.0
    }
}

/// Rows one fire wrote, by table (`n_tup_ins` / `n_tup_upd` over the window, per fire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct RowsPerFire {
    /// Updates of `etl_schedules` (the move of `next_fire_at`).
    pub(crate) schedules_updated: f64,
    /// Inserts into `etl_schedule_fires`: 1 by definition (the unit of the window).
    pub(crate) fires_inserted: f64,
    /// Inserts into `etl_job_records`.
    pub(crate) job_records_inserted: f64,
    /// Updates of `etl_job_records`.
    pub(crate) job_records_updated: f64,
    /// Inserts into `etl_job_intake`.
    pub(crate) job_intake_inserted: f64,
    /// Updates of `etl_job_intake`.
    pub(crate) job_intake_updated: f64,
}

/// The figures of `bench schedules`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScheduleFigures {
    /// Fire instants of the window: schedules × seconds.
    pub(crate) fires_expected: u64,
    /// Fires of the window recorded in `etl_schedule_fires`.
    pub(crate) fires_recorded: u64,
    /// (schedule, second) pairs of the window without a recorded fire.
    pub(crate) fires_missing: u64,
    /// Recorded fires of the window whose outcome is not `enqueued`.
    pub(crate) fires_without_job: u64,
    /// Jobs of the whole run beyond one per enqueued fire (0 unless a fire made two).
    pub(crate) duplicate_jobs: i64,
    /// Distinct jobs the window's fires made, each found in `etl_job_intake`.
    pub(crate) jobs_made: u64,
    /// The window, in seconds.
    pub(crate) window_s: f64,
    /// `fires_recorded / window_s`.
    pub(crate) fires_per_s: f64,
    /// `fired_at − fire_at` of the window's fires, in milliseconds (`fired_at` is the firing
    /// transaction's start, `now()`).
    pub(crate) lateness_ms: Percentiles,
    /// The smallest lateness (negative when a firing transaction began before the fire's
    /// instant and its read of the due schedules came after it).
    pub(crate) lateness_min_ms: f64,
    /// Transactions that recorded the window's fires (distinct `xmin` of their rows).
    pub(crate) firing_transactions: u64,
    /// `fires_recorded / firing_transactions`.
    pub(crate) fires_per_firing_transaction: f64,
    /// Fires the statistics counted over the window's seconds (`n_tup_ins` of
    /// `etl_schedule_fires`): what the per-fire figures divide by.
    pub(crate) fires_counted: i64,
    /// Committed transactions per fire, the baseline's rate over the window subtracted.
    pub(crate) transactions_per_fire: f64,
    /// The baseline's committed transactions per second (all replicas).
    pub(crate) baseline_transactions_per_s: f64,
    /// Scans of `etl_schedules` (due index and primary key) per fire.
    pub(crate) schedule_index_scans_per_fire: f64,
    /// Rows written per fire.
    pub(crate) rows_per_fire: RowsPerFire,
    /// CPU of the replica processes per fire, in microseconds (`/proc`, idle roles included).
    pub(crate) replica_cpu_us_per_fire: f64,
    /// The idle ticks with no schedule at all (the baseline window).
    pub(crate) empty_ticks: TickCost,
    /// The idle ticks with `idle_schedules` schedules, none due.
    pub(crate) idle_ticks: TickCost,
}

/// What a run asks for, from its [`Mode::Schedules`].
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Schedules firing every second.
    schedules: usize,
    /// Whole seconds of fires in the lateness window.
    seconds: i64,
    /// Schedules never due.
    idle_schedules: usize,
    /// Length of the baseline and idle windows.
    idle: Duration,
}

/// The database's clock, read once and carried on by this process's monotonic clock.
struct Clock {
    /// The database's clock when read.
    db: DateTime<Utc>,
    /// This process's clock then.
    local: Instant,
}

impl Clock {
    /// Reads the database's clock.
    async fn read(client: &tokio_postgres::Client) -> Result<Clock, Error> {
        let db = client
            .query_one("SELECT clock_timestamp()", &[])
            .await?
            .get(0);
        Ok(Clock {
            db,
            local: Instant::now(),
        })
    }

    /// Sleeps until the database's clock shows `at`.
    async fn until(&self, at: DateTime<Utc>) {
        let ahead = (at - self.db).to_std().unwrap_or_default();
        tokio::time::sleep_until(self.local + ahead).await;
    }
}

/// Migrates the database of `db_config` and runs `bench schedules` on it (see the module doc);
/// `client` is the bench's session in it.
///
/// # Errors
/// [`Error::Io`] when a replica cannot be started or the replicas fall behind the window for
/// longer than [`WAIT_LIMIT`]; [`Error::Internal`] for a config of another mode; database errors.
pub(super) async fn measure(
    db_config: &DatabaseConfig,
    mut client: tokio_postgres::Client,
    config: &BenchConfig,
) -> Result<ScheduleFigures, Error> {
    durable_etl::schema::migrate_session(&mut client, db_config).await?;
    let client = &client;
    let Mode::Schedules {
        schedules,
        duration_s,
        idle_schedules,
        idle_s,
    } = config.mode
    else {
        return Err(Error::Internal);
    };
    let plan = Plan {
        schedules,
        seconds: (duration_s.ceil() as i64).max(1),
        idle_schedules,
        idle: Duration::from_secs_f64(idle_s),
    };
    let (secret, _) = bench_owner()?;
    let jobs = Jobs::new(secret, BENCH_PRINCIPAL);
    let mut replicas = Replicas::start(db_config, config).await?;
    let windows = windows(db_config, client, &replicas, &jobs, plan).await;
    replicas.stop().await;
    let windows = windows?;
    figures(client, &jobs, plan, config.replicas, windows).await
}

/// What the windows read while the replicas ran.
struct Windows {
    /// The baseline window's counters (no schedule).
    baseline: Counters,
    /// The idle window's.
    idle: Counters,
    /// The lateness window's.
    lateness: Counters,
    /// Its fires: from (inclusive) and to (exclusive).
    fires: (DateTime<Utc>, DateTime<Utc>),
    /// CPU seconds of the replica processes over the lateness window.
    replica_cpu_s: f64,
}

/// The three windows of the module doc, on running `replicas`.
async fn windows(
    db_config: &DatabaseConfig,
    client: &tokio_postgres::Client,
    replicas: &Replicas,
    jobs: &Jobs,
    plan: Plan,
) -> Result<Windows, Error> {
    tokio::time::sleep(SETTLE).await;
    let start = Counters::read(client).await?;
    tokio::time::sleep(plan.idle).await;
    let baseline = Counters::read(client).await?.since(&start);

    put(
        db_config,
        client,
        jobs,
        (IDLE_PREFIX, IDLE_CRON),
        plan.idle_schedules,
    )
    .await?;
    tokio::time::sleep(SETTLE).await;
    let start = Counters::read(client).await?;
    tokio::time::sleep(plan.idle).await;
    let idle = Counters::read(client).await?.since(&start);

    let first = put(
        db_config,
        client,
        jobs,
        (FIRE_PREFIX, EVERY_SECOND),
        plan.schedules,
    )
    .await?;
    let from = first + chrono::Duration::seconds(LATENESS_SETTLE);
    let to = from + chrono::Duration::seconds(plan.seconds);
    let read_at = chrono::Duration::from_std(READ_INTO_SECOND).map_err(|_| Error::Internal)?;
    let clock = Clock::read(client).await?;
    clock.until(from + read_at).await;
    let (start, cpu) = (Counters::read(client).await?, replicas.cpu_seconds());
    clock.until(to + read_at).await;
    let lateness = Counters::read(client).await?.since(&start);
    let replica_cpu_s = replicas.cpu_seconds() - cpu;
    until_evaluated(client, jobs, to).await?;
    Ok(Windows {
        baseline,
        idle,
        lateness,
        fires: (from, to),
        replica_cpu_s,
    })
}

/// Puts `count` schedules named `prefix0`, `prefix1`, … with expression `cron` (UTC) for `jobs`'
/// owner, the first through the library's API and the others as its copies, on a session of its
/// own that is closed (and its backend gone) before this returns, then analyzes the table;
/// returns their next fire.
async fn put(
    db_config: &DatabaseConfig,
    client: &tokio_postgres::Client,
    jobs: &Jobs,
    (prefix, cron): (&str, &str),
    count: usize,
) -> Result<DateTime<Utc>, Error> {
    let setup = db::connect(db_config, SETUP_ROLE).await?;
    let template = format!("{prefix}0");
    let options = ScheduleOptions {
        queue: Some(SCHEDULE_QUEUE),
        missed: Missed::CatchUp(CATCH_UP_MAX),
        ..ScheduleOptions::default()
    };
    let job = NoopJob {
        pause_ms: None,
        fail: false,
    };
    let mut next = Utc::now();
    if count > 0 {
        let info = jobs
            .schedules()
            .put(&setup, &template, cron, &job, options)
            .await?;
        next = info.next_fire_at;
        let owner = jobs.owner_key();
        let copies = i64::try_from(count - 1).unwrap_or(i64::MAX);
        setup
            .execute(COPY_SQL, &[&&owner[..], &template, &prefix, &copies])
            .await?;
        // As autovacuum soon would: unanalyzed, the table's due read is planned as a scan of
        // every row (see the module doc).
        setup.batch_execute("ANALYZE etl_schedules").await?;
    }
    drop(setup);
    until_gone(client, SETUP_ROLE).await?;
    Ok(next)
}

/// Waits (bounded) until no session of `role` is left in the database (its statistics are then
/// flushed: a backend sends them as it exits).
async fn until_gone(client: &tokio_postgres::Client, role: &str) -> Result<(), Error> {
    let name = format!("durable-etl/{role}");
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let left: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = $1",
                &[&name],
            )
            .await?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Io(None));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until every fire before `to` of `jobs`' owner's schedules is evaluated.
async fn until_evaluated(
    client: &tokio_postgres::Client,
    jobs: &Jobs,
    to: DateTime<Utc>,
) -> Result<(), Error> {
    let owner = jobs.owner_key();
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let behind: i64 = client
            .query_one(BEHIND_SQL, &[&&owner[..], &to])
            .await?
            .get(0);
        if behind == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Io(None));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The figures of `windows`, with the window's fires read from the database.
async fn figures(
    client: &tokio_postgres::Client,
    jobs: &Jobs,
    plan: Plan,
    replicas: usize,
    windows: Windows,
) -> Result<ScheduleFigures, Error> {
    let owner = jobs.owner_key();
    let (from, to) = windows.fires;
    let rows = client.query(FIRES_SQL, &[&&owner[..], &from, &to]).await?;
    let lateness: Vec<f64> = rows.iter().map(|r| r.get(0)).collect();
    let without_job = rows
        .iter()
        .filter(|r| r.get::<_, &str>(1) != "enqueued")
        .count();
    let made: HashSet<&str> = rows
        .iter()
        .filter(|r| r.get::<_, bool>(4))
        .filter_map(|r| r.get::<_, Option<&str>>(2))
        .collect();
    let transactions: HashSet<&str> = rows.iter().map(|r| r.get(3)).collect();
    let missing: i64 = client
        .query_one(MISSING_SQL, &[&&owner[..], &from, &to])
        .await?
        .get(0);
    let duplicate_jobs: i64 = client
        .query_one(DUPLICATES_SQL, &[&&owner[..], &SCHEDULE_QUEUE])
        .await?
        .get(0);
    let baseline_per_s = if windows.baseline.at > 0.0 {
        windows.baseline.commits as f64 / windows.baseline.at
    } else {
        0.0
    };
    let l = &windows.lateness;
    let counted = l.table("etl_schedule_fires").ins;
    let per_fire = |n: f64| if counted > 0 { n / counted as f64 } else { 0.0 };
    let (schedules, records, intake) = (
        l.table("etl_schedules"),
        l.table("etl_job_records"),
        l.table("etl_job_intake"),
    );
    let recorded = rows.len() as u64;
    let window_s = (to - from).num_milliseconds() as f64 / 1000.0;
    Ok(ScheduleFigures {
        fires_expected: plan.schedules as u64 * u64::try_from(plan.seconds).unwrap_or(0),
        fires_recorded: recorded,
        fires_missing: u64::try_from(missing).unwrap_or(0),
        fires_without_job: without_job as u64,
        duplicate_jobs,
        jobs_made: made.len() as u64,
        window_s,
        fires_per_s: if window_s > 0.0 {
            recorded as f64 / window_s
        } else {
            0.0
        },
        lateness_min_ms: lateness.iter().copied().reduce(f64::min).unwrap_or(0.0),
        lateness_ms: Percentiles::of(lateness),
        firing_transactions: transactions.len() as u64,
        fires_per_firing_transaction: if transactions.is_empty() {
            0.0
        } else {
            recorded as f64 / transactions.len() as f64
        },
        fires_counted: counted,
        transactions_per_fire: per_fire(l.commits as f64 - baseline_per_s * l.at),
        baseline_transactions_per_s: baseline_per_s,
        schedule_index_scans_per_fire: per_fire((schedules.due_scans + schedules.key_scans) as f64),
        rows_per_fire: RowsPerFire {
            schedules_updated: per_fire(schedules.upd as f64),
            fires_inserted: per_fire(counted as f64),
            job_records_inserted: per_fire(records.ins as f64),
            job_records_updated: per_fire(records.upd as f64),
            job_intake_inserted: per_fire(intake.ins as f64),
            job_intake_updated: per_fire(intake.upd as f64),
        },
        replica_cpu_us_per_fire: per_fire(windows.replica_cpu_s * 1e6),
        empty_ticks: TickCost::of(&windows.baseline, replicas, 0),
        idle_ticks: TickCost::of(&windows.idle, replicas, plan.idle_schedules),
    })
}

impl ScheduleFigures {
    /// The figures as aligned lines.
    pub(crate) fn to_text(&self) -> String {
        let l = &self.lateness_ms;
        let r = &self.rows_per_fire;
        let mut out = format!(
            "fires                {} expected, {} recorded ({} missing, {} without a job, \
             {} duplicate jobs)\n\
             fire lateness        p50 {:.3}  p99 {:.3}  max {:.3} ms (min {:.3}; \
             fired_at - fire_at)\n\
             fires/s              {:.1} over {:.0} s ({} jobs made; {} firing transactions, \
             {:.1} fires each)\n\
             per fire             {:.3} transactions (baseline {:.1}/s subtracted), \
             {:.3} etl_schedules index scans, replica CPU {:.1} us\n\
             rows per fire        etl_schedules upd {:.3}; etl_schedule_fires ins {:.3}; \
             etl_job_records ins {:.3} upd {:.3}; etl_job_intake ins {:.3} upd {:.3}\n",
            self.fires_expected,
            self.fires_recorded,
            self.fires_missing,
            self.fires_without_job,
            self.duplicate_jobs,
            l.p50,
            l.p99,
            l.max,
            self.lateness_min_ms,
            self.fires_per_s,
            self.window_s,
            self.jobs_made,
            self.firing_transactions,
            self.fires_per_firing_transaction,
            self.transactions_per_fire,
            self.baseline_transactions_per_s,
            self.schedule_index_scans_per_fire,
            self.replica_cpu_us_per_fire,
            r.schedules_updated,
            r.fires_inserted,
            r.job_records_inserted,
            r.job_records_updated,
            r.job_intake_inserted,
            r.job_intake_updated,
        );
        for ticks in [&self.empty_ticks, &self.idle_ticks] {
            out.push_str(&format!(
                "{:<21}per replica per second: {:.2} index scans of etl_schedules (due index \
                 {:.2}, primary key {:.2}), {:.2} seq scans; {:.2} index rows read, {:.2} seq \
                 rows read; {:.2} transactions\n",
                format!("idle ticks ({})", ticks.schedules),
                ticks.due_index_scans + ticks.key_index_scans,
                ticks.due_index_scans,
                ticks.key_index_scans,
                ticks.seq_scans,
                ticks.index_rows_read,
                ticks.seq_rows_read,
                ticks.transactions,
            ));
        }
        out
    }
}
