//! What a bench run is asked to do ([`BenchConfig`]: its mode, replicas, handler and shape) and
//! the constants its parts share. A leaf of the bench: the parts that run a bench import it,
//! never the module that runs them (`bench`), so no part imports its caller.

use super::shape::Shape;
use serde::Serialize;
use std::time::Duration;

/// A run whose achieved figure (rate, depth) is below this fraction of what it asked for missed
/// it.
pub(crate) const MISSED_BELOW: f64 = 0.98;

/// The database name every bench database starts with.
pub(crate) const DATABASE_PREFIX: &str = "durable_etl_bench";

/// A bench database name of this run's own: [`DATABASE_PREFIX`], `_` and 8 random hex digits.
pub(crate) fn database_name() -> String {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("{DATABASE_PREFIX}_{}", &unique[..8])
}

/// Records per ETL job (each job loads this many distinct rows).
pub(crate) const RECORDS_PER_ETL_JOB: usize = 10;

/// The longest a bench waits for its jobs to end, or for a replica to come up.
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(600);

/// Jobs inserted per statement when filling the queue.
pub(crate) const INSERT_CHUNK: usize = 2_000;

/// What the replicas run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BenchHandler {
    /// The built-in `noop` kind: no effects, completions only.
    Noop,
    /// ETL loads of [`RECORDS_PER_ETL_JOB`] rows each.
    Etl,
}

/// What load the bench offers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub(crate) enum Mode {
    /// Drain `jobs` pre-inserted jobs.
    BurnDown {
        /// Jobs inserted before the replicas start.
        jobs: usize,
    },
    /// Insert jobs at `rate` per second for `duration_s` seconds, `batch` per statement, from
    /// `producers` connections (see `producers`).
    OfferedLoad {
        /// Jobs per second.
        rate: f64,
        /// Seconds of load.
        duration_s: f64,
        /// Producer tasks, each on its own connection.
        producers: usize,
        /// Jobs per statement.
        batch: usize,
    },
    /// Keep `depth` due jobs queued for `duration_s` seconds, topped up by `producers`
    /// connections with at most `batch` jobs per statement (see `depth`).
    DepthTarget {
        /// Due jobs kept.
        depth: usize,
        /// Seconds the producers keep the backlog.
        duration_s: f64,
        /// Producer tasks, each on its own connection.
        producers: usize,
        /// The most jobs per statement.
        batch: usize,
    },
    /// `trials` times for each phase: SIGKILL the replica running a job (held inside its
    /// effects, or computing) and time until a live replica runs it again.
    Recovery {
        /// Kills to time, per phase.
        trials: usize,
    },
    /// Recurring schedules (see `schedules`): `schedules` firing every second, timed over
    /// `duration_s` seconds, after a baseline window with none and an idle window with
    /// `idle_schedules` never due, each `idle_s` seconds long.
    Schedules {
        /// Schedules firing every second.
        schedules: usize,
        /// Seconds of fires timed (whole seconds, rounded up).
        duration_s: f64,
        /// Schedules none of which is due, for the idle window.
        idle_schedules: usize,
        /// Seconds of the baseline window and of the idle window, each.
        idle_s: f64,
    },
    /// Dead letters (see `dead_letters`): `letters` letters replayed in bulk from their retained
    /// payloads and `letters` more one by one with their bodies from `connections` connections,
    /// the jobs they made then run to success; and `pages` pages of `page_size` letters listed
    /// per filter from a history of `history` ended jobs.
    DeadLetters {
        /// Letters of each replay variant.
        letters: usize,
        /// Ended jobs in the history the listings page through.
        history: usize,
        /// Pages timed per filter and depth.
        pages: usize,
        /// Letters per page.
        page_size: usize,
        /// Connections the one-by-one replays share.
        connections: usize,
    },
    /// Keep `backlog` due jobs in every queue that takes jobs for `duration_s` seconds.
    Saturated {
        /// Due jobs kept per queue.
        backlog: usize,
        /// Seconds of saturation: the window the queue figures count.
        duration_s: f64,
    },
}

/// One bench run's settings.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BenchConfig {
    /// The load.
    #[serde(flatten)]
    pub(crate) mode: Mode,
    /// Replica processes.
    pub(crate) replicas: usize,
    /// Slots per replica.
    pub(crate) slots: usize,
    /// Jobs each replica may claim ahead of its free slots.
    pub(crate) prefetch: usize,
    /// The replicas' claim cooldown, in microseconds.
    pub(crate) claim_cooldown_us: u64,
    /// What the jobs do.
    pub(crate) handler: BenchHandler,
    /// The database the bench creates and drops.
    pub(crate) database: String,
    /// Keep the database afterwards.
    pub(crate) keep: bool,
    /// The server is a Citus coordinator: the database is made on every node and the cell runs
    /// on a worker (`bench::citus`).
    pub(crate) citus: bool,
    /// On Citus, the worker (by position) the cell is moved to before the bench starts.
    pub(crate) citus_worker: Option<usize>,
    /// Whether the replicas record their handler starts (offered load, for `ack->start`, and
    /// any run that writes a report, for its per-replica throughput): one push onto an
    /// in-memory list per job.
    pub(crate) record_starts: bool,
    /// The jobs' queues and priorities, and how the replicas serve and cap the queues.
    pub(crate) shape: Shape,
}
