//! # durable-etl
//!
//! Durable ETL jobs run out of PostgreSQL. Accepted jobs are rows of `etl_job_records`; replicas
//! claim due rows with `FOR UPDATE SKIP LOCKED`, fence every later write with the claim's
//! `lease_claim_id`, and commit a job's effects, its response-ledger row and its `succeeded` state
//! in one transaction. PostgreSQL, not a scheduler, is the correctness boundary.
//!
//! ## Quick start
//! ```text
//! durable-etl migrate          # create the database if needed and apply the schema
//! durable-etl work             # run a worker replica
//! ```
//!
//! ## Modules
//! - [`schema`]: embedded migrations and the release-compatibility check.
//! - [`config`]: typed configuration with defaults and validation.
//! - [`db`]: the pool and session settings.
//! - [`codes`]: the one list of stable codes used at every boundary.
//! - [`digest`]: keyed digests of principals and keys.
//! - [`worker`]: the replica: claim, execute, heartbeat, recover, shut down.

/// A crash point: with the `failpoints` feature and `FAILPOINTS=<name>=return` (the `fail`
/// crate's syntax, e.g. `1*return` to fire once), the process aborts right here, as if killed at
/// this step; without the feature it compiles to nothing. The fault tests place kills exactly.
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| std::process::abort())
    };
}

pub mod api;
pub mod api_keys;
pub mod bench;
pub mod cli;
pub mod codes;
pub mod config;
pub mod db;
pub mod demo;
pub mod digest;
pub mod error;
pub mod etl;
pub mod handler;
pub mod intake;
pub mod jobs;
pub mod metrics;
pub mod schema;
pub mod shutdown;
pub mod state;
pub mod telemetry;
pub mod time;
pub mod worker;

pub use codes::Code;
pub use error::Error;
