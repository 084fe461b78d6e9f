//! # durable-etl
//!
//! Durable jobs run out of PostgreSQL, of any kind: yours, enqueued in your own transaction, and
//! the shipped ETL load. Replicas claim due jobs with `FOR NO KEY UPDATE SKIP LOCKED`, fence every
//! later write with the claim's `lease_claim_id` and the replica's `lease_owner_id`, and commit a
//! job's effects in the same transaction as its `succeeded` outcome. A crash never leaves effects
//! without success metadata, and a stale replica never commits. PostgreSQL, not a scheduler, is
//! the correctness boundary.
//!
//! The `durable-etl` binary (`migrate`, `serve`, `work`, `demo`, `bench`, …) is built with the
//! default `cli` feature; a library user who sets `default-features = false` links only what is
//! below, without clap, reqwest or humantime. The `sqlx` feature lets an application on sqlx
//! enqueue and cancel in its own sqlx transaction (`Jobs::enqueue_sqlx`, `enqueue_many_sqlx`,
//! `cancel_sqlx`; `examples/sqlx_app.rs`).
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
//! `examples/custom_kind.rs` shows more of the runtime contract: a deferred job whose effects
//! recheck the domain state under the fence, and idempotent enqueue;
//! `examples/notify_webhook.rs` a delivery to an outside system with the fencing token, and what
//! the retries guarantee there. The shipped ETL kind ([`etl`]) is enqueued with
//! [`etl::enqueue`] and run by [`etl::load::EtlLoad`].
//!
//! ## Layout
//! **The runtime, start here:** [`Job`], [`Perform`] and [`Apply`] ([`job`]); [`Jobs`], to
//! enqueue, read and cancel; [`Worker`] ([`worker`]) and [`Replica`] ([`replica`]), with
//! [`WorkerConfig`] and [`DatabaseConfig`] ([`config`]); queues, weights and priorities
//! ([`queue`]); [`migrate`] ([`schema`]);
//! [`connect_pool`] ([`db`]); [`Secret`] ([`digest`]); [`JobContext`], [`JobError`] and the
//! untyped contract under the typed one ([`handler`]); [`JobState`] ([`state`]) and the status,
//! listing and cancel types ([`jobs`]); [`Error`] and [`Code`] ([`error`], [`codes`]).
//!
//! **Underneath:** [`enqueue`], the one insert path of every kind; [`notifier`], one coalescing
//! NOTIFY per process for enqueues that skip the trigger's; [`shutdown`], the staged shutdown
//! signal; [`telemetry`], logs that never carry payloads, principals or SQL; [`metrics`],
//! Prometheus text; `time` (crate-private), canonical UTC.
//!
//! **The shipped service:** [`etl`], the ETL kind (intake validation, enqueue, the load with its
//! response ledger) with its [`intake`] limits; [`api`] ([`app`] builds the router: the HTTP API,
//! the console, OpenAPI); [`api_keys`], keys stored only as keyed digests, mapped to owners.
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
mod backend;
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
mod names;
pub mod notifier;
pub mod queue;
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
pub use handler::{
    Effects, EffectsSet, Handler, JobContext, JobError, LedgerEntry, NoEffects, Registry,
};
pub use job::{Apply, EnqueueOptions, Job, Jobs, Perform};
pub use notifier::{skip_trigger_notify, Notifier};
pub use replica::Replica;
pub use schema::{check_compatible, migrate, migrate_down_to, migrate_up};
pub use shutdown::Shutdown;
pub use state::JobState;
pub use worker::Worker;
