//! The figures of one bench run ([`Report`]), whatever its mode: what the JSON prints, what the
//! text (`text`) and the pages (`html`, `sweep`) show.
//!
//! Invariant: it holds only what `measure` read (see the parent module's invariants); the figures
//! of one mode (the offered load's rate, the depth target's depth, recovery, queues, schedules,
//! dead letters) are `None` in the others.

use super::config::BenchConfig;
use super::figures::QueueFigures;
use super::percentiles::Percentiles;
use super::server_cpu::{ServerCpu, Split};
use super::starts::JobLatency;
use super::{dead_letters, depth, keys, producers, schedules};
use serde::Serialize;

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    /// The settings.
    pub(crate) config: BenchConfig,
    /// Jobs that ended `succeeded`.
    pub(crate) succeeded: u64,
    /// Jobs that ended otherwise (should be 0).
    pub(crate) not_succeeded: u64,
    /// Seconds from the first claim to the last completion (database clock).
    pub(crate) elapsed_s: f64,
    /// `succeeded / elapsed_s`.
    pub(crate) jobs_per_s: f64,
    /// Enqueue → claim: the inserting transaction's start → the claiming transaction's start
    /// (database clock). In burn-down this is queueing time.
    pub(crate) enqueue_to_start_ms: Percentiles,
    /// Offered load and depth target: the producer's commit acknowledgement → the start of the
    /// statement
    /// that completed the job (an upper bound on acknowledgement → handler start).
    pub(crate) ack_to_done_ms: Option<Percentiles>,
    /// Offered load and depth target: the producer's commit acknowledgement → the handler's
    /// start, as the
    /// replica running it recorded it (its wall clock at the call of the handler's compute phase;
    /// see `starts`). The peers' latency definition. Absent when the replicas recorded none.
    pub(crate) ack_to_start_ms: Option<Percentiles>,
    /// Offered load only: the asked and achieved rates, the jobs offered and the enqueue lag.
    #[serde(flatten)]
    pub(crate) offered: Option<producers::OfferedFigures>,
    /// Depth target only: the depth asked and held, the jobs offered, and the throughput within
    /// the window.
    #[serde(flatten)]
    pub(crate) depth: Option<depth::DepthFigures>,
    /// Offered load and depth target: each offered job's `ack_to_start` and `ack_to_done`, in milliseconds.
    pub(crate) per_job_ms: Option<Vec<JobLatency>>,
    /// Recovery only: SIGKILL of the replica running a job inside its effects → a live
    /// replica's claim of that job (database clock).
    pub(crate) recovery_effects_ms: Option<Percentiles>,
    /// Recovery only: the same for a job killed while it computed (no connection held).
    pub(crate) recovery_compute_ms: Option<Percentiles>,
    /// Statements the replicas sent on pooled connections, per succeeded job (the producers'
    /// statements are not counted: they are the load, not its cost).
    pub(crate) round_trips_per_job: f64,
    /// Claims the replicas made.
    pub(crate) claims: u64,
    /// Claims that found nothing.
    pub(crate) empty_claims: u64,
    /// Group commits the replicas made.
    pub(crate) commit_batches: u64,
    /// `claims` per succeeded job.
    pub(crate) claims_per_job: f64,
    /// `empty_claims` per succeeded job.
    pub(crate) empty_claims_per_job: f64,
    /// `commit_batches` per succeeded job.
    pub(crate) commits_per_job: f64,
    /// WAL the run wrote, per succeeded job (whole server: other databases' writes count too).
    pub(crate) wal_bytes_per_job: f64,
    /// The largest peak resident set size of a replica, in MiB.
    pub(crate) replica_peak_rss_mib: f64,
    /// CPU the replica processes used, in microseconds per succeeded job.
    pub(crate) replica_cpu_us_per_job: f64,
    /// Burn-down and saturated only: completions per queue, discovery claims, waits by
    /// priority, aging writes and the caps' figures.
    pub(crate) queues: Option<QueueFigures>,
    /// With `--keys` only: enqueue → claim of the hot key's jobs and of the other keys'.
    pub(crate) keys: Option<keys::KeyFigures>,
    /// Schedules only: fire lateness, misses, transactions and rows per fire, idle ticks' cost
    /// (the job figures above are then empty: the fires' jobs are never run).
    pub(crate) schedules: Option<schedules::ScheduleFigures>,
    /// Dead letters only: replays (retained and resubmitted) and their jobs' run, and the
    /// listing's page times (the job figures above then describe the replayed jobs' run).
    pub(crate) dead_letters: Option<dead_letters::DeadLetterFigures>,
    /// The run's time series, for `--report` (not in the JSON figures).
    #[serde(skip)]
    pub(crate) timeline: Timeline,
    /// The server's CPU over the measured window, in microseconds per succeeded job:
    /// `server_cpu_us_per_job` (replicas + producers + aux, the peers' "peer" figure) and its
    /// split (see `server_cpu`; read from `/proc`, so only when the server runs on this host, 0
    /// otherwise).
    #[serde(flatten)]
    pub(crate) server_cpu: ServerCpu,
}

impl Report {
    /// The loud line of a run that missed its asked rate or did not hold its depth, if it did.
    pub(crate) fn warning(&self) -> Option<String> {
        let rate = self.offered.as_ref().and_then(|o| o.warning());
        rate.or_else(|| self.depth.as_ref().and_then(|d| d.warning()))
    }
}

/// The time series a run leaves for its report, all in Unix seconds unless said otherwise.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timeline {
    /// What the latencies measure (`ack->start`, `enqueue->start`).
    pub(crate) latency_label: &'static str,
    /// One latency per job, in milliseconds.
    pub(crate) latencies_ms: Vec<f64>,
    /// When each job was accepted.
    pub(crate) created: Vec<f64>,
    /// When each succeeded job finished.
    pub(crate) finished: Vec<f64>,
    /// Per replica (in start order), when each of its handlers started.
    pub(crate) starts_by_replica: Vec<Vec<f64>>,
}

impl Report {
    /// The report of a schedules run: its figures, and the job figures of the other modes empty
    /// (the fires' jobs wait in a queue no replica serves).
    pub(super) fn of_schedules(
        config: &BenchConfig,
        figures: schedules::ScheduleFigures,
    ) -> Report {
        Report {
            elapsed_s: figures.window_s,
            schedules: Some(figures),
            ..Report::without_jobs(config)
        }
    }

    /// The report of a dead-letters run: its figures, and of the job figures only those of the
    /// replayed jobs' run (how many succeeded, over how long).
    pub(super) fn of_dead_letters(
        config: &BenchConfig,
        figures: dead_letters::DeadLetterFigures,
    ) -> Report {
        let run = &figures.run;
        Report {
            succeeded: run.succeeded,
            not_succeeded: run.not_succeeded,
            elapsed_s: run.seconds,
            jobs_per_s: run.jobs_per_s,
            dead_letters: Some(figures),
            ..Report::without_jobs(config)
        }
    }

    /// A report of `config` with every job figure empty, for the modes with figures of their own.
    fn without_jobs(config: &BenchConfig) -> Report {
        Report {
            config: config.clone(),
            succeeded: 0,
            not_succeeded: 0,
            elapsed_s: 0.0,
            jobs_per_s: 0.0,
            enqueue_to_start_ms: Percentiles::default(),
            ack_to_done_ms: None,
            ack_to_start_ms: None,
            offered: None,
            depth: None,
            per_job_ms: None,
            recovery_effects_ms: None,
            recovery_compute_ms: None,
            round_trips_per_job: 0.0,
            claims: 0,
            empty_claims: 0,
            commit_batches: 0,
            claims_per_job: 0.0,
            empty_claims_per_job: 0.0,
            commits_per_job: 0.0,
            wal_bytes_per_job: 0.0,
            replica_peak_rss_mib: 0.0,
            replica_cpu_us_per_job: 0.0,
            queues: None,
            keys: None,
            schedules: None,
            dead_letters: None,
            timeline: Timeline::default(),
            server_cpu: ServerCpu::per_job(Split::default(), 0),
        }
    }
}
