//! The shipped ETL job: intake (request validation and transactional, idempotent enqueue) and
//! execution (transform, then an atomic load with its ledger summary).
//!
//! Invariants this module keeps:
//! - Only requests that pass intake validation are enqueued; the stored payload is the normalized
//!   request, and its keyed fingerprint decides idempotent replays.
//! - The load runs inside the worker's fenced execution transaction: target rows, the ledger row
//!   and `succeeded` commit together (see `worker::executor`); in a commit batch, every job's load
//!   goes in set-based statements (`etl::upsert`) with the same rows and ledgers as one by one.

pub mod enqueue;
pub mod load;
pub mod request;
pub mod transform;
pub(crate) mod upsert;

/// The job kind of ETL loads.
pub const KIND: &str = "etl.load";
