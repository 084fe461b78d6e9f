//! The JSONL the harness reads on standard output: the descriptor, the samples and the final
//! accounting.
//!
//! Invariants:
//! - Standard output carries only these lines, one JSON object each, written whole under the
//!   stdout lock (logs go to standard error).
//! - Samples are clock-aligned: the first tick is at the next multiple of `SAMPLE_EVERY_S` of
//!   the wall clock, and rates are divided by the real time since the previous tick.
//! - Stopping the sampler emits one last sample (the pending counts), so nothing counted is lost
//!   at SIGTERM.

use crate::settings::{Mode, Settings};
use crate::Shared;
use durable_etl::worker::stats::WorkerStats;
use durable_etl::Pool;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// The system's name in every record.
pub(crate) const SYSTEM: &str = "durable-etl";

/// The window of the pickup percentiles, in seconds (the contract's rolling 30 s).
const LATENCY_WINDOW_S: u64 = 30;

/// The current wall clock as the harness writes it: ISO 8601, UTC, milliseconds.
pub(crate) fn now_iso() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// Writes `record` as one line on standard output. A closed stdout (the harness gone) is not an
/// error the adapter can act on: the line is dropped.
pub(crate) fn emit(record: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{record}").and_then(|()| out.flush());
}

/// Writes one sample of `metric`.
pub(crate) fn sample(instance: u32, t: &str, metric: &str, value: f64, window_s: f64) {
    emit(&json!({
        "t": t,
        "system": SYSTEM,
        "instance_id": instance,
        "kind": "adapter",
        "subject_kind": "adapter",
        "subject": "",
        "metric": metric,
        "value": value,
        "window_s": window_s,
    }));
}

/// What a tick compares with: the previous tick's time and counts.
struct Last {
    /// When the previous tick was taken.
    at: Instant,
    /// Jobs enqueued by then.
    enqueued: u64,
    /// Jobs the replica had completed by then.
    completed: u64,
}

/// Samples until `stop`, then emits the last sample and returns.
pub(crate) async fn run(
    settings: Settings,
    shared: Arc<Shared>,
    stats: Arc<WorkerStats>,
    pool: Pool,
    stop: CancellationToken,
) {
    let every = settings.sample_every;
    let mut last = Last {
        at: Instant::now(),
        enqueued: shared.enqueued.load(Ordering::Relaxed),
        completed: stats.succeeded.load(Ordering::Relaxed),
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(until_boundary(every)) => {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = ticker.tick() => tick(&settings, &shared, &stats, &pool, &mut last).await,
                }
            }
        }
    }
    tick(&settings, &shared, &stats, &pool, &mut last).await;
}

/// The time from now to the next multiple of `every` of the wall clock.
fn until_boundary(every: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let every_ms = every.as_millis().max(1);
    let into = now.as_millis() % every_ms;
    Duration::from_millis(u64::try_from(every_ms - into).unwrap_or(0))
}

/// Emits one sample of every metric.
async fn tick(
    settings: &Settings,
    shared: &Shared,
    stats: &WorkerStats,
    pool: &Pool,
    last: &mut Last,
) {
    let now = Instant::now();
    let elapsed = now.duration_since(last.at).as_secs_f64().max(0.001);
    let enqueued = shared.enqueued.load(Ordering::Relaxed);
    let completed = stats.succeeded.load(Ordering::Relaxed);
    let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / elapsed;
    let (enqueue_rate, completion_rate) = (
        rate(enqueued, last.enqueued),
        rate(completed, last.completed),
    );
    *last = Last {
        at: now,
        enqueued,
        completed,
    };
    let t = now_iso();
    let instance = settings.instance;
    let window = settings.sample_every.as_secs_f64();
    let second = u64::try_from(crate::now_micros() / 1_000_000).unwrap_or(0);
    if let Some(p) = shared.pickup_percentiles(second, LATENCY_WINDOW_S) {
        for (metric, value) in [
            ("claim_p50_ms", p.p50),
            ("claim_p95_ms", p.p95),
            ("claim_p99_ms", p.p99),
        ] {
            sample(instance, &t, metric, value, LATENCY_WINDOW_S as f64);
        }
    }
    sample(instance, &t, "enqueue_rate", enqueue_rate, window);
    sample(instance, &t, "completion_rate", completion_rate, window);
    let target = if settings.produces && settings.mode == Mode::Fixed {
        settings.rate
    } else {
        0.0
    };
    sample(instance, &t, "producer_target_rate", target, 0.0);
    match depth(pool).await {
        Ok(q) => {
            for (metric, value) in [
                ("queue_depth", q.due),
                ("running_depth", q.running),
                ("scheduled_depth", q.deferred),
                ("total_backlog", q.due + q.running + q.deferred),
            ] {
                sample(instance, &t, metric, value as f64, 0.0);
            }
        }
        Err(code) => tracing::warn!(%code, "queue depth not sampled"),
    }
}

/// The queue's depth by state (durable-etl's own sample, one statement).
async fn depth(pool: &Pool) -> Result<durable_etl::service::metrics::QueueSample, String> {
    let conn = durable_etl::db::checkout(pool)
        .await
        .map_err(|e| e.code().as_str().to_owned())?;
    durable_etl::service::metrics::sample_queue(&*conn)
        .await
        .map_err(|e| crate::db_code(&e))
}

/// The descriptor record, emitted once at start-up.
pub(crate) fn descriptor(settings: &Settings, db_name: &str, event_tables: &[&str]) -> Value {
    let schema_version = durable_etl::schema::MIGRATIONS
        .last()
        .map_or(0, |m| m.version);
    json!({
        "kind": "descriptor",
        "system": SYSTEM,
        "instance_id": settings.instance,
        "event_tables": event_tables,
        "event_indexes": [],
        "extensions": [],
        "version": env!("CARGO_PKG_VERSION"),
        "schema_version": schema_version.to_string(),
        "db_name": db_name,
        "started_at": now_iso(),
    })
}
