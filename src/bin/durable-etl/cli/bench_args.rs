//! The flags of `durable-etl bench`: its modes, the replicas' shape, and the queues, priorities
//! and caps of #25's targets, and how they turn into one [`BenchConfig`].
//!
//! Invariants this module keeps:
//! - A flag's value is checked when it is parsed, against the library's own ranges (weights,
//!   priorities, caps; see `bench::shape`), so a bad value exits 2 before any database is made.
//! - The queue flags shape `noop` jobs only: with `--handler etl` they are refused (exit 2), not
//!   silently ignored; so they are with `dead-letters`, whose letters' jobs keep the default
//!   queue.

use super::args::parse_duration;
use crate::bench::shape::{self, Shape};
use crate::bench::{BenchConfig, BenchHandler, Mode};
use clap::{Args, Subcommand};
use durable_etl::config;
use std::num::NonZeroUsize;
use std::time::Duration;

/// `n` as a default count of a flag that takes at least one (1 for 0).
const fn at_least_one(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    }
}

/// `depth-target`'s default bulk: the public multi-system harness's rows per insert.
const DEPTH_BATCH: NonZeroUsize = at_least_one(128);

/// `schedules`' default number of schedules firing every second.
const SCHEDULES: NonZeroUsize = at_least_one(1_000);

/// `dead-letters`' default number of pages timed per filter and depth.
const PAGES: NonZeroUsize = at_least_one(200);

/// `dead-letters`' default number of connections replaying letters one by one.
const REPLAY_CONNECTIONS: NonZeroUsize = at_least_one(4);

/// The load `bench` offers.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Insert --jobs due jobs, then start the replicas and time how fast they drain them.
    BurnDown {
        /// Jobs inserted before the replicas start.
        #[arg(long, default_value_t = 20_000)]
        jobs: usize,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Start idle replicas, then offer --rate jobs/s for --duration, open-loop by the clock, from
    /// --producers connections, --batch jobs per statement; the figures say what rate was
    /// achieved, and warn when it falls short of the asked one. Several rates make a sweep.
    OfferedLoad {
        /// Jobs per second; several (`1000,5000`) run the offered load at each rate in turn, on a
        /// fresh database each time, and print one report per rate (`--json`: an array of them;
        /// `--report DIR`: `DIR/rate-R/index.html` per rate, and `DIR/index.html` plotting the
        /// figures across the sweep).
        #[arg(
            long,
            value_name = "R[,R…]",
            value_delimiter = ',',
            num_args = 1,
            default_value = "20"
        )]
        rate: Vec<f64>,
        /// How long the load lasts: the schedule holds rate x duration jobs, and the producers
        /// stop when the duration is over, whatever is left of it.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Producer tasks, each on its own connection, taking the next due statement in turn.
        #[arg(long, value_name = "N", default_value_t = NonZeroUsize::MIN)]
        producers: NonZeroUsize,
        /// Jobs per statement: each statement enqueues B jobs, sent at rate / B per second.
        #[arg(long, value_name = "B", default_value_t = NonZeroUsize::MIN)]
        batch: NonZeroUsize,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Start idle replicas, then keep --depth due jobs queued for --duration, topped up by
    /// --producers connections with bulk enqueues of at most --batch jobs; the figures say what
    /// depth was held (and warn when it was not) and what throughput it gave, beside the offered
    /// load's latency and per-job cost.
    DepthTarget {
        /// Due jobs kept queued.
        #[arg(long, value_name = "N", default_value_t = 1_000)]
        depth: usize,
        /// How long the producers keep the backlog: the window of the throughput figure.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Producer tasks, each on its own connection, each topping the backlog up in turn.
        #[arg(long, value_name = "N", default_value_t = NonZeroUsize::MIN)]
        producers: NonZeroUsize,
        /// The most jobs per statement (the public multi-system harness's bulk: 128).
        #[arg(long, value_name = "B", default_value_t = DEPTH_BATCH)]
        batch: NonZeroUsize,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Time how soon a live replica runs the job of a SIGKILLed one (default settings; at least
    /// two replicas), for a job killed in each phase: an ETL job held inside its effects, and a
    /// `noop` job computing (pausing in its compute phase).
    Recovery {
        /// Kills to time, per phase.
        #[arg(long, default_value_t = 5)]
        trials: usize,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Time recurring schedules on otherwise idle replicas: --schedules firing every second
    /// (`* * * * * *`, UTC) for --duration, their jobs left in a queue no replica serves; before
    /// that, a baseline window with no schedule and an idle window with --idle-schedules never
    /// due (`0 0 1 1 *`), --idle-duration each. Reports fire lateness, misses, transactions and
    /// rows per fire, and the scans an idle tick makes.
    Schedules {
        /// Schedules firing every second.
        #[arg(long, value_name = "N", default_value_t = SCHEDULES)]
        schedules: NonZeroUsize,
        /// How long the fires are timed (whole seconds, rounded up), after 3 s of warm-up fires.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        duration: Duration,
        /// Schedules none of which is due, in the table during the idle window and after.
        #[arg(long, value_name = "M", default_value_t = 10_000)]
        idle_schedules: usize,
        /// How long the baseline window (no schedule) and the idle window last, each.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        idle_duration: Duration,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Time dead letters: --letters letters (noop jobs enqueued through the library, then ended
    /// `failed` with their letters by the statements a failure runs) replayed in bulk from their
    /// retained payloads, and --letters more replayed one by one with their bodies sent again
    /// from --connections connections; then the replicas run the jobs the replays made, to
    /// success. Before that, pages of the letters' listing (first and deep keyset pages, with no
    /// filter and with an owner, a queue and a code filter) are timed over a history of --history
    /// ended jobs, one in ten failed.
    DeadLetters {
        /// Letters of each replay variant (retained, resubmitted).
        #[arg(long, value_name = "N", default_value_t = 10_000)]
        letters: usize,
        /// Ended jobs in the history the listing pages through (one in ten failed, so a letter).
        #[arg(long, value_name = "N", default_value_t = 1_000_000)]
        history: usize,
        /// Pages timed per filter, for the first page and for the deep ones.
        #[arg(long, value_name = "N", default_value_t = PAGES)]
        pages: NonZeroUsize,
        /// Letters per page (the HTTP API's default is 50).
        #[arg(long, value_name = "N", default_value_t = 50,
              value_parser = clap::value_parser!(u16).range(1..=500))]
        page_size: u16,
        /// Connections the one-by-one replays (the resubmitted variant) share.
        #[arg(long, value_name = "N", default_value_t = REPLAY_CONNECTIONS)]
        connections: NonZeroUsize,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
    /// Keep at least --backlog due jobs (times the queue's weight) in every queue that takes jobs
    /// for --duration (topped up every 50 ms), then drain; the queue figures count the
    /// completions within that window.
    Saturated {
        /// Due jobs (deadline reached) kept in each queue, times its weight.
        #[arg(long, default_value_t = 2_000)]
        backlog: usize,
        /// How long the queues stay saturated: the window of the queue figures.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        duration: Duration,
        /// The replicas and how they run.
        #[command(flatten)]
        common: BenchArgs,
    },
}

/// Options every `bench` mode shares.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Replica processes (this binary's `work`).
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: usize,
    /// Slots per replica.
    #[arg(long, default_value_t = config::SLOTS_DEFAULT)]
    pub(crate) slots: usize,
    /// Jobs each replica may claim ahead of its free slots while a backlog lasts.
    #[arg(long, default_value_t = config::PREFETCH_DEFAULT)]
    pub(crate) prefetch: usize,
    /// The replicas' claim cooldown (`work --claim-cooldown`, read from the same variable):
    /// wakes sooner than this after a claim wait and are claimed together.
    #[arg(long, env = "DURABLE_ETL_CLAIM_COOLDOWN", default_value = "0ms", value_parser = parse_duration)]
    pub(crate) claim_cooldown: Duration,
    /// What the jobs do.
    #[arg(long, value_enum, default_value = "noop")]
    pub(crate) handler: BenchHandler,
    /// The database the bench creates (and drops, unless --keep) on DATABASE_URL's server; its
    /// name must start with durable_etl_bench. Defaults to durable_etl_bench_ and 8 random hex
    /// digits, new for every run, so the benches of several users of one server never drop each
    /// other's database. A database of that name is dropped first only if a bench created it
    /// and no session uses it; any other stops the bench (exit 2, database_taken).
    #[arg(long)]
    pub(crate) bench_database: Option<String>,
    /// Keep the bench database afterwards.
    #[arg(long)]
    pub(crate) keep: bool,
    /// DATABASE_URL names a Citus coordinator (its `postgres` database lists the workers): the
    /// bench database is made on every node with Citus set up in it, the cell (--cell, required)
    /// is migrated through the coordinator, and the bench fills, reads its figures and samples
    /// the server's CPU on the worker that holds the cell. Burn-down and offered load only.
    #[arg(long)]
    pub(crate) citus: bool,
    /// With --citus: the worker (its position in the coordinator's list, from 0) that the cell
    /// is moved to before the bench starts, if Citus placed it on another (two benches of two
    /// cells on two workers, say).
    #[arg(long, requires = "citus")]
    pub(crate) citus_worker: Option<usize>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write a self-contained HTML page (DIR/index.html) with the figures and SVG plots:
    /// latency distribution, jobs/s over time per replica, backlog over time.
    #[arg(long, value_name = "DIR")]
    pub(crate) report: Option<std::path::PathBuf>,
    /// The jobs' queues and priorities, and the queues' caps.
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
}

/// The queue flags of `bench` (`noop` jobs only).
#[derive(Debug, Args)]
pub(crate) struct ShapeArgs {
    /// Spread the jobs equally over N queues (q0, q1, …); every replica serves them all.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) queues: Option<u16>,
    /// Put every job into q0 of the --queues; the replicas still serve all of them.
    #[arg(long, requires = "queues")]
    pub(crate) hot_queue: bool,
    /// One queue per weight (`3,1`: q0 and q1), the jobs spread equally, served with those
    /// weights (`work --queues q0:3,q1:1`).
    #[arg(long, value_name = "W,W…", conflicts_with = "queues", value_parser = shape::parse_weights)]
    pub(crate) weights: Option<shape::Weights>,
    /// The jobs' priorities, as `percent:priority` pairs adding up to 100 (`90:0,10:9`).
    #[arg(long, value_name = "PCT:P,…", value_parser = shape::parse_priority_mix)]
    pub(crate) priority_mix: Option<shape::PriorityMix>,
    /// Cap every queue at N running jobs across the replicas (`queues cap`) before they start.
    #[arg(long, value_name = "N", value_parser = shape::parse_cap)]
    pub(crate) cap: Option<i32>,
    /// Each `noop` job pauses this many milliseconds in its compute phase (no connection held).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(crate) job_ms: u64,
    /// Each `noop` job fails permanently after its pause (`handler_failed`, one attempt): a
    /// burn-down of failing jobs, whose server CPU per job includes each failure's diagnosis
    /// and dead letter.
    #[arg(long)]
    pub(crate) fail: bool,
    /// Give each job one of N concurrency keys (k0, k1, …), Zipf-distributed (exponent 1): k0
    /// is the hot key.
    #[arg(long, value_name = "N", value_parser = shape::parse_keys)]
    pub(crate) keys: Option<usize>,
    /// Cap every queue's running jobs of one key at N (`queues key-cap`) before the replicas
    /// start.
    #[arg(long, value_name = "N", requires = "keys", value_parser = shape::parse_cap)]
    pub(crate) key_cap: Option<i32>,
}

impl ShapeArgs {
    /// The shape these flags describe.
    fn shape(&self) -> Shape {
        let weights = self.weights.clone().map(|w| w.0).unwrap_or_default();
        Shape {
            queues: match (&self.weights, self.queues) {
                (Some(w), _) => w.0.len(),
                (None, Some(n)) => usize::from(n),
                (None, None) => 1,
            },
            hot_queue: self.hot_queue,
            weights,
            priority_mix: self.priority_mix.clone().map(|m| m.0).unwrap_or_default(),
            cap: self.cap,
            job_ms: self.job_ms,
            fail: self.fail,
            keys: self.keys.unwrap_or(0),
            key_cap: self.key_cap,
        }
    }
}

/// Where a bench's figures go.
#[derive(Debug, Clone)]
pub(crate) struct BenchOutput {
    /// Print them as one JSON object (else as text).
    pub(crate) json: bool,
    /// Also write the HTML report into this directory.
    pub(crate) report: Option<std::path::PathBuf>,
}

impl BenchCommand {
    /// The settings of the bench's runs (one, or one per rate of an offered-load sweep, in the
    /// order given), and where their figures go.
    ///
    /// # Errors
    /// A usage error (exit 2) for queue flags given with `--handler etl`.
    pub(crate) fn configs(&self) -> Result<(Vec<BenchConfig>, BenchOutput), clap::Error> {
        let (modes, common) = match self {
            BenchCommand::BurnDown { jobs, common } => {
                (vec![Mode::BurnDown { jobs: *jobs }], common)
            }
            BenchCommand::OfferedLoad {
                rate,
                duration,
                producers,
                batch,
                common,
            } => {
                let mode = |rate: &f64| Mode::OfferedLoad {
                    rate: *rate,
                    duration_s: duration.as_secs_f64(),
                    producers: producers.get(),
                    batch: batch.get(),
                };
                (rate.iter().map(mode).collect(), common)
            }
            BenchCommand::DepthTarget {
                depth,
                duration,
                producers,
                batch,
                common,
            } => (
                vec![Mode::DepthTarget {
                    depth: *depth,
                    duration_s: duration.as_secs_f64(),
                    producers: producers.get(),
                    batch: batch.get(),
                }],
                common,
            ),
            BenchCommand::Recovery { trials, common } => {
                (vec![Mode::Recovery { trials: *trials }], common)
            }
            BenchCommand::Schedules {
                schedules,
                duration,
                idle_schedules,
                idle_duration,
                common,
            } => (
                vec![Mode::Schedules {
                    schedules: schedules.get(),
                    duration_s: duration.as_secs_f64(),
                    idle_schedules: *idle_schedules,
                    idle_s: idle_duration.as_secs_f64(),
                }],
                common,
            ),
            BenchCommand::DeadLetters {
                letters,
                history,
                pages,
                page_size,
                connections,
                common,
            } => (
                vec![Mode::DeadLetters {
                    letters: *letters,
                    history: *history,
                    pages: pages.get(),
                    page_size: usize::from(*page_size),
                    connections: connections.get(),
                }],
                common,
            ),
            BenchCommand::Saturated {
                backlog,
                duration,
                common,
            } => (
                vec![Mode::Saturated {
                    backlog: *backlog,
                    duration_s: duration.as_secs_f64(),
                }],
                common,
            ),
        };
        let configs = modes
            .into_iter()
            .map(|mode| config(mode, common))
            .collect::<Result<Vec<_>, _>>()?;
        let output = BenchOutput {
            json: common.json,
            report: common.report.clone(),
        };
        Ok((configs, output))
    }
}

/// The settings of one run of `mode` with the `common` flags.
///
/// # Errors
/// A usage error (exit 2) for queue flags given with `--handler etl` or `dead-letters`.
fn config(mode: Mode, common: &BenchArgs) -> Result<BenchConfig, clap::Error> {
    let shape = common.shape.shape();
    if common.handler != BenchHandler::Noop && !shape.is_default() {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            "the queue flags shape noop jobs only: leave out --handler etl\n",
        ));
    }
    if matches!(mode, Mode::DeadLetters { .. }) && !shape.is_default() {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            "dead-letters replays its letters into the default queue: leave out the queue flags\n",
        ));
    }
    let replicas = match mode {
        Mode::Recovery { .. } => common.replicas.max(2),
        _ => common.replicas,
    };
    let config = BenchConfig {
        mode,
        replicas,
        slots: common.slots,
        prefetch: common.prefetch,
        claim_cooldown_us: u64::try_from(common.claim_cooldown.as_micros()).unwrap_or(u64::MAX),
        handler: common.handler,
        database: common
            .bench_database
            .clone()
            .unwrap_or_else(crate::bench::database_name),
        keep: common.keep,
        citus: common.citus,
        citus_worker: common.citus_worker,
        record_starts: matches!(mode, Mode::OfferedLoad { .. } | Mode::DepthTarget { .. })
            || common.report.is_some()
            || shape.cap.is_some(),
        shape,
    };
    Ok(config)
}
