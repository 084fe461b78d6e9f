//! The rows of a claim: the jobs it claimed, and the markers that say what it left of each
//! capped ask's permits (see [`super::CLAIM_SQL`]).
//!
//! Invariant this module keeps: a row is a marker exactly when its job id is NULL, and every
//! claimed job keeps the context its claim returned (claim id, fencing token, attempt) and the
//! name of the queue it was asked of.

use crate::job::handler::{JobContext, LeaseLost};
use crate::worker::lease::ClaimedJob;
use std::sync::Arc;
use tokio_postgres::Row;

/// What a claim took: the jobs, and what its marker rows (every column NULL but the ask's
/// position and the last) said of the asks.
#[derive(Debug, Default)]
pub struct Claim {
    /// The claimed jobs.
    pub jobs: Vec<ClaimedJob>,
    /// The asks, by position, that [`super::CLAIM_UNCAPPED_SQL`] refused because their queue is capped.
    pub capped: Vec<usize>,
    /// Each capped or key-capped ask of [`super::CLAIM_SQL`], by position, with whether it left free
    /// permits of its queue's cap to other claimers: `Some(true)` when it picked fewer due jobs
    /// (of the replica's kinds, of keys below their cap) than the free permits it saw,
    /// `Some(false)` when it did not (it took them all, or lost some to claimers that took them
    /// at the same time), `None` for a queue with a key cap only.
    pub left_free: Vec<(usize, Option<bool>)>,
}

/// The claimed jobs of [`super::CLAIM_SQL`]'s rows for `asks` and what its markers say of the
/// capped asks.
pub(super) fn claimed(rows: Vec<Row>, asks: &[(&str, usize)]) -> Claim {
    let (jobs, markers) = split(rows, asks);
    Claim {
        jobs,
        capped: Vec::new(),
        left_free: markers
            .iter()
            .map(|row| (asked_of(row), row.get(11)))
            .collect(),
    }
}

/// The claimed jobs of [`CLAIM_UNCAPPED_SQL`]'s rows for `asks` and the asks its markers refused.
pub(super) fn refused(rows: Vec<Row>, asks: &[(&str, usize)]) -> Claim {
    let (jobs, markers) = split(rows, asks);
    Claim {
        jobs,
        capped: markers.iter().map(asked_of).collect(),
        left_free: Vec::new(),
    }
}

/// The claimed jobs (each named after the queue of its ask in `asks`) and the marker rows (whose
/// id is NULL) of a claim's rows.
fn split(rows: Vec<Row>, asks: &[(&str, usize)]) -> (Vec<ClaimedJob>, Vec<Row>) {
    let (jobs, markers): (Vec<Row>, Vec<Row>) = rows
        .into_iter()
        .partition(|row| row.get::<_, Option<uuid::Uuid>>(0).is_some());
    let queues: Vec<Arc<str>> = asks.iter().map(|&(queue, _)| Arc::from(queue)).collect();
    let jobs = jobs
        .iter()
        .map(|row| {
            let mut job = claimed_job(row);
            if let Some(queue) = queues.get(job.asked_of) {
                job.queue = Arc::clone(queue);
            }
            job
        })
        .collect();
    (jobs, markers)
}

/// The position (from 0) of the ask a claim's row filled.
fn asked_of(row: &Row) -> usize {
    usize::try_from(row.get::<_, i64>(10) - 1).unwrap_or(0)
}

/// The claimed job of one of a claim's rows.
pub(super) fn claimed_job(row: &Row) -> ClaimedJob {
    ClaimedJob {
        ctx: Arc::new(JobContext {
            id: row.get(0),
            kind: row.get(1),
            attempt: row.get(3),
            max_attempts: row.get(4),
            lease_claim_id: row.get(5),
            fencing_token: row.get(8),
            owner_key: row.get(6),
            run_at: row.get(9),
            lease_lost: LeaseLost::default(),
            recorded: Default::default(),
        }),
        payload: row.get(2),
        due_for: row.get(7),
        asked_of: asked_of(row),
        // Named by the caller, which knows the claim's asks (`split`) or the row's queue.
        queue: Arc::from(""),
        held_permit: row.get(11),
    }
}
