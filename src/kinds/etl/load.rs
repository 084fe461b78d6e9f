//! The ETL handler: transforms every record with no connection held, then upserts the target
//! rows inside the fenced execution transaction and records inserted / updated / unchanged counts
//! and a checksum of the loaded data (its [`Ledger`]).
//!
//! Invariants this module keeps:
//! - A record that cannot be transformed, has no usable key, or repeats a key fails the job with
//!   `record_invalid` and the record's index; its value is never reported.
//! - The plan runs on tokio's blocking pool, never on an async worker thread, and within the
//!   transform's [`OutputBudget`]: a plan that exceeds it fails its job with `invalid_payload`
//!   (intake refuses such requests, so only a payload that bypassed intake can), never the
//!   process. Execution re-applies no intake limit: what one replica accepted, every replica runs.
//! - The kind is built on the public contract only ([`Perform`], [`Apply`]), as any user's is.
//! - A job's load alone is one statement ([`UPSERT_SQL`]). In a commit batch, the loads of every
//!   job apply together ([`Apply::apply_set`]: one set-based statement per round, see
//!   `etl::upsert`), each job's ledger (counts and checksum) the one it would have had
//!   alone, after the batch's jobs before it; should the set fail, the worker rolls it back and
//!   applies each load alone, so one job's failure leaves none of its rows and takes no other job
//!   down. A load of more than [`SET_MEMBER_MAX_BYTES`] always applies alone, so a set-based
//!   statement stays small. Rows are upserted in key order, so concurrent loads lock rows in the same order and do
//!   not deadlock each other; a row whose data is unchanged is not rewritten (and keeps the job
//!   that last changed it).
//! - Loading the same request again yields the same rows and the same checksum.

use crate::codes::Code;
use crate::job::{Apply, Job, JobContext, JobError, Perform};
use crate::kinds::etl::request;
use crate::kinds::etl::transform::OutputBudget;
use crate::kinds::etl::upsert::{self, Target, Written};
use crate::kinds::etl::Ledger;
use crate::kinds::etl::KIND;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_postgres::Transaction;
use uuid::Uuid;

pub use crate::kinds::etl::upsert::UPSERT_SQL;

/// An ETL load's payload: the normalized request intake stored (validated again by [`plan`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct EtlJob(pub Value);

impl Job for EtlJob {
    const KIND: &'static str = KIND;
}

/// The ETL handler (`etl.load`), a [`Perform`] like any kind's. It has no settings: execution
/// applies no intake limit, only the fixed bounds of [`crate::kinds::etl::transform`]. Register
/// it with `Registry::new().perform(EtlLoad::default())`.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct EtlLoad {}

impl Perform for EtlLoad {
    type Job = EtlJob;
    type Effects = Load;

    async fn compute(&self, job: EtlJob, ctx: &JobContext) -> Result<Load, JobError> {
        let ctx = ctx.clone();
        match tokio::task::spawn_blocking(move || plan(&ctx, &job.0)).await {
            Ok(load) => load,
            // A panic in the plan is the handler's panic: the executor's guard records it.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: the attempt did not run.
            Err(e) => Err(JobError::transient(e)),
        }
    }
}

/// The rows one job loads, keyed and in key order.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// The owner digest the rows belong to.
    owner_key: Vec<u8>,
    /// The target dataset.
    dataset: String,
    /// The job writing them.
    job_id: Uuid,
    /// Record key → transformed record, sorted by key; shared, so that the copy the worker keeps
    /// to commit again after an infrastructure fault (`Effects::replay`) copies no record.
    rows: Arc<BTreeMap<String, Value>>,
    /// The JSON bytes of the records (as the transform's budget charged them).
    bytes: usize,
}

/// The largest load (JSON bytes of its records) that applies in a set with other jobs' loads;
/// a larger one applies alone. A set holds at most `MAX_JOBS_PER_TRANSACTION` (64) loads, so no
/// set-based statement carries more than 4 MiB of records, where 64 loads at the transform's
/// bound would carry 512 MiB.
pub const SET_MEMBER_MAX_BYTES: usize = 64 * 1024;

/// Validates the stored request and transforms every record, within an [`OutputBudget`].
/// CPU-bound: [`EtlLoad`] runs it on the blocking pool.
///
/// # Errors
/// `invalid_payload` for a payload that is not a valid request or whose records exceed the
/// budget; `record_invalid` with the index of the first record that fails.
pub fn plan(job: &JobContext, payload: &Value) -> Result<Load, JobError> {
    let request =
        request::parse_stored(payload).map_err(|_| JobError::permanent(Code::InvalidPayload))?;
    let mut budget = OutputBudget::default();
    let mut rows = BTreeMap::new();
    for (index, record) in request.records.iter().enumerate() {
        let out = request
            .transform
            .apply_within(record, &mut budget)
            .map_err(|_| JobError::permanent(Code::InvalidPayload))?
            .ok_or_else(|| JobError::record_invalid(index))?;
        let key = match out.get(&request.key) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
            _ => return Err(JobError::record_invalid(index)),
        };
        if rows.insert(key, Value::Object(out)).is_some() {
            return Err(JobError::record_invalid(index));
        }
    }
    Ok(Load {
        owner_key: job.owner_key.clone(),
        dataset: request.dataset,
        job_id: job.id,
        rows: Arc::new(rows),
        bytes: budget.output_bytes(),
    })
}

impl Load {
    /// SHA-256 over every `(key, record)` in key order.
    pub fn checksum(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        for (key, record) in self.rows.iter() {
            hasher.update(key.as_bytes());
            hasher.update([0]);
            hasher.update(record.to_string().as_bytes());
            hasher.update([0]);
        }
        hasher.finalize().into()
    }
}

impl Load {
    /// The rows to upsert.
    fn target(&self) -> Target<'_> {
        Target {
            owner_key: &self.owner_key,
            dataset: &self.dataset,
            job_id: self.job_id,
            rows: &self.rows,
        }
    }

    /// The ledger of these rows, written as `written` says: what the kind records.
    fn ledger(&self, written: Written) -> Ledger {
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        Ledger {
            rows_inserted: count(written.inserted),
            rows_updated: count(written.updated),
            rows_unchanged: count(written.unchanged),
            checksum: hex::encode(self.checksum()),
        }
    }
}

impl Apply for Load {
    async fn apply(self, tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        let written = upsert::one(tx, self.target()).await?;
        job.record(self.ledger(written))
    }

    fn replay(&self) -> Option<Load> {
        Some(self.clone())
    }

    fn in_set(&self) -> bool {
        self.bytes <= SET_MEMBER_MAX_BYTES
    }

    /// The rows of every load of a commit batch upserted together, in as few set-based
    /// statements as their shared keys allow (`upsert::set`), each load's ledger the one it
    /// would have had alone.
    async fn apply_set<'a>(
        tx: &'a Transaction<'a>,
        set: Vec<(&'a mut Load, &'a JobContext)>,
    ) -> Result<(), JobError> {
        let targets: Vec<Target<'_>> = set.iter().map(|(load, _)| load.target()).collect();
        let written = upsert::set(tx, &targets).await?;
        for ((load, job), written) in set.iter().zip(written) {
            job.record(load.ledger(written))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use serde_json::json;

    /// A job context for planning.
    fn job() -> JobContext {
        JobContext {
            id: Uuid::now_v7(),
            kind: KIND.into(),
            lease_claim_id: Uuid::new_v4(),
            fencing_token: 1,
            attempt: 1,
            max_attempts: 3,
            owner_key: vec![1; 32],
            run_at: chrono::Utc::now(),
            lease_lost: crate::job::handler::LeaseLost::default(),
            recorded: Default::default(),
        }
    }

    /// The failure `payload` plans to.
    fn failure(payload: Value) -> (Code, Option<i32>) {
        match plan(&job(), &payload) {
            Err(JobError::Permanent {
                code, record_index, ..
            }) => (code, record_index),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn records_are_keyed_transformed_and_checksummed_deterministically() {
        let payload = json!({"dataset": "d", "key": "id", "records": [{"id": 2, "v": "1"}, {"id": "a", "v": "2"}],
                             "transform": {"cast": {"v": "integer"}}});
        let a = plan(&job(), &payload).unwrap();
        let b = plan(&job(), &payload).unwrap();
        assert_eq!(a.rows.keys().collect::<Vec<_>>(), vec!["2", "a"]);
        assert_eq!(a.rows["a"], json!({"id": "a", "v": 2}));
        assert_eq!(a.checksum(), b.checksum());
    }

    #[test]
    fn bad_records_fail_with_their_index_only() {
        let base = |records: Value| json!({"dataset": "d", "key": "id", "records": records, "transform": {"cast": {"n": "integer"}}});
        assert_eq!(
            failure(base(json!([{"id": 1}, {"id": 2, "n": "x"}]))),
            (Code::RecordInvalid, Some(1))
        );
        assert_eq!(
            failure(base(json!([{"id": 1}, {"n": 1}]))),
            (Code::RecordInvalid, Some(1)),
            "no key"
        );
        assert_eq!(
            failure(base(json!([{"id": 1.5}]))),
            (Code::RecordInvalid, Some(0)),
            "float key"
        );
        assert_eq!(
            failure(base(json!([{"id": ""}]))),
            (Code::RecordInvalid, Some(0)),
            "empty key"
        );
        assert_eq!(
            failure(base(json!([{"id": 1}, {"id": "1"}]))),
            (Code::RecordInvalid, Some(1)),
            "dup key"
        );
        assert_eq!(
            failure(json!({"dataset": "BAD"})),
            (Code::InvalidPayload, None)
        );
    }

    #[test]
    fn only_a_load_of_at_most_64_kib_applies_in_a_set() {
        let load = |bytes: usize| {
            let payload =
                json!({"dataset": "d", "key": "id", "records": [{"id": "x".repeat(bytes)}]});
            plan(&job(), &payload).unwrap()
        };
        let small = load(100);
        assert_eq!(small.bytes, 109, "{{\"id\":\"x…x\"}}");
        assert!(small.in_set());
        assert!(!load(SET_MEMBER_MAX_BYTES).in_set());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_plan_runs_off_the_async_thread() {
        let records: Vec<Value> = (0..10_000).map(|i| json!({"id": i, "v": "x"})).collect();
        let payload = json!({"dataset": "d", "key": "id", "records": records});
        let (job, handler) = (job(), EtlLoad::default());
        // A plan computed inside the poll would be done after the first one; on the blocking
        // pool it is still running (10,000 records take far longer than one poll).
        let first_poll = handler
            .compute(EtlJob(payload.clone()), &job)
            .now_or_never();
        assert!(
            first_poll.is_none(),
            "the plan must not hold the runtime's thread"
        );
        assert!(handler.compute(EtlJob(payload), &job).await.is_ok());
    }
}
