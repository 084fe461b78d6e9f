//! One job's effects inside a group commit's transaction: applied within their own budget,
//! guarded against the handler's panics, and cut (their running statement cancelled on the
//! server) when they overrun.
//!
//! Invariants this module keeps:
//! - A job's budget counts from when its effects start applying, never from when it queued.
//! - Handler code never unwinds into the lane: a panic in `Effects::apply` or in its future is
//!   the job's failure (`handler_panicked`).
//! - A set of several jobs' effects (`EffectsSet`) is guarded and budgeted the same way, as one.
//! - Effects that failed because their session met an infrastructure fault (a lost connection, a
//!   terminated backend, a statement bound) end [`Failure::Infrastructure`], never the job's own
//!   failure.
//! - Effects cut at their budget leave no statement running behind them: the one they were
//!   running is waited for briefly, then cancelled on the server, before the savepoint (or the
//!   transaction) is rolled back.

use super::step::OwnedEffects;
use crate::codes::Code;
use crate::job::handler::{Effects, EffectsSet, JobError, Output};
use crate::worker::complete::completer::Failure;
use crate::worker::complete::infrastructure::is_infrastructure;
use crate::worker::guard::{guarded, Guarded};
use crate::worker::stats::WorkerStats;
use std::time::Duration;
use tokio_postgres::{CancelToken, Transaction};

/// How long the statement that effects cut at their budget were running may still take to end
/// on its own before it is cancelled on the server.
const CUT_STATEMENT_WAIT: Duration = Duration::from_millis(100);

/// Applies one job's effects on `tx` within `budget`, counted from now; a panic is the job's
/// failure, in the call of [`Effects::apply`] as well as in its future (else it would end the
/// lane). Effects that overrun are cut; see [`settle_cut_statement`].
pub(super) async fn apply(
    tx: &Transaction<'_>,
    mut effects: OwnedEffects,
    budget: Duration,
    cancel: &CancelToken,
) -> Result<Option<Output>, Failure> {
    // Taken inside the guard: `apply` consumes them, so a panicking `Drop` runs in its call.
    let applying = async move {
        match effects.take() {
            Some(effects) => effects.apply(tx).await,
            None => Ok(None),
        }
    };
    within_budget(tx, budget, cancel, applying).await
}

/// Applies `members`, effects of one type, together through their `set` on `tx` within
/// `budget` (the smallest of theirs), counted from now: as [`apply`], for the whole set.
pub(super) async fn apply_set(
    tx: &Transaction<'_>,
    set: &dyn EffectsSet,
    members: &mut [Box<dyn Effects>],
    budget: Duration,
    cancel: &CancelToken,
) -> Result<Vec<Option<Output>>, Failure> {
    let applying = async move { set.apply(tx, members).await };
    within_budget(tx, budget, cancel, applying).await
}

/// Runs `handler_code` (effects applying on `tx`) guarded, within `budget` counted from now:
/// a panic is a failure (`handler_panicked`), and an overrun is cut (see
/// [`settle_cut_statement`]).
async fn within_budget<T>(
    tx: &Transaction<'_>,
    budget: Duration,
    cancel: &CancelToken,
    handler_code: impl std::future::Future<Output = Result<T, JobError>>,
) -> Result<T, Failure> {
    let deadline = tokio::time::Instant::now() + budget;
    match guarded(deadline, handler_code).await {
        Guarded::TimedOut => {
            tracing::warn!(code = %Code::ExecutionTimeout, "effects overran their budget");
            settle_cut_statement(tx, cancel).await;
            Err(Failure::EffectsOverrun)
        }
        Guarded::Panicked => Err(Failure::Code(Code::HandlerPanicked)),
        Guarded::Done(Err(e)) if met_infrastructure(&e) => Err(Failure::Infrastructure),
        Guarded::Done(Err(e)) => Err(Failure::Job(e)),
        Guarded::Done(Ok(value)) => Ok(value),
    }
}

/// Whether effects that failed with `e` met an infrastructure fault (`infrastructure`: their
/// session lost, a statement bound) rather than failed on their own: a database error of theirs,
/// or a transient failure caused by one (an enqueue's lost connection). A handler's permanent
/// verdict is its own, whatever caused it.
fn met_infrastructure(e: &JobError) -> bool {
    if !matches!(
        e,
        JobError::Database(_) | JobError::Transient(_) | JobError::RetryAfter { .. }
    ) {
        return false;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = cause {
        if error
            .downcast_ref::<tokio_postgres::Error>()
            .is_some_and(is_infrastructure)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Rolls `savepoint` (named `name`) back and releases it, counting the round trip it adds.
/// `ROLLBACK TO` alone would leave it open, the savepoints after it nested inside it, and its
/// fresh subtransaction would then take an id of its own in PostgreSQL's subtransaction cache
/// as soon as one of them writes: one more per rolled-back savepoint, past the bound of
/// `MAX_JOBS_PER_TRANSACTION`. Released, it holds none.
///
/// # Errors
/// Either statement's.
pub(super) async fn roll_back(
    savepoint: Transaction<'_>,
    name: &str,
    stats: &WorkerStats,
) -> Result<(), tokio_postgres::Error> {
    stats.record_round_trips(1);
    savepoint
        .batch_execute(&format!("ROLLBACK TO SAVEPOINT {name}"))
        .await?;
    savepoint.commit().await
}

/// After effects were cut, waits until the statement they were running (if any) has ended, so
/// the rollback that follows does not queue behind it: an empty statement is answered only
/// after it. A statement still running after [`CUT_STATEMENT_WAIT`] (blocked on a row lock,
/// say) is cancelled on the server through `cancel` (the token of `tx`'s connection). The cancel
/// is sent only then, while that statement runs: sent at an idle session, it could reach a later
/// statement instead. The empty statement's own outcome (an error in an aborted transaction)
/// does not matter.
async fn settle_cut_statement(tx: &Transaction<'_>, cancel: &CancelToken) {
    let settled = tx.batch_execute("");
    tokio::pin!(settled);
    if tokio::time::timeout(CUT_STATEMENT_WAIT, &mut settled)
        .await
        .is_err()
    {
        let _ = crate::db::cancel(cancel).await;
        let _ = settled.await;
    }
}
