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
//! - Every attempt that failed (retried or failed) is written with its diagnosis
//!   (`job::diagnosis`): the phase it failed in (compute: the handler's `prepare`; effects: their
//!   `apply`, panic or overrun; commit: the batch's own statements, named by their SQLSTATE), the
//!   decision and its delay, its duration, its error's type names and the kind's declared detail,
//!   in the same fenced statement as its transition. A cancellation has none.
//! - The end of every attempt is logged (id, kind, queue, attempt, code, phase, duration): at
//!   info for a failure or a retry, at debug otherwise. The handler runs inside the job's span
//!   (id, kind, queue, attempt), and so do its effects, in the commit lane.
//! - Only codes, type names and numbers leave this module: no error text, SQL or payload is
//!   logged or stored.

use crate::codes::Code;
use crate::error::is_transient;
use crate::job::diagnosis::{database_chain, Chain, Decision, Diagnosis, Phase};
use crate::job::handler::{is_kind_code, Effects, Handler, JobError, RETRY_AFTER_MAX};
use crate::worker::complete::completer::{self, Failure, Transition};
use crate::worker::complete::group_commit::{OwnedEffects, Ready};
use crate::worker::guard::{guarded, Guarded};
use crate::worker::lease::{millis, trusted_for, ClaimedJob};
use crate::worker::run::retry;
use crate::worker::run::slots::SlotPermit;
use crate::worker::shared::Shared;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs `job` to a transition in `slot`, and logs the attempt's end (id, kind, queue, attempt,
/// code, phase, duration: never its payload, never an error's text) at info when it failed or
/// was retried, else at debug. `lost` is cancelled when the heartbeat finds the lease gone or the
/// job's local lease clock runs out: the compute phase stops at once; the effects phase needs no
/// signal, its fence check settles it. The caller runs it inside the job's span (`dispatch`).
pub(crate) async fn execute(
    shared: &Shared,
    job: ClaimedJob,
    lost: CancellationToken,
    slot: SlotPermit,
) -> Transition {
    let started = Instant::now();
    let ended = match AssertUnwindSafe(run(shared, &job, lost, slot, started))
        .catch_unwind()
        .await
    {
        Ok(ended) => ended,
        // Whatever panicked, the job's fenced failure is written, so its claim does not stay
        // held (renewed, then released with its attempt refunded, to run again) for ever. Should
        // even that panic, the task still ends: the lease expires and recovery returns the job.
        // No phase is known (the panic was not the handler's, which its guard catches), so no
        // diagnosis is written.
        Err(_panic) => {
            let panicked = Failure::Code(Code::HandlerPanicked);
            let failed = settle_failure(shared, &job, panicked, None, (None, started));
            AssertUnwindSafe(failed)
                .catch_unwind()
                .await
                .unwrap_or(Ended::unwritten(Code::HandlerPanicked.as_str(), None))
        }
    };
    log_end(&job, &ended, started.elapsed());
    ended.transition
}

/// How an attempt ended: its transition, and for a failure the code it was written with (a
/// kind's own, or a stable code) and the phase it failed in.
struct Ended {
    /// The transition written.
    transition: Transition,
    /// The failure's stored code, when the attempt failed.
    code: Option<&'static str>,
    /// Where it failed, when known.
    phase: Option<Phase>,
}

impl Ended {
    /// An attempt that ended with `transition` and no failure of its own.
    fn clean(transition: Transition) -> Ended {
        Ended {
            transition,
            code: None,
            phase: None,
        }
    }

    /// A failure with `code` in `phase` whose transition could not be written.
    fn unwritten(code: &'static str, phase: Option<Phase>) -> Ended {
        Ended {
            transition: Transition::Unwritten,
            code: Some(code),
            phase,
        }
    }
}

/// Logs the end of `job`'s attempt, which took `took`: at info when it failed (retried, failed or
/// unwritten), else at debug; only ids, names, codes, the phase and the duration.
fn log_end(job: &ClaimedJob, ended: &Ended, took: std::time::Duration) {
    let transition = transition_name(ended.transition);
    let code = ended.code.unwrap_or("");
    let phase = ended.phase.map_or("", Phase::as_str);
    let duration_ms = millis(took);
    let ctx = &job.ctx;
    // The one `job attempt ended` event, at the level given: `tracing` fixes an event's level
    // where it is written, so each level below is one arm of this event with the same fields.
    macro_rules! attempt_ended {
        ($level:expr) => {
            tracing::event!(
                $level,
                job_id = %ctx.id,
                kind = %ctx.kind,
                queue = %job.queue,
                attempt = ctx.attempt,
                code,
                phase,
                duration_ms,
                transition,
                "job attempt ended"
            )
        };
    }
    if ended.code.is_some() && ended.transition != Transition::Cancelled {
        attempt_ended!(tracing::Level::INFO);
    } else {
        attempt_ended!(tracing::Level::DEBUG);
    }
}

/// The name a log gives `transition`.
fn transition_name(transition: Transition) -> &'static str {
    match transition {
        Transition::Succeeded => "succeeded",
        Transition::Retried => "retried",
        Transition::Failed(_) => "failed",
        Transition::Cancelled => "cancelled",
        Transition::LeaseLost => "lease_lost",
        Transition::Unwritten => "unwritten",
        Transition::GivenBack => "given_back",
    }
}

/// [`execute`], unguarded; the attempt started at `started`.
async fn run(
    shared: &Shared,
    job: &ClaimedJob,
    lost: CancellationToken,
    slot: SlotPermit,
    started: Instant,
) -> Ended {
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
        Ok(effects) => commit(shared, job, effects, (budget, &lost))
            .await
            .map_err(|failure| {
                let phase = committed_phase(&failure);
                (failure, phase)
            }),
        Err(failure) => Err((failure, Phase::Compute)),
    };
    match outcome {
        Ok(transition) => Ended::clean(transition),
        Err((failure, phase)) => {
            let handler = handler.as_deref();
            settle_failure(shared, job, failure, handler, (Some(phase), started)).await
        }
    }
}

/// The phase a failure of the commit stage happened in: the effects' own (their error, their
/// panic, their overrun), else the fenced commit's (the batch's statements or its COMMIT).
fn committed_phase(failure: &Failure) -> Phase {
    match failure {
        Failure::Job(_) | Failure::EffectsOverrun | Failure::Code(Code::HandlerPanicked) => {
            Phase::Effects
        }
        _ => Phase::Commit,
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
            span: tracing::Span::current(),
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
/// `failed` for the rest, each with the attempt's diagnosis when its phase is known (the attempt
/// started at `started`). Lease loss is written nowhere (the job is no longer ours).
async fn settle_failure(
    shared: &Shared,
    job: &ClaimedJob,
    failure: Failure,
    handler: Option<&dyn Handler>,
    (phase, started): (Option<Phase>, Instant),
) -> Ended {
    let mut after = None;
    let mut kind_code = None;
    let mut chain = Chain::default();
    let mut detail = None;
    match &failure {
        Failure::Job(e) => {
            chain = e.chain();
            detail = e.detail().cloned();
        }
        Failure::Batch(_, sqlstate) => chain = database_chain(sqlstate.as_ref()),
        _ => {}
    }
    let (code, record_index, transient) = match failure {
        Failure::LeaseLost => return Ended::clean(Transition::LeaseLost),
        // Never the job's failure: given back uncharged, by its claim, once the database answers.
        Failure::Infrastructure => return Ended::clean(Transition::GivenBack),
        Failure::EffectsOverrun => (Code::ExecutionTimeout, None, true),
        Failure::Cancelled => (Code::Cancelled, None, false),
        Failure::Code(code) | Failure::Batch(code, _) => {
            (code, None, code == Code::TransientDatabase)
        }
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
    let stored = kind_code.unwrap_or(code.as_str());
    // A cancellation is no failure of the attempt: no diagnosis.
    let phase = phase.filter(|_| code != Code::Cancelled);
    let diagnose = |decision: Decision, delay: Option<i64>| {
        phase.map(|phase| {
            let diagnosis = Diagnosis::new(phase, decision, delay, millis(started.elapsed()))
                .with_chain(chain.clone());
            match &detail {
                Some(detail) => diagnosis.with_detail(detail),
                None => diagnosis,
            }
        })
    };
    let Ok(conn) = crate::db::checkout(&shared.pool).await else {
        return Ended::unwritten(stored, phase);
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
        let diagnosis = diagnose(Decision::Retry, Some(millis(delay)));
        // Pipelined before the retry, in the same round trip: a cancel recorded while this job's
        // commit held its row is set on the row first, and the retry ends the job `cancelled`.
        let (applied, retried) = futures::join!(
            crate::jobs::apply_deferred(&*conn, Some(job.lease().job_id)),
            completer::retry_diagnosed(&*conn, job.lease(), delay, diagnosis.as_ref())
        );
        if let Err(e) = applied {
            tracing::warn!(code = %e.code(), "applying a deferred cancel request failed");
        }
        retried
    } else {
        let diagnosis = diagnose(Decision::Fail, None);
        match kind_code {
            Some(stored) => {
                completer::fail_with_kind_code(&*conn, job.lease(), stored, diagnosis.as_ref())
                    .await
            }
            None => {
                let failed = (code, record_index);
                completer::fail_diagnosed(&*conn, job.lease(), failed, diagnosis.as_ref()).await
            }
        }
    };
    match written {
        Ok(transition) => Ended {
            transition,
            code: Some(match transition {
                Transition::Failed(Code::AttemptsExhausted) => Code::AttemptsExhausted.as_str(),
                _ => stored,
            }),
            phase,
        },
        Err(_) => Ended::unwritten(stored, phase),
    }
}
