//! # durable-etl
//!
//! Durable jobs run out of PostgreSQL. A job is a Rust type, enqueued in your own transaction so
//! that it commits (or rolls back) with your writes; replicas claim due jobs with `SKIP LOCKED`,
//! fence every later write with the claim, and commit a job's effects in the same transaction as
//! its success. A crash never leaves effects without success, and a stale replica never commits.
//!
//! ## The runtime
//! - **Implement** ([`job`]): [`Job`], the payload type; [`Perform`], its computation, which holds
//!   no connection; [`Apply`], its writes, inside the fenced transaction; [`JobContext`] and
//!   [`JobError`]; a [`Registry`] of kinds.
//! - **Call** ([`jobs`]): [`Jobs`] enqueues ([`EnqueueOptions`], [`Enqueued`]), reads, lists and
//!   cancels jobs for one owner; [`JobState`].
//! - **Run** ([`worker`]): [`Worker`], one replica, or [`Replica`], one spawned on a task; queues,
//!   weights, priorities and caps ([`queue`]); recurring [`Schedules`] ([`schedule`]), fired by
//!   every replica with no leader.
//! - **Set up**: [`DatabaseConfig`], [`WorkerConfig`] ([`config`]); [`connect_pool`], [`Pool`];
//!   [`migrate`] ([`schema`]); [`Secret`], the key owners and idempotency keys are digested
//!   under; [`Shutdown`].
//! - **Errors** ([`error`]): [`Error`], whose [`Code`] is all that ever leaves the process.
//!
//! Start with the quick start in [`job`] (`examples/quick_start.rs`, run by CI);
//! `examples/custom_kind.rs`, `notify_webhook.rs` and, with the `sqlx` feature, `sqlx_app.rs`
//! show more.
//!
//! ## What ships on top
//! [`kinds::etl`], the ETL load, built on the same runtime; the `service` feature's HTTP API,
//! web console and metrics (`service`, `app`); the `cli` feature's `durable-etl` binary
//! (`migrate`, `serve`, `work`, `demo`, `bench`). The `sqlx` feature enqueues and cancels on a
//! sqlx connection (`Jobs::enqueue_sqlx`).

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

// The runtime: what a user implements, calls and runs.
pub mod config;
pub mod dead_letters;
pub mod directory;
pub mod error;
pub mod job;
pub mod jobs;
pub mod queue;
mod replica;
pub mod schedule;
pub mod schema;
pub mod worker;

// What ships on top of it: the ETL kind, and the HTTP service (the `service` feature).
pub mod kinds;
#[cfg(feature = "service")]
pub mod service;

// The foundation. Public only for the `durable-etl` binary and the test suite, hidden from the
// documentation, and no part of the API: what a user needs of it is re-exported below.
#[doc(hidden)]
pub mod codes;
#[doc(hidden)]
pub mod db;
#[doc(hidden)]
pub mod digest;
#[doc(hidden)]
pub mod intake;
mod names;
#[doc(hidden)]
pub mod shutdown;
#[doc(hidden)]
pub mod telemetry;
pub(crate) mod time;

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

pub use codes::Code;
pub use config::{ConfigError, DatabaseConfig, WorkerConfig};
pub use db::{connect_pool, Pool};
pub use dead_letters::DeadLetters;
pub use digest::Secret;
pub use error::Error;
pub use job::{Apply, Job, JobContext, JobError, Perform, Registry};
pub use jobs::{EnqueueOptions, Enqueued, JobState, Jobs};
pub use replica::Replica;
pub use schedule::Schedules;
pub use schema::migrate;
#[cfg(feature = "service")]
pub use service::{app, AppState};
pub use shutdown::Shutdown;
pub use worker::Worker;
