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
//! A job kind is a Rust type ([`Job`]); a typed handler ([`Perform`]) runs it, computing with no
//! connection held and writing its effects ([`Apply`]) inside the fenced transaction that records
//! its success; [`Jobs`] enqueues it in your own transaction, so that it commits (or rolls back)
//! with your domain writes, and reads and cancels jobs for their owner
//! (`examples/quick_start.rs`, run by CI):
//!
//! ```no_run
#![doc = include_str!("../examples/quick_start.rs")]
//! ```
//!
//! `examples/custom_kind.rs` shows the rest of the runtime contract: effects that recheck the
//! domain state under the fence, a deferred job, idempotent enqueue, replacement, and the
//! fencing token handed to an outside system. The shipped ETL kind ([`etl`]) is enqueued with
//! [`etl::enqueue`] and run by [`etl::load::EtlLoad`].
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
//! - [`replica`]: a [`Worker`] on a task of its own, drained and stopped through its handle.
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
pub mod replica;
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
pub use replica::Replica;
pub use schema::{check_compatible, migrate, migrate_down_to, migrate_up};
pub use shutdown::Shutdown;
pub use state::JobState;
pub use worker::Worker;
