//! # durable-etl
//!
//! Durable ETL jobs run out of PostgreSQL. An accepted job is a row of `etl_job_intake` (written
//! once) and, while it is pending or running, a row of `etl_job_records` with its payload and
//! lease; replicas claim due rows with `FOR NO KEY UPDATE SKIP LOCKED`, fence every later write
//! with the claim's `lease_claim_id`, and commit a job's effects with the statement that deletes
//! its live row and appends its `succeeded` outcome (with the response ledger) in one
//! transaction. `etl_jobs` shows every job. PostgreSQL, not a scheduler, is the correctness
//! boundary.
//!
//! The `durable-etl` binary (`migrate`, `serve`, `work`, `demo`, `bench`, …) is built with the
//! default `cli` feature; a library user who sets `default-features = false` links only what is
//! below, without clap, reqwest or humantime.
//!
//! ## Quick start
//! Connect a pool, migrate, register a handler, start a [`Worker`], and enqueue a job in your own
//! transaction, so that it commits (or rolls back) with your domain writes:
//!
//! ```no_run
//! use durable_etl::digest::DigestKind;
//! use durable_etl::etl::{enqueue::MAX_ATTEMPTS_DEFAULT, load::EtlLoad, request};
//! use durable_etl::intake::IntakeLimits;
//! use durable_etl::{
//!     connect_pool, enqueue, migrate_up, shutdown, DatabaseConfig, NewJob, Registry, Secret,
//!     Worker, WorkerConfig,
//! };
//!
//! # async fn quick_start() -> Result<(), durable_etl::Error> {
//! let db = DatabaseConfig {
//!     url: "postgres://postgres@127.0.0.1:5432/app".to_owned(),
//!     ..DatabaseConfig::default()
//! };
//! // Migrate (advisory-locked, so replicas may all do it at start-up).
//! let mut session = durable_etl::db::connect(&db, "migrate").await?;
//! migrate_up(&mut session).await?;
//!
//! // A replica running the shipped ETL kind (register your own `Handler`s the same way).
//! let pool = connect_pool(&db, "worker").await?;
//! let registry = Registry::new().register(EtlLoad::default());
//! let worker = Worker::start(pool.clone(), &db, WorkerConfig::default(), registry).await?;
//! let (stop, until) = shutdown::manual();
//! let replica = tokio::spawn(worker.run(until));
//!
//! // Enqueue inside the caller's transaction: the job exists only if the transaction commits.
//! let secret = Secret::new(b"a secret of at least 16 bytes".to_vec())
//!     .ok_or(durable_etl::ConfigError::Secret)?;
//! let owner = secret.digest(DigestKind::Principal, b"tenant-42");
//! let body = serde_json::json!({
//!     "dataset": "prices", "key": "sku",
//!     "records": [{"sku": "a-1", "price": "3.50"}], "transform": {"cast": {"price": "decimal"}}
//! });
//! let etl = request::parse(&body, IntakeLimits::default())?;
//! let mut conn = pool.get().await.map_err(durable_etl::db::pool_error)?;
//! let tx = conn.transaction().await?;
//! // … your own writes on `tx` …
//! let job = NewJob {
//!     idempotency_key: "order-7",
//!     request: &etl,
//!     max_attempts: MAX_ATTEMPTS_DEFAULT,
//! };
//! let queued = enqueue(&tx, &secret, &owner, job).await?;
//! tx.commit().await?;
//! println!("job {} queued", queued.id);
//!
//! stop.request(shutdown::Stage::Draining);
//! replica.await.map_err(|_| durable_etl::Error::Internal)??;
//! # Ok(())
//! # }
//! ```
//!
//! `examples/custom_kind.rs` writes a job kind of its own and shows the rest of the runtime
//! contract: a deferred job whose effects recheck the domain state under the fence, and the ledger.
//!
//! ## Layout
//! - [`api`]: the HTTP API ([`app`] builds the router), problem responses, OpenAPI.
//! - [`api_keys`]: API keys, stored only as keyed digests, mapped to owners.
//! - [`codes`]: the one list of stable codes used at every boundary ([`Code`]).
//! - [`config`]: typed configuration with documented defaults and `validate()`.
//! - [`db`]: the pool, sessions and their settings; database creation for tools.
//! - [`digest`]: keyed digests of principals, idempotency keys, API keys and requests.
//! - [`enqueue`]: the one transactional, idempotent insert path of every kind.
//! - [`error`]: the crate's [`Error`], mapped to codes and exit codes.
//! - [`etl`]: the shipped job kind: intake validation, transactional idempotent enqueue, the load.
//! - [`handler`]: the handler contract: compute without a connection, effects in the fence.
//! - [`intake`]: intake limits and rejections.
//! - [`job`]: typed jobs ([`Job`], [`Perform`]) and [`Jobs`], the front door: enqueue in the
//!   caller's transaction, status, cancel and listing.
//! - [`jobs`]: owner-scoped status, listing and cancellation.
//! - [`metrics`]: the worker's and the API's Prometheus text.
//! - [`notifier`]: one coalescing NOTIFY connection per process, for enqueues that skip the
//!   trigger's own NOTIFY.
//! - [`schema`]: embedded migrations and the release-compatibility check.
//! - [`shutdown`]: the one shutdown signal the worker and the HTTP server watch.
//! - [`state`]: [`JobState`], the five job states.
//! - [`telemetry`]: log output that never carries payloads, principals or SQL.
//! - `time` (crate-private): canonical UTC timestamps.
//! - [`worker`]: the replica: its roles claim, execute, commit, heartbeat, recover and release.
//!
//! The binary side (`src/main.rs`, not part of the library): `cli` (flags and commands), `demo`
//! (the one-command tour) and `bench` (end-to-end figures of real replicas).

/// A crash point: with the `failpoints` feature and `FAILPOINTS=<name>=return` (the `fail`
/// crate's syntax, e.g. `1*return` to fire once), the process aborts right here, as if killed at
/// this step; without the feature it compiles to nothing. The fault tests place kills exactly.
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| std::process::abort())
    };
}

// The SQL fragments the statements that end or fence a job share; declared before every module
// so each sees them.
#[macro_use]
mod sql;
pub mod api;
pub mod api_keys;
pub mod codes;
pub mod config;
pub mod db;
pub mod digest;
pub mod enqueue;
pub mod error;
pub mod etl;
pub mod handler;
pub mod intake;
pub mod job;
pub mod jobs;
pub mod metrics;
pub mod notifier;
pub mod schema;
pub mod shutdown;
pub mod state;
pub mod telemetry;
pub(crate) mod time;
pub mod worker;

// The unit tests that need a database use the integration suite's template-database harness;
// the file names this crate as `durable_etl`, as the integration suite sees it.
#[cfg(test)]
extern crate self as durable_etl;
// Shared with the integration suite, which uses all of it: here, some items go unused, and its
// `pub` items are the suite's interface.
#[cfg(test)]
#[allow(dead_code, unreachable_pub)]
#[path = "../tests/it/support/test_db.rs"]
pub(crate) mod test_db;

pub use api::{app, AppState};
pub use codes::Code;
pub use config::{ApiConfig, ConfigError, DatabaseConfig, WorkerConfig};
pub use db::{connect_pool, Pool};
pub use digest::Secret;
pub use enqueue::Enqueued;
pub use error::Error;
pub use handler::{Effects, Handler, JobContext, JobError, LedgerEntry, NoEffects, Registry};
pub use job::{Apply, EnqueueOptions, Job, Jobs, Perform};
pub use notifier::{skip_trigger_notify, Notifier};
pub use schema::{check_compatible, migrate_down_to, migrate_up};
pub use shutdown::Shutdown;
pub use state::JobState;
pub use worker::Worker;
