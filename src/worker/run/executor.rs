//! Executes one claimed job: the handler's compute phase with no connection held, then its
//! effects, the ledger row and `succeeded` in one fenced transaction shared with the other jobs
//! the replica finished meanwhile ([`super::group_commit`]); or the fenced failure path.
//!
//! Invariants this module keeps:
//! - No pooled connection or transaction is held while [`Handler::prepare`] runs.
//! - The job's slot is given back as soon as its compute phase ends, however it ends, before its
//!   transition is written: the next job computes while this one commits.
//! - Effects, ledger row and `succeeded` commit together or not at all, under the lease fence
//!   (kept by [`super::group_commit`]); a job whose fence fails is abandoned (`LeaseLost`).
//! - A panic in the handler is a failed attempt (`handler_panicked`), never a dead replica: the
//!   call of [`Handler::prepare`] is guarded as well as the polling of its future, and so is the
//!   whole task, whose panic anywhere else is written the same
//!   fenced way (its claim never outlives it). An overrun of the execution timeout by the compute
//!   phase is `execution_timeout`. Both are terminal.
//! - Each phase's budget is the kind's execution timeout ([`Handler::execution_timeout`]), else
//!   the replica's. Effects have a budget of their own (that timeout again), counted from when they
//!   start applying: time spent queued for a commit lane, behind the other jobs of a batch or
//!   waiting for the fenced row lock never counts against it. An overrun of that budget is
//!   transient (a retry, bounded by `max_attempts`), never terminal: their time may be spent
//!   waiting for a row lock another transaction holds.
//! - A retry is due after the delay the failure asks for ([`JobError::RetryAfter`]), else the
//!   kind's ([`Handler::retry_delay`]), else the replica's policy; never more than
//!   [`RETRY_AFTER_MAX`], so every delay is finite.
//! - A retry is preceded, in the same round trip, by the job's cancel request recorded while its
//!   commit held it (`jobs::apply_deferred`), so the retry ends such a job `cancelled`.
//! - A kind's own failure code ([`JobError::KindFailure`]) is stored only if the kind declares
//!   it and it is a well-formed kind code ([`is_kind_code`]); any other is `handler_failed`.
//! - An infrastructure fault in the effects phase (a lost connection, a terminated backend, a
//!   failover, a statement bound) is never the job's failure: its computed result is committed
//!   again under the same claim while the lease is trusted, else the job is given back, its
//!   attempt not charged ([`Transition::GivenBack`]). Only the handler's own verdict, or an error
//!   its effects' writes caused, is charged.
//! - Only codes leave this module: no error text, SQL or payload is logged or stored.

use crate::codes::Code;
use crate::error::is_transient;
use crate::job::handler::{is_kind_code, Effects, Handler, JobError, RETRY_AFTER_MAX};
use crate::worker::complete::completer::{self, Failure, Transition};
use crate::worker::complete::group_commit::{OwnedEffects, Ready};
use crate::worker::guard::{guarded, Guarded};
use crate::worker::lease::{trusted_for, ClaimedJob};
use crate::worker::run::retry;
use crate::worker::run::slots::SlotPermit;
use crate::worker::shared::Shared;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs `job` to a transition in `slot`, logged at debug (id, kind, attempt, transition: never
/// its payload). `lost` is cancelled when the heartbeat finds the lease
/// gone or the job's local lease clock runs out: the compute phase stops at once; the effects
/// phase needs no signal, its fence check settles it.
pub(crate) async fn execute(
    shared: &Shared,
    job: ClaimedJob,
    lost: CancellationToken,
    slot: SlotPermit,
) -> Transition {
    let transition = match AssertUnwindSafe(run(shared, &job, lost, slot))
        .catch_unwind()
        .await
    {
        Ok(transition) => transition,
        // Whatever panicked, the job's fenced failure is written, so its claim does not stay
        // held (renewed, then released with its attempt refunded, to run again) for ever. Should
        // even that panic, the task still ends: the lease expires and recovery returns the job.
        Err(_panic) => {
            let panicked = Failure::Code(Code::HandlerPanicked);
            let failed = settle_failure(shared, &job, panicked, None);
            AssertUnwindSafe(failed)
                .catch_unwind()
                .await
                .unwrap_or(Transition::Unwritten)
        }
    };
    tracing::debug!(
        job_id = %job.ctx.id,
        kind = %job.ctx.kind,
        attempt = job.ctx.attempt,
        ended = ?transition,
        "job attempt ended"
    );
    transition
}

/// [`execute`], unguarded.
async fn run(
    shared: &Shared,
    job: &ClaimedJob,
    lost: CancellationToken,
    slot: SlotPermit,
) -> Transition {
    let handler = shared.registry.get(&job.ctx.kind);
    let budget = handler
        .as_ref()
        .and_then(|h| h.execution_timeout())
        .unwrap_or(shared.config.execution_timeout);
    let deadline = Instant::now() + budget;
    let prepared = match &handler {
        None => Err(Failure::Code(Code::UnknownKind)),
        Some(handler) => prepare(handler, job, job.payload.clone(), deadline, &lost).await,
    };
    // The compute phase is over: the slot goes to the next job while this one commits.
    drop(slot);
    let outcome = match prepared {
        Ok(effects) => commit(shared, job, effects, (budget, &lost)).await,
        Err(failure) => Err(failure),
    };
    match outcome {
        Ok(transition) => transition,
        Err(failure) => settle_failure(shared, job, failure, handler.as_deref()).await,
    }
}

/// The compute phase: no connection held; bounded by the deadline; panics caught, in the call
/// of [`Handler::prepare`] as well as in its future.
async fn prepare(
    handler: &Arc<dyn Handler>,
    job: &ClaimedJob,
    payload: serde_json::Value,
    deadline: Instant,
    lost: &CancellationToken,
) -> Result<Box<dyn Effects>, Failure> {
    // The call itself runs inside the guarded future: a handler may panic before returning one.
    let run = guarded(
        deadline,
        async move { handler.prepare(&job.ctx, payload).await },
    );
    let Some(outcome) = lost.run_until_cancelled(run).await else {
        return Err(Failure::LeaseLost);
    };
    match outcome {
        Guarded::TimedOut => Err(Failure::Code(Code::ExecutionTimeout)),
        Guarded::Panicked => Err(Failure::Code(Code::HandlerPanicked)),
        Guarded::Done(Err(e)) => Err(Failure::Job(e)),
        Guarded::Done(Ok(effects)) => Ok(effects),
    }
}

/// The effects phase, group-committed with whatever else this replica finished meanwhile; the
/// effects get a `budget` of their own, whatever time the compute phase took. After an
/// infrastructure fault kept them from committing, a copy of them ([`Effects::replay`]) is
/// committed again under the same claim, every [`COMMIT_AGAIN_EVERY`], until it is not a fault
/// again or the lease is no longer trusted (`lost`, and at most the lease's trusted part after
/// the first commit); then, or when the effects keep no copy, the job ends
/// [`Failure::Infrastructure`] (to be given back uncharged).
async fn commit(
    shared: &Shared,
    job: &ClaimedJob,
    mut effects: Box<dyn Effects>,
    (budget, lost): (std::time::Duration, &CancellationToken),
) -> Result<Transition, Failure> {
    // Bounded on its own as well, for a caller whose lease nobody watches (`Worker::step`).
    let until = Instant::now() + trusted_for(shared.config.lease);
    loop {
        // Handler code: a panic in it keeps no copy (the job is then given back).
        let again = std::panic::catch_unwind(AssertUnwindSafe(|| effects.replay()))
            .ok()
            .flatten();
        let ready = Ready {
            lease: job.lease(),
            // Read off the effects' type (only `NoEffects` skips the transaction): no handler code.
            writes: effects.writes(),
            effects: OwnedEffects::new(effects),
            budget,
        };
        match shared.group_commit.commit(ready).await {
            Err(Failure::Infrastructure) => {}
            outcome => return outcome,
        }
        let Some(again) = again else {
            return Err(Failure::Infrastructure);
        };
        let paced = tokio::time::sleep(COMMIT_AGAIN_EVERY);
        if lost.is_cancelled()
            || Instant::now() >= until
            || lost.run_until_cancelled(paced).await.is_none()
        {
            return Err(Failure::Infrastructure);
        }
        shared.stats.record_recommit();
        effects = again;
    }
}

/// How long after an infrastructure fault kept a job's result from committing it is committed
/// again (the pool's own checkout then waits for a connection, within its bound).
const COMMIT_AGAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Writes the transition a failure calls for: a retry for transient failures (after the delay
/// the failure asks for, else the one `handler`'s kind asks for, else the replica's policy's),
/// `failed` for the rest. Lease loss is written nowhere (the job is no longer ours).
async fn settle_failure(
    shared: &Shared,
    job: &ClaimedJob,
    failure: Failure,
    handler: Option<&dyn Handler>,
) -> Transition {
    let mut after = None;
    let mut kind_code = None;
    let (code, record_index, transient) = match failure {
        Failure::LeaseLost => return Transition::LeaseLost,
        // Never the job's failure: given back uncharged, by its claim, once the database answers.
        Failure::Infrastructure => return Transition::GivenBack,
        Failure::EffectsOverrun => (Code::ExecutionTimeout, None, true),
        Failure::Cancelled => (Code::Cancelled, None, false),
        Failure::Code(code) => (code, None, code == Code::TransientDatabase),
        Failure::Job(JobError::Transient(_)) => (Code::HandlerFailed, None, true),
        Failure::Job(JobError::RetryAfter { after: asked, .. }) => {
            after = Some(asked);
            (Code::HandlerFailed, None, true)
        }
        Failure::Job(JobError::KindFailure { code, .. }) => {
            // Only a code the kind declared, and that is a kind's code, is stored as it is.
            let declared = handler.is_some_and(|h| h.codes().contains(&code));
            kind_code = (declared && is_kind_code(code)).then_some(code);
            (Code::HandlerFailed, None, false)
        }
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
    let Ok(conn) = crate::db::checkout(&shared.pool).await else {
        return Transition::Unwritten;
    };
    shared.stats.record_round_trips(1);
    let written = if transient {
        crash_point!("retry.schedule");
        let attempt = job.ctx.attempt;
        let delay = after
            .or_else(|| handler.and_then(|h| h.retry_delay(attempt)))
            .map_or_else(
                || {
                    let config = &shared.config;
                    retry::delay(attempt, config.retry_min_delay, config.retry_max_delay)
                },
                |asked| asked.min(RETRY_AFTER_MAX),
            );
        // Pipelined before the retry, in the same round trip: a cancel recorded while this job's
        // commit held its row is set on the row first, and the retry ends the job `cancelled`.
        let (applied, retried) = futures::join!(
            crate::jobs::apply_deferred(&*conn, Some(job.lease().job_id)),
            completer::retry(&*conn, job.lease(), delay)
        );
        if let Err(e) = applied {
            tracing::warn!(code = %e.code(), "applying a deferred cancel request failed");
        }
        retried
    } else if let Some(stored) = kind_code {
        completer::fail_with_kind_code(&*conn, job.lease(), stored).await
    } else {
        completer::fail(&*conn, job.lease(), code, record_index).await
    };
    written.unwrap_or(Transition::Unwritten)
}
