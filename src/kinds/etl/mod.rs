//! The shipped ETL job: intake (request validation and transactional, idempotent enqueue) and
//! execution (transform, then an atomic load that records its [`Ledger`]).
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

/// What a succeeded load records (its output, shown as the job's `result`): the rows it wrote and
/// the checksum of the data it loaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
pub struct Ledger {
    /// Target rows inserted.
    pub rows_inserted: i32,
    /// Target rows changed.
    pub rows_updated: i32,
    /// Target rows already as loaded.
    pub rows_unchanged: i32,
    /// Hex SHA-256 of the loaded data.
    pub checksum: String,
}

impl From<Ledger> for serde_json::Value {
    fn from(ledger: Ledger) -> serde_json::Value {
        serde_json::json!({
            "rows_inserted": ledger.rows_inserted,
            "rows_updated": ledger.rows_updated,
            "rows_unchanged": ledger.rows_unchanged,
            "checksum": ledger.checksum,
        })
    }
}
