//! The benchmark's job kind and its handler: record the pickup latency, do the synthetic work,
//! and mark the job's ledger row inside the fence.
//!
//! Invariants:
//! - The handler holds no connection while it works; its only write is the ledger mark, in the
//!   fenced transaction that records the job's success (see [`crate::ledger`]).
//! - The pickup latency is the handler's start minus the producer's clock just before the
//!   enqueue transaction began (the harness's "insert → worker start"), both wall clocks of the
//!   same host.

use crate::ledger::MARK_APPLIED_SQL;
use crate::Shared;
use durable_etl::{Apply, Job, JobContext, JobError, Perform};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Transaction;

/// One benchmark job: its value is the payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BenchJob {
    /// Its unique sequence number (see [`crate::ledger`]).
    pub(crate) seq: i64,
    /// The producer's wall clock just before the enqueue, in microseconds since the Unix epoch.
    pub(crate) produced_at_us: i64,
    /// Filler, so the payload has about `JOB_PAYLOAD_BYTES` bytes.
    pub(crate) padding: String,
}

impl Job for BenchJob {
    const KIND: &'static str = "harness_adapter.job";
}

/// The handler of [`BenchJob`].
pub(crate) struct RunBenchJob {
    /// The synthetic work of each job.
    pub(crate) work: Duration,
    /// The counters and latencies the samples report.
    pub(crate) shared: Arc<Shared>,
}

impl Perform for RunBenchJob {
    type Job = BenchJob;
    type Effects = MarkApplied;

    async fn compute(&self, job: BenchJob, ctx: &JobContext) -> Result<MarkApplied, JobError> {
        let now = crate::now_micros();
        let waited = u64::try_from(now.saturating_sub(job.produced_at_us)).unwrap_or(0);
        self.shared.record_pickup(now, waited);
        self.shared.executions.fetch_add(1, Ordering::Relaxed);
        // The first claim of a job has token 1: a later one means it was claimed before.
        if ctx.fencing_token > 1 {
            self.shared.reclaimed.fetch_add(1, Ordering::Relaxed);
        }
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        Ok(MarkApplied(job.seq))
    }
}

/// The effects of one job: its ledger row's mark.
pub(crate) struct MarkApplied(i64);

impl Apply for MarkApplied {
    async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        tx.execute(MARK_APPLIED_SQL, &[&self.0]).await?;
        Ok(())
    }
}
