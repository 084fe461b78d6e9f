//! durable-etl's adapter for the public multi-system benchmark
//! (<https://github.com/hardbyte/postgresql-job-queue-benchmarking>): one long-running replica
//! process that reads its settings from the environment, produces and consumes jobs through
//! durable-etl's public API only, writes JSONL to standard output (a descriptor line, then
//! clock-aligned samples), and exits 0 within 5 s of SIGTERM. On top of the harness's contract it
//! counts lost jobs and duplicate effects exactly, from a ledger of its own
//! (`harness_adapter_ledger`), and writes that count as its last line.
//!
//! Run it against a local PostgreSQL (docs/benchmarks.md, "The multi-system harness"):
//!
//! ```text
//! createdb -h 127.0.0.1 -U postgres durable_etl_bench
//! cargo build --release --example harness_adapter
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_etl_bench PRODUCER_RATE=800 \
//!   SAMPLE_EVERY_S=5 target/release/examples/harness_adapter
//! ```
//!
//! Invariants:
//! - Standard output is JSONL only; logs go to standard error and never carry a payload.
//! - Shutdown at SIGTERM (or SIGINT) is ordered and bounded: the producer stops (an insert under
//!   way finishes), the replica drains (running jobs get [`SHUTDOWN_GRACE`], the rest are
//!   released to `pending`), the last sample is emitted, then the ledger is counted within
//!   [`COUNT_BUDGET`]; the process exits 0 within 5 s of the signal.
//! - `SCENARIO=accounting` only counts (no time bound) and exits 0 when nothing was lost or
//!   duplicated, 1 otherwise: the exact count after a run of several replicas, once all stopped.

use durable_etl::{DatabaseConfig, Jobs, Registry, Secret, Worker, WorkerConfig};
use serde_json::json;
use settings::{Scenario, Settings};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

mod kind;
mod ledger;
mod producer;
mod samples;
mod settings;
mod window;

/// The tables every job writes, which the harness samples for dead tuples (also in
/// `adapter.json`, the harness's static manifest). The ledger is the adapter's instrument, not
/// the system's, so it is not among them.
const EVENT_TABLES: &[&str] = &[
    "public.etl_job_intake",
    "public.etl_job_records",
    "public.etl_job_outcomes",
    "public.etl_job_attempts",
];

/// The owner of every job the adapter enqueues.
const OWNER: &str = "harness-adapter";

/// The digest key when `DURABLE_ETL_SECRET` is not set (the harness does not set it; a
/// benchmark's digests protect nothing).
const BENCH_SECRET: &str = "harness-adapter-bench-secret";

/// Time the replica's running jobs get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(1000);

/// The longest the producer's last insert is waited for after SIGTERM.
const PRODUCER_BUDGET: Duration = Duration::from_millis(500);

/// The longest the replica's drain is waited for after SIGTERM.
const DRAIN_BUDGET: Duration = Duration::from_millis(1500);

/// The longest the last sample is waited for after SIGTERM.
const SAMPLE_BUDGET: Duration = Duration::from_millis(500);

/// The longest the ledger's count is waited for after SIGTERM. With the budgets above, the
/// process exits within 4 s of the signal, under the contract's 5 s.
const COUNT_BUDGET: Duration = Duration::from_millis(1500);

/// Why the adapter could not run (exit code 2 for a setting, 1 otherwise).
#[derive(Debug, thiserror::Error)]
enum AdapterError {
    /// A variable of the environment holds no value the adapter takes.
    #[error(transparent)]
    Setting(#[from] settings::SettingError),
    /// durable-etl refused to start (its code is in the message, never a payload).
    #[error("durable-etl: {0} ({code})", code = .0.code().as_str())]
    Durable(#[from] durable_etl::Error),
    /// The adapter's own statements failed.
    #[error("the ledger's statements failed: SQLSTATE {}", db_code(.0))]
    Ledger(#[from] tokio_postgres::Error),
    /// `DURABLE_ETL_SECRET` is set but too short to key digests.
    #[error("DURABLE_ETL_SECRET is not valid: at least 16 bytes")]
    Secret,
    /// The ledger's producer numbers are spent.
    #[error("no producer number left (harness_adapter_producers is past 2^23)")]
    ProducerNumbers,
}

/// What the producer, the handler and the sampler share.
#[derive(Default)]
pub(crate) struct Shared {
    /// Pickup latencies (insert to handler start) of the last seconds.
    pickups: Mutex<Option<window::Window>>,
    /// Jobs whose enqueue committed.
    pub(crate) enqueued: AtomicU64,
    /// Inserts that failed.
    pub(crate) enqueue_errors: AtomicU64,
    /// Handler runs.
    pub(crate) executions: AtomicU64,
    /// Handler runs of jobs claimed before (fencing token above 1).
    pub(crate) reclaimed: AtomicU64,
}

impl Shared {
    /// Records a pickup latency of `micros` taken at `now_us` (Unix microseconds).
    pub(crate) fn record_pickup(&self, now_us: i64, micros: u64) {
        let second = u64::try_from(now_us / 1_000_000).unwrap_or(0);
        let mut pickups = self.pickups.lock().unwrap_or_else(PoisonError::into_inner);
        pickups
            .get_or_insert_with(window::Window::new)
            .record(second, micros);
    }

    /// The pickup percentiles of the `seconds` seconds up to Unix second `now`.
    pub(crate) fn pickup_percentiles(&self, now: u64, seconds: u64) -> Option<window::Percentiles> {
        let pickups = self.pickups.lock().unwrap_or_else(PoisonError::into_inner);
        pickups.as_ref()?.percentiles(now, seconds)
    }
}

/// The wall clock in microseconds since the Unix epoch.
pub(crate) fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// A database error's SQLSTATE (never its message, which may quote data).
pub(crate) fn db_code(e: &tokio_postgres::Error) -> String {
    e.code()
        .map_or_else(|| "none (connection)".to_owned(), |c| c.code().to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    durable_etl::telemetry::init(durable_etl::telemetry::LogFormat::Human);
    // Installed first, so a SIGTERM during start-up is not lost.
    let signal = CancellationToken::new();
    let (stopper, mut shutdown) = (signal.clone(), durable_etl::shutdown::signals());
    tokio::spawn(async move {
        shutdown
            .reached(durable_etl::shutdown::Stage::Draining)
            .await;
        stopper.cancel();
    });
    let outcome = match Settings::from_lookup(|name| std::env::var(name).ok()) {
        Ok(settings) => match settings.scenario {
            Scenario::LongHorizon => long_horizon(settings, signal).await,
            Scenario::Accounting => accounting(settings).await,
        },
        Err(e) => Err(e.into()),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "harness adapter stopped");
            match e {
                AdapterError::Setting(_) | AdapterError::Secret => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// The database configuration of `settings`, with room in the pool for the replica, the producer
/// and the sampler.
fn database(settings: &Settings) -> DatabaseConfig {
    DatabaseConfig {
        pool_max_size: 12,
        ..DatabaseConfig::new(settings.database_url.clone())
    }
}

/// The database's name, as the descriptor reports it.
fn db_name(settings: &Settings) -> String {
    settings
        .database_url
        .parse::<tokio_postgres::Config>()
        .ok()
        .and_then(|c| c.get_dbname().map(str::to_owned))
        .unwrap_or_default()
}

/// The `long_horizon` scenario: produce and consume until SIGTERM.
async fn long_horizon(
    settings: Settings,
    signal: CancellationToken,
) -> Result<ExitCode, AdapterError> {
    let db = database(&settings);
    durable_etl::migrate(&db).await?;
    let pool = durable_etl::connect_pool(&db, "harness-adapter").await?;
    let number = {
        let mut client = durable_etl::db::connect(&db, "harness-adapter").await?;
        ledger::prepare(&mut client).await?
    };
    if number >= 1 << (63 - producer::COUNTER_BITS) {
        return Err(AdapterError::ProducerNumbers);
    }
    let secret = match std::env::var("DURABLE_ETL_SECRET") {
        Ok(key) => Secret::new(key),
        Err(_) => Secret::new(BENCH_SECRET),
    }
    .ok_or(AdapterError::Secret)?;
    let shared = Arc::new(Shared::default());
    let handler = kind::RunBenchJob {
        work: settings.work,
        shared: Arc::clone(&shared),
    };
    let config = WorkerConfig {
        slots: settings.workers,
        shutdown_grace: SHUTDOWN_GRACE,
        ..WorkerConfig::default()
    };
    let worker = Worker::start(pool.clone(), &db, config, Registry::new().perform(handler)).await?;
    let stats = worker.stats_handle();
    samples::emit(&samples::descriptor(
        &settings,
        &db_name(&settings),
        EVENT_TABLES,
    ));
    let replica = worker.spawn();

    let stop_producer = CancellationToken::new();
    let producer = producer::Producer::new(
        settings.clone(),
        pool.clone(),
        Jobs::new(secret, OWNER),
        Arc::clone(&shared),
        number,
    );
    let producer = tokio::spawn(producer.run(stop_producer.clone()));
    let stop_sampler = CancellationToken::new();
    let sampler = tokio::spawn(samples::run(
        settings.clone(),
        Arc::clone(&shared),
        Arc::clone(&stats),
        pool.clone(),
        stop_sampler.clone(),
    ));

    signal.cancelled().await;
    tracing::info!("SIGTERM: stopping");
    stop_producer.cancel();
    if timeout(PRODUCER_BUDGET, producer).await.is_err() {
        tracing::warn!("the producer's last insert did not finish in time");
    }
    match timeout(DRAIN_BUDGET, replica.stop()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            code = e.code().as_str(),
            "the replica stopped with an error"
        ),
        Err(_) => tracing::warn!("the replica did not drain in time"),
    }
    stop_sampler.cancel();
    if timeout(SAMPLE_BUDGET, sampler).await.is_err() {
        tracing::warn!("the last sample was not taken in time");
    }
    let count = timeout(COUNT_BUDGET, async {
        let conn = durable_etl::db::checkout(&pool).await.ok()?;
        ledger::count(&*conn).await.ok()
    })
    .await
    .ok()
    .flatten();
    report(&settings, count, &shared);
    Ok(ExitCode::SUCCESS)
}

/// The `accounting` scenario: count the ledger, with no time bound; exit 1 if anything was lost
/// or duplicated.
async fn accounting(settings: Settings) -> Result<ExitCode, AdapterError> {
    let db = database(&settings);
    let mut client = durable_etl::db::connect(&db, "harness-adapter").await?;
    ledger::prepare(&mut client).await?;
    let count = ledger::count(&client).await?;
    report(&settings, Some(count), &Shared::default());
    Ok(if count.is_exact() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Writes the final count: one `accounting` record, and its figures as adapter samples too.
/// Without a count (it did not finish in time), the record says so and names the scenario that
/// counts without a bound.
fn report(settings: &Settings, count: Option<ledger::Count>, shared: &Shared) {
    use std::sync::atomic::Ordering::Relaxed;
    let t = samples::now_iso();
    let process = json!({
        "enqueue_errors": shared.enqueue_errors.load(Relaxed),
        "executions": shared.executions.load(Relaxed),
        "reclaimed_executions": shared.reclaimed.load(Relaxed),
    });
    let Some(count) = count else {
        samples::emit(&json!({
            "kind": "accounting",
            "system": samples::SYSTEM,
            "instance_id": settings.instance,
            "t": t,
            "counted": false,
            "detail": "the ledger was not counted in time: run again with SCENARIO=accounting",
            "this_process": process,
        }));
        return;
    };
    for (metric, value) in [
        ("lost_jobs", count.lost),
        ("duplicate_effects", count.duplicate_effects),
        ("unknown_effects", count.unknown_effects),
        ("unfinished_jobs", count.unfinished),
        ("enqueued_total", count.enqueued),
        ("completed_total", count.completed),
    ] {
        samples::sample(settings.instance, &t, metric, value as f64, 0.0);
    }
    samples::emit(&json!({
        "kind": "accounting",
        "system": samples::SYSTEM,
        "instance_id": settings.instance,
        "t": t,
        "counted": true,
        "exact": count.is_exact(),
        "ledger": count,
        "this_process": process,
    }));
}
