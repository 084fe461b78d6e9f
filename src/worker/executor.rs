//! Executes one claimed job: the handler's compute phase with no connection held, then its
//! effects, the ledger row and `succeeded` in one fenced transaction; or the fenced failure path.
//!
//! Invariants this module keeps:
//! - No pooled connection or transaction is held while [`Handler::prepare`] runs.
//! - The execution transaction first locks the job row with the lease fence; if the fence matches
//!   nothing the job is abandoned (`LeaseLost`) before any effect is written.
//! - Effects, ledger row and `succeeded` commit together or not at all. A COMMIT whose outcome is
//!   unknown (connection lost) is resolved by reading the ledger by `lease_claim_id`, never by
//!   running the job again.
//! - A panic in the handler is a failed attempt (`handler_panicked`), never a dead replica; an
//!   overrun of the execution timeout is `execution_timeout`. Both are terminal.
//! - Only codes leave this module: no error text, SQL or payload is logged or stored.

use crate::codes::Code;
use crate::error::{is_connection_loss, is_transient};
use crate::handler::{Effects, Handler, JobError};
use crate::worker::completer::{self, Transition};
use crate::worker::lease::ClaimedJob;
use crate::worker::{retry, Shared};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::time::{timeout_at, Instant};
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

/// Locks the job row under the lease fence at the start of the execution transaction, and tells
/// whether a ledger row already exists for it (then its effects committed before and must not
/// run again) and whether its owner asked to cancel it (then its effects must never commit).
///
/// Locks: a row lock (`FOR UPDATE`) on the one job row, held until the transaction ends; this is
/// what makes recovery, heartbeats and cancellation wait for (or skip) the row while its effects
/// commit, so a cancel and a commit can never both win.
pub const LOCK_FENCED_SQL: &str = "
SELECT EXISTS (SELECT 1 FROM etl_job_responses r WHERE r.job_id = j.id),
       j.cancel_requested_at IS NOT NULL
  FROM etl_job_records j
 WHERE j.id = $1 AND j.lease_claim_id = $2 AND j.status = 'running'
   FOR UPDATE OF j";

/// Whether the ledger holds a row committed under this claim (`$1` job id, `$2` claim id).
pub const LEDGER_BY_CLAIM_SQL: &str = "
SELECT EXISTS (SELECT 1 FROM etl_job_responses WHERE job_id = $1 AND lease_claim_id = $2)";

/// Why an attempt ended without committing, before the transition is written.
enum Failure {
    /// The handler or the database said so.
    Job(JobError),
    /// A stored code decided by the executor itself.
    Code(Code),
    /// The lease was gone when the effects transaction checked it.
    LeaseLost,
    /// The owner asked to cancel the job.
    Cancelled,
}

/// Runs `job` to a transition. `lost` is cancelled when a heartbeat finds the lease gone: the
/// compute phase stops at once; the effects phase needs no signal, its fence check settles it.
pub(crate) async fn execute(
    shared: &Shared,
    job: ClaimedJob,
    lost: CancellationToken,
) -> Transition {
    let deadline = Instant::now() + shared.config.execution_timeout;
    let outcome = match shared.registry.get(&job.ctx.kind) {
        None => Err(Failure::Code(Code::UnknownKind)),
        Some(handler) => match job.payload.clone() {
            // No payload: a job re-claimed after its effects committed (its ledger row settles
            // it), or a broken row.
            None => commit(shared, &job, None, deadline).await,
            Some(payload) => match prepare(&handler, &job, payload, deadline, &lost).await {
                Ok(effects) => commit(shared, &job, Some(effects), deadline).await,
                Err(failure) => Err(failure),
            },
        },
    };
    match outcome {
        Ok(transition) => transition,
        Err(failure) => settle_failure(shared, &job, failure).await,
    }
}

/// The compute phase: no connection held; bounded by the deadline; panics caught.
async fn prepare(
    handler: &Arc<dyn Handler>,
    job: &ClaimedJob,
    payload: serde_json::Value,
    deadline: Instant,
    lost: &CancellationToken,
) -> Result<Box<dyn Effects>, Failure> {
    let run = AssertUnwindSafe(handler.prepare(&job.ctx, payload)).catch_unwind();
    let Some(outcome) = lost.run_until_cancelled(timeout_at(deadline, run)).await else {
        return Err(Failure::LeaseLost);
    };
    match outcome {
        Err(_) => Err(Failure::Code(Code::ExecutionTimeout)),
        Ok(Err(_panic)) => Err(Failure::Code(Code::HandlerPanicked)),
        Ok(Ok(Err(e))) => Err(Failure::Job(e)),
        Ok(Ok(Ok(effects))) => Ok(effects),
    }
}

/// The effects phase: one transaction that locks the fenced row, applies the effects, writes the
/// ledger row and `succeeded`, and commits. Without effects (no payload), only a ledger row
/// already present can make the job succeed; otherwise it fails `invalid_payload`.
async fn commit(
    shared: &Shared,
    job: &ClaimedJob,
    effects: Option<Box<dyn Effects>>,
    deadline: Instant,
) -> Result<Transition, Failure> {
    let (id, claim) = (job.id(), job.claim_id());
    let mut conn = shared
        .pool
        .get()
        .await
        .map_err(|_| Failure::Code(Code::TransientDatabase))?;
    let tx = conn.transaction().await.map_err(db_failure)?;
    let fenced: Option<(bool, bool)> = tx
        .query_typed_opt(LOCK_FENCED_SQL, &[(&id, Type::UUID), (&claim, Type::UUID)])
        .await
        .map_err(db_failure)?
        .map(|row| (row.get(0), row.get(1)));
    let ledger_exists = match fenced {
        None => return Err(Failure::LeaseLost),
        Some((_, true)) => return Err(Failure::Cancelled),
        Some((ledger, false)) => Some(ledger),
    };
    let ledger = match (ledger_exists, effects) {
        (None, _) => return Err(Failure::LeaseLost),
        // Effects already committed under an earlier claim: record success, run nothing again.
        (Some(true), _) => Default::default(),
        (Some(false), None) => return Err(Failure::Code(Code::InvalidPayload)),
        (Some(false), Some(effects)) => {
            let apply = AssertUnwindSafe(effects.apply(&tx)).catch_unwind();
            match timeout_at(deadline, apply).await {
                Err(_) => return Err(Failure::Code(Code::ExecutionTimeout)),
                Ok(Err(_panic)) => return Err(Failure::Code(Code::HandlerPanicked)),
                Ok(Ok(Err(e))) => return Err(Failure::Job(e)),
                Ok(Ok(Ok(ledger))) => ledger,
            }
        }
    };
    match completer::succeed(&tx, id, claim, &ledger)
        .await
        .map_err(db_failure)?
    {
        Transition::Succeeded => {}
        _ => return Err(Failure::LeaseLost),
    }
    match tx.commit().await {
        Ok(()) => Ok(Transition::Succeeded),
        Err(e) if is_connection_loss(&e) => resolve_unknown_commit(shared, job).await,
        Err(e) => Err(db_failure(e)),
    }
}

/// A COMMIT whose outcome is unknown: the ledger row under this claim exists exactly when it
/// committed.
async fn resolve_unknown_commit(shared: &Shared, job: &ClaimedJob) -> Result<Transition, Failure> {
    let conn = shared
        .pool
        .get()
        .await
        .map_err(|_| Failure::Code(Code::TransientDatabase))?;
    let committed: bool = conn
        .query_typed_one(
            LEDGER_BY_CLAIM_SQL,
            &[(&job.id(), Type::UUID), (&job.claim_id(), Type::UUID)],
        )
        .await
        .map_err(db_failure)?
        .get(0);
    if committed {
        Ok(Transition::Succeeded)
    } else {
        Err(Failure::Code(Code::TransientDatabase))
    }
}

/// A database error met while executing, as a failure.
fn db_failure(e: tokio_postgres::Error) -> Failure {
    Failure::Job(JobError::Database(e))
}

/// Writes the transition a failure calls for: a retry for transient failures, `failed` for the
/// rest. Lease loss is written nowhere (the job is no longer ours).
async fn settle_failure(shared: &Shared, job: &ClaimedJob, failure: Failure) -> Transition {
    let (code, record_index, transient) = match failure {
        Failure::LeaseLost => return Transition::LeaseLost,
        Failure::Cancelled => (Code::Cancelled, None, false),
        Failure::Code(code) => (code, None, code == Code::TransientDatabase),
        Failure::Job(JobError::Transient(_)) => (Code::HandlerFailed, None, true),
        Failure::Job(JobError::Permanent {
            code, record_index, ..
        }) => (code, record_index, false),
        Failure::Job(JobError::Database(e)) => (Code::HandlerFailed, None, is_transient(&e)),
    };
    let code = if code.is_stored_failure() {
        code
    } else {
        Code::HandlerFailed
    };
    let Ok(conn) = shared.pool.get().await else {
        return Transition::Unwritten;
    };
    let written = if transient {
        let delay = retry::delay(
            job.ctx.attempt,
            shared.config.retry_min_delay,
            shared.config.retry_max_delay,
        );
        completer::retry(&*conn, job.id(), job.claim_id(), delay).await
    } else {
        completer::fail(&*conn, job.id(), job.claim_id(), code, record_index).await
    };
    written.unwrap_or(Transition::Unwritten)
}
