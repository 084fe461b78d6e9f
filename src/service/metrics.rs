//! Prometheus text exposition of a replica's and an API server's metrics.
//!
//! This module says what is exposed (names, help, label values, which snapshot field); the
//! prometheus-client crate writes the text (version 0.0.4). Counter names are given without
//! `_total`, which the encoder appends to every counter's HELP, TYPE and sample lines. The
//! replica's counters and histograms live in `worker::stats`, which imports nothing from here.
//!
//! Invariants this module keeps:
//! - Every label value comes from a fixed allow-list (stable codes, claim triggers, recovery
//!   reasons, status classes) or is a queue's name, of at most [`QUEUES_SHOWN`] queues per
//!   scrape (`metrics::queues`), or the name of a cell the process serves ([`merge_cells`]):
//!   the number of series is bounded whatever the traffic. No id,
//!   principal, key or request value is ever a label.
//! - Latency histograms use fixed buckets; the enqueue→start latency is computed from database
//!   timestamps, never from a replica's clock.
//! - Queue depth and oldest due job age are sampled by one query per scrape, not per job, and that
//!   query reads only active rows through the partial indexes (never the terminal history).

mod queues;

pub use queues::{
    listed_queues, sample_queues, sample_some_queues, QueueDepth, QUEUES_SHOWN, SERVED_WITHIN,
};

use crate::db::Pool;
use crate::worker::stats::{Histogram, StatsSnapshot, WorkerStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio_postgres::GenericClient;

/// The Prometheus text (version 0.0.4) of `collectors`, in their order, appended to `out`.
/// prometheus-client writes every line: names (counters get their `_total` there), HELP and
/// TYPE, label escaping, cumulative buckets, `+Inf`, `_sum` and `_count`.
fn encode(out: &mut String, collectors: Vec<Box<dyn Collector>>) {
    let mut registry = Registry::default();
    for collector in collectors {
        registry.register_collector(collector);
    }
    // Writing to a `String` cannot fail.
    let _ = prometheus_text::encode(out, &registry);
}

/// Encodes one family of `kind` (counter or gauge) whose samples differ by one label drawn from
/// a fixed list. A counter's `name` leaves out `_total`: the encoder adds it.
fn labelled(
    encoder: &mut DescriptorEncoder,
    (name, help, kind): (&'static str, &str, MetricType),
    label: &str,
    samples: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (value, n) in samples {
        let labels = [(label, *value)];
        let series = family.encode_family(&labels)?;
        if kind == MetricType::Counter {
            ConstCounter::new(*n).encode(series)?;
        } else {
            ConstGauge::new(*n).encode(series)?;
        }
    }
    Ok(())
}

/// Encodes one unlabelled family of `metric`.
fn single(
    encoder: &mut DescriptorEncoder,
    name: &'static str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A counter family whose samples differ by one label drawn from a fixed list.
#[derive(Debug)]
struct CounterFamily {
    /// The family name, without the `_total` the encoder adds.
    name: &'static str,
    /// The HELP text.
    help: &'static str,
    /// The label's name.
    label: &'static str,
    /// Each label value and its count.
    samples: Vec<(&'static str, u64)>,
}

impl Collector for CounterFamily {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = (self.name, self.help, MetricType::Counter);
        labelled(&mut encoder, family, self.label, &self.samples)
    }
}

/// Appends a counter family `name` (without the `_total` the exposition adds) whose samples
/// differ by `label`, taking the values of `samples`: each value must come from a fixed list.
pub fn render_counter_family(
    out: &mut String,
    (name, help): (&'static str, &'static str),
    label: &'static str,
    samples: &[(&'static str, u64)],
) {
    let samples = samples.to_vec();
    encode(
        out,
        vec![Box::new(CounterFamily {
            name,
            help,
            label,
            samples,
        })],
    );
}

/// A histogram under its name and help.
#[derive(Debug)]
struct Named {
    /// The family name.
    name: &'static str,
    /// The HELP text.
    help: &'static str,
    /// The histogram (a clone sharing the live counts).
    histogram: Histogram,
}

impl Collector for Named {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        single(&mut encoder, self.name, self.help, &self.histogram)
    }
}

/// A sample of the queue, taken by one query.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueSample {
    /// Pending jobs that are due now.
    pub due: i64,
    /// Pending jobs that are not due yet (deferred or waiting to retry).
    pub deferred: i64,
    /// Running jobs.
    pub running: i64,
    /// Age of the oldest due job, in seconds (0 when none is due).
    pub oldest_due_seconds: f64,
}

/// Counts the active jobs by state and the oldest due job's age (database clock).
///
/// Each scalar subquery repeats a partial index's predicate exactly (`status = 'pending'` for
/// `etl_job_records_claim_idx`, `status = 'running'` for `etl_job_records_running_owner_idx`),
/// so a scrape reads only active rows: it costs the same at 1,000 and 1,000,000 terminal rows. A
/// single `status IN ('pending', 'running')` scan matches neither index and walks the whole table.
///
/// Locks: none (`AccessShareLock` on the table and its indexes, like any read).
pub const QUEUE_SAMPLE_SQL: &str = "
SELECT (SELECT count(*) FROM etl_job_records WHERE status = 'pending' AND run_at <= now()),
       (SELECT count(*) FROM etl_job_records WHERE status = 'pending' AND run_at > now()),
       (SELECT count(*) FROM etl_job_records WHERE status = 'running'),
       coalesce(extract(epoch FROM now() - (
           SELECT min(run_at) FROM etl_job_records
            WHERE status = 'pending' AND run_at <= now()))::float8, 0)";

/// Samples the queue.
///
/// # Errors
/// The database error of the query.
pub async fn sample_queue(
    client: &impl GenericClient,
) -> Result<QueueSample, tokio_postgres::Error> {
    let row = client.query_typed_one(QUEUE_SAMPLE_SQL, &[]).await?;
    Ok(QueueSample {
        due: row.get(0),
        deferred: row.get(1),
        running: row.get(2),
        oldest_due_seconds: row.get(3),
    })
}

/// The shared part of a scrape: the pool's usage and the queue sample, read before encoding.
#[derive(Debug)]
struct Shared {
    /// Open pooled connections.
    connections: u32,
    /// Idle pooled connections.
    idle_connections: u32,
    /// The queue sample, if the query succeeded.
    sample: Option<QueueSample>,
}

impl Collector for Shared {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let gauge = MetricType::Gauge;
        single(
            e,
            "durable_etl_pool_connections",
            "Open pooled connections.",
            &ConstGauge::new(self.connections),
        )?;
        single(
            e,
            "durable_etl_pool_idle_connections",
            "Idle pooled connections.",
            &ConstGauge::new(self.idle_connections),
        )?;
        let up = u32::from(self.sample.is_some());
        single(
            e,
            "durable_etl_database_up",
            "1 if the last queue sample succeeded.",
            &ConstGauge::new(up),
        )?;
        let sample = self.sample.unwrap_or_default();
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let states = [
            ("due", count(sample.due)),
            ("deferred", count(sample.deferred)),
            ("running", count(sample.running)),
        ];
        let help = "Active jobs by state, sampled at scrape time.";
        labelled(e, ("durable_etl_queue_jobs", help, gauge), "state", &states)?;
        let help = "Age of the oldest due pending job (database clock).";
        single(
            e,
            "durable_etl_queue_oldest_due_seconds",
            help,
            &ConstGauge::new(sample.oldest_due_seconds),
        )
    }
}

/// Appends the queue sample (the totals, then per queue) and the pool's usage; a failed sample is
/// reported as `up 0` (and no queue).
pub async fn render_shared(out: &mut String, pool: &Pool) {
    let state = pool.state();
    let (sample, by_queue) = match crate::db::checkout(pool).await {
        Ok(conn) => (
            sample_queue(&*conn).await.ok(),
            sample_queues(&*conn).await.unwrap_or_default(),
        ),
        Err(_) => (None, Vec::new()),
    };
    let shared = Shared {
        connections: state.connections,
        idle_connections: state.idle_connections,
        sample,
    };
    encode(
        out,
        vec![Box::new(shared), Box::new(queues::PerQueue(by_queue))],
    );
}

/// One unlabelled counter of a replica: name (without the `_total` the encoder adds), help,
/// and where the snapshot holds the value.
type Counter = (&'static str, &'static str, fn(&StatsSnapshot) -> u64);

/// A replica's unlabelled counters, in exposition order.
#[rustfmt::skip]
const COUNTERS: &[Counter] = &[
    ("durable_etl_jobs_claimed", "Jobs claimed.", |s| s.claimed),
    ("durable_etl_jobs_succeeded", "Jobs that ended succeeded.", |s| s.succeeded),
    ("durable_etl_jobs_retried", "Attempts that went back to pending for a retry.", |s| s.retried),
    ("durable_etl_jobs_cancelled", "Running jobs that ended cancelled.", |s| s.cancelled),
    ("durable_etl_jobs_released", "Jobs given back on shutdown or restart.", |s| s.released),
    ("durable_etl_lease_lost", "Jobs abandoned because their lease was gone.", |s| s.lease_lost),
    ("durable_etl_jobs_given_back",
        "Jobs given back uncharged after an infrastructure fault or a lease no longer trusted.",
        |s| s.given_back),
    ("durable_etl_jobs_adopted",
        "Jobs taken into a replica's slots after the reply of the claim that took them was lost.",
        |s| s.adopted),
    ("durable_etl_attempts_refunded",
        "Attempts recovery took from a replica that was cut off, not dead, given back when it returned.",
        |s| s.refunded),
    ("durable_etl_schedule_jobs", "Jobs made for schedule fires.", |s| s.schedule_jobs),
    ("durable_etl_schedule_fires_overlapped",
        "Schedule fires that made no job because the previous one still lived.",
        |s| s.schedule_overlapped),
    ("durable_etl_commits_again",
        "Commits of a computed result tried again under its claim after an infrastructure fault.",
        |s| s.recommits),
    ("durable_etl_transitions_unwritten", "Transitions not written (database unavailable).",
        |s| s.unwritten),
    ("durable_etl_claims_empty", "Claims that found no job.", |s| s.empty_claims),
    ("durable_etl_commit_failures",
        "Group commits whose own statements failed; their jobs retry.", |s| s.commit_failures),
    ("durable_etl_claim_plan_fallbacks",
        "Claim sessions whose prepared claim failed its plan check (they plan every claim).",
        |s| s.claim_plan_fallbacks),
    ("durable_etl_claims_unnamed",
        "Claims sent unnamed, planned for their values (--pooler transaction, or a failed plan check).",
        |s| s.unnamed_claims),
    ("durable_etl_prepared_statement_misses",
        "Statements refused for a missing or duplicated prepared statement (a transaction-mode pooler not declared).",
        |s| s.prepared_statement_misses),
    ("durable_etl_db_round_trips",
        "Statements the replica sent on pooled connections (claims, commits, heartbeats, ...).",
        |s| s.round_trips),
    ("durable_etl_notifications", "Notifications that woke this replica.", |s| s.notifications),
    ("durable_etl_session_reconnects", "Times the LISTEN/owner session reconnected.",
        |s| s.reconnects),
    ("durable_etl_poll_found_work", "Polls that found work no notification announced.",
        |s| s.poll_found_work),
    ("durable_etl_waits", "Times the replica began waiting for work (enqueues then notify).",
        |s| s.waits),
    ("durable_etl_waits_left", "Times a busy replica stopped waiting (enqueues stop notifying it).",
        |s| s.waits_left),
    ("durable_etl_freed_permit_wakes",
        "Wakes sent for permits this replica's completions freed and it did not claim again.",
        |s| s.freed_wakes),
    ("durable_etl_enqueue_barrier_held",
        "Tries of the enqueue barrier that found an enqueue in flight (tried again).",
        |s| s.barrier_held),
    ("durable_etl_backup_claims",
        "Claims sent to back up a wake that named another replica and was not answered before.",
        |s| s.backup_claims),
    ("durable_etl_presence_failures",
        "Presence statements (registration, barrier try, park) that failed (tried again).",
        |s| s.presence_failures),
    ("durable_etl_claims_held",
        "Wake claims held until the claim cooldown was over (the wakes meanwhile joined them).",
        |s| s.claims_held),
];

/// A replica's counters and gauges, read once per scrape.
#[derive(Debug)]
struct Replica {
    /// Every counter.
    snapshot: StatsSnapshot,
    /// Jobs that ended failed, by stored code.
    failed: Vec<(&'static str, u64)>,
}

impl Collector for Replica {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (e, s) = (&mut encoder, &self.snapshot);
        for (name, help, value) in COUNTERS {
            single(e, name, help, &ConstCounter::new(value(s)))?;
        }
        let gauges = [
            (
                "durable_etl_session_up",
                "1 while the LISTEN/owner session is up.",
                s.session_up,
            ),
            (
                "durable_etl_commits_waiting_for_standby",
                "Commits of the database held waiting for a synchronous standby, at the session's last probe.",
                s.commits_waiting_for_standby,
            ),
        ];
        for (name, help, value) in gauges {
            single(e, name, help, &ConstGauge::new(value))?;
        }
        let counter = MetricType::Counter;
        let help = "Jobs that ended failed, by stored code.";
        labelled(
            e,
            ("durable_etl_jobs_failed", help, counter),
            "code",
            &self.failed,
        )?;
        // The snapshot reads `claims` before the by-trigger counters, so claims counted in
        // between can make their sum exceed it: saturate instead of wrapping.
        let other = s
            .claims
            .saturating_sub(s.claims_by_notify)
            .saturating_sub(s.claims_by_poll)
            .saturating_sub(s.claims_by_due)
            .saturating_sub(s.claims_by_drain)
            .saturating_sub(s.claims_by_reconnect)
            .saturating_sub(s.claims_by_freed);
        let triggers = [
            ("notify", s.claims_by_notify),
            ("poll", s.claims_by_poll),
            ("due", s.claims_by_due),
            ("drain", s.claims_by_drain),
            ("catch_up", s.claims_by_reconnect),
            ("freed", s.claims_by_freed),
            ("other", other),
        ];
        let help = "Claim statements, by what triggered them.";
        labelled(
            e,
            ("durable_etl_claims", help, counter),
            "trigger",
            &triggers,
        )?;
        let reasons = [
            ("expired", s.recovered_expired),
            ("dead_owner", s.recovered_dead_owner),
        ];
        let help = "Running jobs recovered, by reason.";
        labelled(
            e,
            ("durable_etl_leases_recovered", help, counter),
            "reason",
            &reasons,
        )?;
        let policies = [
            ("coalesce", s.schedule_missed_coalesce),
            ("catch_up", s.schedule_missed_catch_up),
            ("skip", s.schedule_missed_skip),
        ];
        let help = "Schedule fires that made no job of their own, by the schedule's missed-fire \
                    policy (coalesced into a later fire, beyond a catch-up bound, too late to skip).";
        labelled(
            e,
            ("durable_etl_schedule_fires_missed", help, counter),
            "policy",
            &policies,
        )
    }
}

/// The Prometheus text of a replica's counters and histograms (without the shared queue and
/// pool part).
pub fn render_worker(stats: &WorkerStats) -> String {
    let replica = Replica {
        snapshot: stats.snapshot(),
        failed: stats.failed_by_code().collect(),
    };
    let histograms = [
        (
            "durable_etl_claim_batch_size",
            "Jobs per non-empty claim.",
            &stats.claim_batch,
        ),
        (
            "durable_etl_commit_batch_size",
            "Jobs per group commit.",
            &stats.commit_batch,
        ),
        (
            "durable_etl_enqueue_to_start_seconds",
            "Time from a job becoming due to its claim (database clock).",
            &stats.pickup_latency,
        ),
        (
            "durable_etl_execution_seconds",
            "Time from claim to the job's transition.",
            &stats.execution,
        ),
        (
            "durable_etl_schedule_lateness_seconds",
            "Time from a schedule's fire to its job's insert (database clock).",
            &stats.schedule_lateness,
        ),
    ];
    let mut collectors: Vec<Box<dyn Collector>> = vec![Box::new(replica)];
    for (name, help, histogram) in histograms {
        let histogram = histogram.clone();
        collectors.push(Box::new(Named {
            name,
            help,
            histogram,
        }));
    }
    let mut out = String::new();
    encode(&mut out, collectors);
    out
}

/// What a replica's endpoint reports on: the current incarnation's counters and pool, or none
/// while the process starts its replica again (its cell moved). A process sends each new
/// incarnation's, and every later request, on a connection old or new, reads those.
pub type WorkerSource = tokio::sync::watch::Receiver<Option<(std::sync::Arc<WorkerStats>, Pool)>>;

/// The replicas a process's endpoint reports on: one, unlabelled (`None`), or one per cell it
/// serves, each under its cell's name.
pub type WorkerSources = Vec<(Option<String>, WorkerSource)>;

/// The replica's `/metrics` endpoint (its counters, its pool, and a queue sample per scrape) and
/// its `/readyz` ([`workers_ready`]), for the incarnation each of `sources` holds at each
/// request; while one holds none (its replica starts again), both answer `503`
/// (`database_unavailable`). Serves on `listener` until `shutdown` asks it to drain. A process that serves several cells reports every cell's replica in one exposition,
/// each sample labelled `cell` ([`merge_cells`]), and is ready while every one of them is.
///
/// # Errors
/// [`crate::Error::Unavailable`] when serving fails.
pub async fn serve_worker(
    listener: tokio::net::TcpListener,
    sources: WorkerSources,
    mut shutdown: crate::shutdown::Shutdown,
) -> Result<(), crate::Error> {
    use axum::response::IntoResponse;
    let sources = std::sync::Arc::new(sources);
    let ready = std::sync::Arc::clone(&sources);
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let current: Option<Vec<_>> = sources
                    .iter()
                    .map(|(cell, source)| Some((cell.clone(), source.borrow().clone()?)))
                    .collect();
                async move {
                    let Some(current) = current else {
                        return unavailable();
                    };
                    // Every cell's sample at once: a slow cell holds no other back.
                    let parts = current.into_iter().map(|(cell, (stats, pool))| async move {
                        let mut out = render_worker(&stats);
                        render_shared(&mut out, &pool).await;
                        (cell, out)
                    });
                    let parts = futures::future::join_all(parts).await;
                    let out = match parts.as_slice() {
                        [(None, out)] => out.clone(),
                        _ => merge_cells(&parts),
                    };
                    ([(axum::http::header::CONTENT_TYPE, TEXT_FORMAT)], out).into_response()
                }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let current: Option<Vec<_>> = ready
                    .iter()
                    .map(|(_, source)| {
                        let held = source.borrow();
                        held.as_ref().map(|(stats, _)| std::sync::Arc::clone(stats))
                    })
                    .collect();
                std::future::ready(match current {
                    Some(all) => workers_ready(all.iter().map(|s| &**s)),
                    None => unavailable(),
                })
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.reached(crate::shutdown::Stage::Draining).await;
        })
        .await
        .map_err(|_| crate::Error::Unavailable(None))
}

/// The Prometheus text of several cells' replicas as one exposition: each family once, its
/// HELP and TYPE as the first part that has it writes them, then its samples from every part in
/// order, each with the label `cell` (a cell's name: `[a-z][a-z0-9_]*`, nothing to escape) put
/// first. A part without a cell adds its samples as they are.
pub fn merge_cells(parts: &[(Option<String>, String)]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut families: std::collections::HashMap<&str, (usize, Vec<String>, Vec<String>)> =
        std::collections::HashMap::new();
    for (index, (cell, text)) in parts.iter().enumerate() {
        let mut family = "";
        for line in text.lines() {
            if let Some(descriptor) = line.strip_prefix("# ") {
                let mut words = descriptor.split(' ');
                let (_, name) = (words.next(), words.next());
                let Some(name) = name else { continue };
                family = name;
                let entry = families.entry(name).or_insert_with(|| {
                    order.push(name);
                    (index, Vec::new(), Vec::new())
                });
                if entry.0 == index {
                    entry.1.push(line.to_owned());
                }
                continue;
            }
            let sample = match cell {
                Some(cell) => labelled_line(line, cell),
                None => line.to_owned(),
            };
            if let Some(entry) = families.get_mut(family) {
                entry.2.push(sample);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some((_, header, samples)) = families.remove(name) {
            for line in header.iter().chain(&samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Sample `line` (`name value` or `name{labels} value`) with the label `cell="CELL"` first.
fn labelled_line(line: &str, cell: &str) -> String {
    match line.find(['{', ' ']) {
        Some(at) if line[at..].starts_with("{}") => {
            format!("{}{{cell=\"{cell}\"}}{}", &line[..at], &line[at + 2..])
        }
        Some(at) if line[at..].starts_with('{') => {
            format!("{}{{cell=\"{cell}\",{}", &line[..at], &line[at + 1..])
        }
        Some(at) => format!("{}{{cell=\"{cell}\"}}{}", &line[..at], &line[at..]),
        None => line.to_owned(),
    }
}

/// What a replica's endpoint answers while its replica is not ready (its session is down, or no
/// incarnation runs): `503` with the problem `database_unavailable`.
fn unavailable() -> axum::response::Response {
    use axum::response::IntoResponse;
    crate::service::problem::Problem::new(crate::codes::Code::DatabaseUnavailable).into_response()
}

/// A process's readiness, for a probe: `200 {"status": "ready"}` while the session of each of
/// its replicas (one per cell it serves) is up (it holds its owner lock and listens for wakes),
/// else `503` with the problem `database_unavailable`. Reads the replicas' own gauges and sends
/// no statement, so a probe every few milliseconds costs the database nothing (a `/metrics`
/// scrape counts the queue).
pub fn workers_ready<'a>(
    stats: impl IntoIterator<Item = &'a WorkerStats>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let up = |s: &WorkerStats| s.session_up.load(std::sync::atomic::Ordering::Relaxed) == 1;
    if stats.into_iter().all(up) {
        axum::Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        unavailable()
    }
}

/// The content type of the Prometheus text exposition format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

#[cfg(test)]
mod tests;
