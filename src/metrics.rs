//! Prometheus text exposition of a replica's and an API server's metrics.
//!
//! Invariants this module keeps:
//! - Every label value comes from a fixed allow-list (stable codes, claim triggers, recovery
//!   reasons, status classes): the number of series is bounded whatever the traffic. No id,
//!   principal, key or request value is ever a label.
//! - Latency histograms use fixed buckets; the enqueue→start latency is computed from database
//!   timestamps, never from a replica's clock.
//! - Queue depth and oldest due job age are sampled by one query per scrape, not per job, and that
//!   query reads only active rows through the partial indexes (never the terminal history).

use crate::codes::Code;
use crate::db::Pool;
use crate::worker::stats::{StatsSnapshot, WorkerStats};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_postgres::GenericClient;

/// Bucket upper bounds, in seconds, of the latency histograms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];
/// Bucket upper bounds of the claim batch size histogram, in jobs.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// A fixed-bucket histogram, safe to observe from any task.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds of the buckets.
    bounds: &'static [f64],
    /// Counts per bucket (not cumulative), plus one for `+Inf`.
    counts: Vec<AtomicU64>,
    /// Sum of observations, in millionths.
    sum_micros: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one observation (negative values count as zero).
    pub fn observe(&self, value: f64) {
        let value = value.max(0.0);
        let slot = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        if let Some(count) = self.counts.get(slot) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        // Saturating float-to-int conversion: a huge observation cannot wrap the sum.
        self.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }

    /// How many observations were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Appends this histogram as `name` with `help`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(bound) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

/// Appends one metric family header.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends a single unlabelled sample.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// Appends a family whose samples differ by one label drawn from a fixed list.
fn labelled(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    label: &str,
    samples: &[(&str, u64)],
) {
    family(out, name, kind, help);
    for (value, n) in samples {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
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
/// `etl_job_records_pending_due_idx`, `status = 'running'` for `etl_job_records_running_owner_idx`),
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

/// Appends the queue sample and the pool's usage; a failed sample is reported as `up 0`.
pub async fn render_shared(out: &mut String, pool: &Pool) {
    let state = pool.state();
    single(
        out,
        "durable_etl_pool_connections",
        "gauge",
        "Open pooled connections.",
        state.connections,
    );
    single(
        out,
        "durable_etl_pool_idle_connections",
        "gauge",
        "Idle pooled connections.",
        state.idle_connections,
    );
    let sample = match crate::db::checkout(pool).await {
        Ok(conn) => sample_queue(&*conn).await.ok(),
        Err(_) => None,
    };
    single(
        out,
        "durable_etl_database_up",
        "gauge",
        "1 if the last queue sample succeeded.",
        u8::from(sample.is_some()),
    );
    let sample = sample.unwrap_or_default();
    labelled(
        out,
        "durable_etl_queue_jobs",
        "gauge",
        "Active jobs by state, sampled at scrape time.",
        "state",
        &[
            ("due", u64::try_from(sample.due).unwrap_or(0)),
            ("deferred", u64::try_from(sample.deferred).unwrap_or(0)),
            ("running", u64::try_from(sample.running).unwrap_or(0)),
        ],
    );
    single(
        out,
        "durable_etl_queue_oldest_due_seconds",
        "gauge",
        "Age of the oldest due pending job (database clock).",
        sample.oldest_due_seconds,
    );
}

/// The Prometheus text of a replica's counters (without the shared queue and pool part).
pub fn render_worker(stats: &WorkerStats) -> String {
    let s: StatsSnapshot = stats.snapshot();
    let mut out = String::new();
    let counter =
        |out: &mut String, name: &str, help: &str, v: u64| single(out, name, "counter", help, v);
    counter(
        &mut out,
        "durable_etl_jobs_claimed_total",
        "Jobs claimed.",
        s.claimed,
    );
    counter(
        &mut out,
        "durable_etl_jobs_succeeded_total",
        "Jobs that ended succeeded.",
        s.succeeded,
    );
    counter(
        &mut out,
        "durable_etl_jobs_retried_total",
        "Attempts that went back to pending for a retry.",
        s.retried,
    );
    counter(
        &mut out,
        "durable_etl_jobs_cancelled_total",
        "Running jobs that ended cancelled.",
        s.cancelled,
    );
    counter(
        &mut out,
        "durable_etl_jobs_released_total",
        "Jobs given back on shutdown or restart.",
        s.released,
    );
    counter(
        &mut out,
        "durable_etl_lease_lost_total",
        "Jobs abandoned because their lease was gone.",
        s.lease_lost,
    );
    counter(
        &mut out,
        "durable_etl_transitions_unwritten_total",
        "Transitions not written (database unavailable).",
        s.unwritten,
    );
    counter(
        &mut out,
        "durable_etl_claims_empty_total",
        "Claims that found no job.",
        s.empty_claims,
    );
    counter(
        &mut out,
        "durable_etl_db_round_trips_total",
        "Statements the replica sent on pooled connections (claims, commits, heartbeats, ...).",
        s.round_trips,
    );
    counter(
        &mut out,
        "durable_etl_notifications_total",
        "Notifications received.",
        s.notifications,
    );
    counter(
        &mut out,
        "durable_etl_session_reconnects_total",
        "Times the LISTEN/owner session reconnected.",
        s.reconnects,
    );
    counter(
        &mut out,
        "durable_etl_poll_found_work_total",
        "Polls that found work no notification announced.",
        s.poll_found_work,
    );
    single(
        &mut out,
        "durable_etl_session_up",
        "gauge",
        "1 while the LISTEN/owner session is up.",
        s.session_up,
    );
    let failed: Vec<(&str, u64)> = stats.failed_by_code().collect();
    labelled(
        &mut out,
        "durable_etl_jobs_failed_total",
        "counter",
        "Jobs that ended failed, by stored code.",
        "code",
        &failed,
    );
    labelled(
        &mut out,
        "durable_etl_claims_total",
        "counter",
        "Claim statements, by what triggered them.",
        "trigger",
        &[
            ("notify", s.claims_by_notify),
            ("poll", s.claims_by_poll),
            ("due", s.claims_by_due),
            ("drain", s.claims_by_drain),
            ("catch_up", s.claims_by_reconnect),
            (
                "other",
                // The snapshot reads `claims` before the by-trigger counters, so claims counted
                // in between can make their sum exceed it: saturate instead of wrapping.
                s.claims
                    .saturating_sub(s.claims_by_notify)
                    .saturating_sub(s.claims_by_poll)
                    .saturating_sub(s.claims_by_due)
                    .saturating_sub(s.claims_by_drain)
                    .saturating_sub(s.claims_by_reconnect),
            ),
        ],
    );
    labelled(
        &mut out,
        "durable_etl_leases_recovered_total",
        "counter",
        "Running jobs recovered, by reason.",
        "reason",
        &[
            ("expired", s.recovered_expired),
            ("dead_owner", s.recovered_dead_owner),
        ],
    );
    stats.claim_batch.render(
        &mut out,
        "durable_etl_claim_batch_size",
        "Jobs per non-empty claim.",
    );
    stats.commit_batch.render(
        &mut out,
        "durable_etl_commit_batch_size",
        "Jobs per group commit.",
    );
    stats.pickup_latency.render(
        &mut out,
        "durable_etl_enqueue_to_start_seconds",
        "Time from a job becoming due to its claim (database clock).",
    );
    stats.execution.render(
        &mut out,
        "durable_etl_execution_seconds",
        "Time from claim to the job's transition.",
    );
    out
}

/// The codes a job row may store, in declaration order.
pub fn stored_codes() -> impl Iterator<Item = Code> {
    Code::ALL.iter().copied().filter(|c| c.is_stored_failure())
}

/// The replica's `/metrics` endpoint: its counters, its pool, and a queue sample per scrape.
/// Serves on `listener` until `shutdown` asks it to drain.
///
/// # Errors
/// [`crate::Error::Unavailable`] if the server stops abnormally.
pub async fn serve_worker(
    listener: tokio::net::TcpListener,
    stats: std::sync::Arc<WorkerStats>,
    pool: Pool,
    mut shutdown: crate::shutdown::Shutdown,
) -> Result<(), crate::Error> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (stats, pool) = (std::sync::Arc::clone(&stats), pool.clone());
            async move {
                let mut out = render_worker(&stats);
                render_shared(&mut out, &pool).await;
                ([(axum::http::header::CONTENT_TYPE, TEXT_FORMAT)], out)
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.reached(crate::shutdown::Stage::Draining).await;
        })
        .await
        .map_err(|_| crate::Error::Unavailable(None))
}

/// The content type of the Prometheus text exposition format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_into_cumulative_buckets() {
        let h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0, -1.0] {
            h.observe(v);
        }
        assert_eq!(h.count(), 5);
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"1\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"2\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_sum 6\n"), "{out}");
    }

    #[test]
    fn a_scrape_between_two_counter_bumps_does_not_underflow() {
        // A snapshot reads `claims` first and `claims_by_notify` later: a claim counted in
        // between makes the by-trigger count exceed the total it read.
        let stats = WorkerStats::default();
        stats.claims_by_notify.store(2, Ordering::Relaxed);
        stats.claims.store(1, Ordering::Relaxed);
        let text = render_worker(&stats);
        assert!(
            text.contains("durable_etl_claims_total{trigger=\"other\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn worker_metrics_have_only_fixed_labels() {
        let stats = WorkerStats::default();
        stats.record(crate::worker::completer::Transition::Failed(
            Code::RecordInvalid,
        ));
        let text = render_worker(&stats);
        assert!(text.contains("durable_etl_jobs_failed_total{code=\"record_invalid\"} 1"));
        assert!(text.contains("durable_etl_claims_total{trigger=\"notify\"} 0"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let labels = line.split('{').nth(1).unwrap_or("");
            assert!(labels.len() < 40, "{line}");
        }
    }
}
