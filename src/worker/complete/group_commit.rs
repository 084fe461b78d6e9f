//! Group commit: the effects phase of every job that finished computing meanwhile, in one fenced
//! transaction, or in one statement when none of them writes; so a replica pays one commit (one
//! WAL flush, one round trip for no-op effects) for a whole group of jobs instead of one each.
//!
//! Each job of a batch carries a [`step::Step`] that every phase maps forward (`Claimed → Fenced
//! → Applying → Applied → Succeeded`, or `Ended` with its own failure); its outcome is read off
//! that state, and how the batch ended, in one place ([`step::Step::settle`]).
//!
//! Invariants this module keeps:
//! - A lane takes the first ready job, then whatever else is queued (up to what the replica can
//!   hold: its slots and its prefetch).
//!   It commits at once unless the other lane is committing right then: it then goes on
//!   gathering until that commit ends, its batch is full, or [`GATHER_LIMIT`] has passed, so
//!   under load one batch forms while the other flushes, instead of both lanes committing
//!   fragments. An idle replica's single job (no other commit running) commits as soon as it is
//!   ready; a slow batch in one lane (effects waiting on a lock) delays the other by at most
//!   [`GATHER_LIMIT`].
//! - A job's task ends only after its transition is durable: it waits for the reply, which is
//!   sent after COMMIT returned (or after the outcome was resolved). (Its slot freed earlier, when
//!   its compute phase ended.)
//! - Every job of a batch is fenced on its own by `id + lease_claim_id + status = 'running'`, and
//!   its row is locked (`FOR NO KEY UPDATE`, in id order) before any effect is written. A batch never
//!   commits effects or success for a job whose fence failed or whose owner asked to cancel it.
//! - Each job's effects stay atomic: in a batch of more than one job, each job's effects run under
//!   their own savepoint, so one job's failure rolls back its own writes only, and the rest of the
//!   batch still commits. Effects, ledger row and `succeeded` of a job commit together. The jobs
//!   whose effects offer a set (the ETL loads) apply first, together, in set-based statements
//!   under one savepoint per set (`sets`); a set that fails is rolled back whole and its jobs
//!   apply one by one as above.
//! - No transaction holds more than [`MAX_JOBS_PER_TRANSACTION`] jobs' savepoints, so a group
//!   commit never overflows PostgreSQL's subtransaction cache: a larger batch that writes commits
//!   as several transactions.
//! - A COMMIT whose outcome is unknown (connection lost) is resolved by reading the ledger under
//!   each job's claim, never by running a job again; a job whose success is not found there
//!   ends [`Failure::Infrastructure`] (its executor commits its result again, or gives it back).
//! - Each job's effects have their own budget, counted from when they start applying: time
//!   queued for a lane, behind the other jobs of the batch or waiting for the fenced row lock is
//!   never counted against a job. Effects that overrun it are cut: a statement of theirs still
//!   running shortly after is cancelled on the server (the driver's cancel token), their
//!   savepoint (or, alone, the whole transaction) rolled back, and the job fails transiently;
//!   the rest of the batch commits.
//! - At shutdown, once the grace period is over and the job tasks are gone,
//!   `GroupCommit::abandon` stops the lanes without waiting for the database: the batch in
//!   flight is dropped uncommitted (rolled back) and its running statement cancelled on the
//!   server; a COMMIT already sent stands, and the fenced release settles against it.
//! - Handler code never ends a lane: `Effects::apply` runs guarded, and a job's effects are
//!   dropped under a guard of their own (`OwnedEffects`), so a panicking `Drop` is logged, not
//!   unwound into the lane (where a second one, while the first unwound, would abort the
//!   process). A lane that dies of a panic all the same is restarted.
//! - A failure of the batch itself (not of one job's effects) fails every job of the batch that
//!   had not already failed on its own and drops the session it failed on: an infrastructure
//!   fault (no connection, a lost or terminated session, a statement bound) as
//!   [`Failure::Infrastructure`], never charged; any other always transiently (whatever the
//!   SQLSTATE: only a handler's verdict fails a job for good), a fenced retry within its bound.

use crate::codes::Code;
use crate::error::is_connection_loss;
use crate::job::handler::Output;
use crate::worker::complete::completer::{self, Failure, Fenced};
use crate::worker::complete::infrastructure::is_infrastructure;
use crate::worker::lease::Lease;
use crate::worker::stats::WorkerStats;
use effects::{apply, roll_back};
use lane::{restarting, CommitGuard, Committing, Gather};
use sessions::{CommitPool, CommitSession};
use sets::apply_sets;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;
use step::{advance, BatchEnd, Outcome, Step};
pub(crate) use step::{OwnedEffects, Ready};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_postgres::{CancelToken, Statement};
use tokio_util::sync::CancellationToken;

/// How many batches of one replica may commit at once. Two lanes let one batch form while the
/// other waits for its WAL flush; more would only split the groups smaller on this workload.
pub(crate) const COMMIT_LANES: usize = 2;

/// How long a lane that holds a job may go on gathering while the other lane commits: about
/// one WAL flush on a slow disk, so a lane waits for its partner's flush but never stalls
/// behind a batch whose effects are slow.
pub(crate) const GATHER_LIMIT: Duration = Duration::from_millis(5);

/// A ready job and where its outcome goes.
struct Queued {
    /// The job.
    ready: Ready,
    /// Its task, waiting.
    reply: oneshot::Sender<Outcome>,
}

/// The replica's handle on its commit lanes; cloned into every job task.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    /// Where job tasks queue their ready jobs.
    queue: mpsc::UnboundedSender<Queued>,
    /// Cancelled by [`GroupCommit::abandon`]: the lanes drop their batch and end.
    stop: CancellationToken,
    /// The connections the lanes are committing on.
    in_flight: InFlight,
}

impl GroupCommit {
    /// Starts [`COMMIT_LANES`] lanes committing on `pool`, in batches of at most `max_batch`,
    /// gathering for at most [`GATHER_LIMIT`] while the other lane commits. The lanes end when
    /// the last handle is dropped and the queue is empty, or when abandoned.
    pub(crate) fn start(
        pool: CommitPool,
        stats: Arc<WorkerStats>,
        max_batch: usize,
    ) -> GroupCommit {
        GroupCommit::gathering(pool, stats, max_batch, GATHER_LIMIT)
    }

    /// [`GroupCommit::start`] with lanes that gather for at most `gather_limit`.
    fn gathering(
        pool: CommitPool,
        stats: Arc<WorkerStats>,
        max_batch: usize,
        gather_limit: Duration,
    ) -> GroupCommit {
        let (queue, receiver) = mpsc::unbounded_channel();
        let (stop, in_flight) = (CancellationToken::new(), InFlight::default());
        let gather = Arc::new(Gather {
            receiver: Arc::new(Mutex::new(receiver)),
            max_batch: max_batch.max(1),
            gather_limit,
            committing: Committing::default(),
        });
        for index in 0..COMMIT_LANES {
            let lane = Lane {
                index,
                pool: pool.clone(),
                stats: Arc::clone(&stats),
                gather: Arc::clone(&gather),
                stop: stop.clone(),
                in_flight: in_flight.clone(),
            };
            tokio::spawn(restarting(move || lane.clone().run()));
        }
        GroupCommit {
            queue,
            stop,
            in_flight,
        }
    }

    /// Queues `ready` for the next batch and waits until its transition is durable.
    pub(crate) async fn commit(&self, ready: Ready) -> Outcome {
        let (reply, outcome) = oneshot::channel();
        if self.queue.send(Queued { ready, reply }).is_err() {
            return Err(Failure::Code(Code::TransientDatabase));
        }
        outcome
            .await
            .unwrap_or(Err(Failure::Code(Code::TransientDatabase)))
    }

    /// Stops the lanes at once (shutdown, after the grace period, once the job tasks are
    /// gone): each drops the batch it was committing, uncommitted (its transaction is rolled
    /// back; a COMMIT already sent stands, and the fenced release settles against it), and ends;
    /// the statement each was running is cancelled on the server, so a commit blocked in the
    /// database (on a row lock, say) frees its job rows now instead of at `lock_timeout`.
    pub(crate) async fn abandon(&self) {
        let running = self.in_flight.tokens();
        self.stop.cancel();
        for statement in running {
            // Refused or too late: the server ends the transaction when the connection closes.
            let _ = crate::db::cancel(&statement).await;
        }
    }
}

/// The cancel tokens of the connections the lanes are committing batches on, by lane.
#[derive(Clone, Default)]
struct InFlight(Arc<StdMutex<HashMap<usize, CancelToken>>>);

impl InFlight {
    /// The tokens of every batch being committed now.
    fn tokens(&self) -> Vec<CancelToken> {
        self.lock().values().cloned().collect()
    }

    /// Shows `token` as lane `lane`'s until the returned guard drops.
    fn show(&self, lane: usize, token: CancelToken) -> Shown<'_> {
        self.lock().insert(lane, token);
        Shown {
            in_flight: self,
            lane,
        }
    }

    /// The map, even if a panic poisoned it (each entry is written whole).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, CancelToken>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A lane's connection shown in [`InFlight`]; removed when dropped (also when the batch's future
/// is dropped, or unwinds).
struct Shown<'a> {
    /// Where it is shown.
    in_flight: &'a InFlight,
    /// The lane.
    lane: usize,
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        self.in_flight.lock().remove(&self.lane);
    }
}

/// One commit lane: takes what is queued, commits it as one batch, answers each job, repeats.
#[derive(Clone)]
struct Lane {
    /// Which lane it is.
    index: usize,
    /// Where its connections come from.
    pool: CommitPool,
    /// The replica's counters.
    stats: Arc<WorkerStats>,
    /// How it gathers its batches (shared by the lanes).
    gather: Arc<Gather<Queued>>,
    /// Ends the lane, dropping its batch ([`GroupCommit::abandon`]).
    stop: CancellationToken,
    /// Where it shows the connection of the batch it commits.
    in_flight: InFlight,
}

impl Lane {
    /// Runs the lane until the queue closes or the lane is stopped.
    async fn run(self) {
        while let Some(Some(batch)) = self
            .stop
            .run_until_cancelled(self.gather.next_batch())
            .await
        {
            let (jobs, replies): (Vec<Ready>, Vec<_>) =
                batch.into_iter().map(|q| (q.ready, q.reply)).unzip();
            self.stats.record_commit_batch(jobs.len());
            let counted = CommitGuard::start(&self.gather.committing);
            let committing =
                commit_batch(&self.pool, &self.stats, jobs, (&self.in_flight, self.index));
            // Stopped: the batch is dropped unanswered (its tasks are gone).
            let Some(outcomes) = self.stop.run_until_cancelled(committing).await else {
                return;
            };
            drop(counted);
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A task that is gone (aborted at shutdown) needs no answer: its fenced release
                // settles against whatever committed.
                let _ = reply.send(outcome);
            }
        }
    }
}

/// The most jobs one execution transaction applies the effects of. In a transaction of several
/// jobs each job's effects run under a savepoint of their own, a subtransaction; PostgreSQL
/// keeps at most 64 of a transaction's subtransaction ids in its shared cache
/// (`PGPROC_MAX_CACHED_SUBXIDS`), and while a transaction has more, every snapshot taken in the
/// cluster is "suboverflowed" and looks its subtransactions up in the `pg_subtrans` SLRU, the
/// well-known cliff. A batch larger than this (slots plus prefetch reach 136 by default) is
/// committed as several transactions. Effects that open savepoints of their own count against
/// the same 64; a set of several jobs' effects (`sets`) holds one for all of them.
pub(crate) const MAX_JOBS_PER_TRANSACTION: usize = 64;

/// The savepoint each job's effects apply under, in a batch of several jobs.
const JOB_SAVEPOINT: &str = "job_effects";

/// Commits one batch, in transactions of at most [`MAX_JOBS_PER_TRANSACTION`] jobs when it
/// writes effects (each with its own outcome: a failure of one never settles another's jobs);
/// returns one outcome per job, in order. The connection it commits on is shown in `in_flight`
/// as the given lane's while it does.
async fn commit_batch(
    pool: &CommitPool,
    stats: &WorkerStats,
    jobs: Vec<Ready>,
    shown: (&InFlight, usize),
) -> Vec<Outcome> {
    if jobs.len() <= MAX_JOBS_PER_TRANSACTION || !jobs.iter().any(|j| j.writes) {
        return commit_transaction(pool, stats, jobs, shown).await;
    }
    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        let part = jobs.by_ref().take(MAX_JOBS_PER_TRANSACTION).collect();
        outcomes.extend(commit_transaction(pool, stats, part, shown).await);
    }
    outcomes
}

/// Commits `jobs` in one transaction (or one statement, when none writes); returns one outcome
/// per job, in order.
async fn commit_transaction(
    pool: &CommitPool,
    stats: &WorkerStats,
    jobs: Vec<Ready>,
    (in_flight, lane): (&InFlight, usize),
) -> Vec<Outcome> {
    let leases: Vec<Lease> = jobs.iter().map(|j| j.lease).collect();
    let mut steps: Vec<Step> = jobs.into_iter().map(Step::Claimed).collect();
    let end = match crate::db::checkout(pool).await {
        // No connection to commit on: the infrastructure's fault, never the jobs'.
        Err(_) => BatchEnd::Infrastructure,
        Ok(mut conn) => {
            let CommitSession {
                client,
                succeed,
                succeed_locked,
                broken,
            } = &mut *conn;
            let _shown = in_flight.show(lane, client.cancel_token());
            let written = if steps.iter().any(Step::writes) {
                write_effects(
                    client,
                    stats,
                    (&leases, &mut steps),
                    succeed_locked.as_ref(),
                )
                .await
            } else {
                succeed_alone(client, stats, (&leases, &mut steps), succeed.as_ref()).await
            };
            match written {
                Ok(()) => {
                    crash_point!("commit.after");
                    BatchEnd::Committed
                }
                Err(e) if is_connection_loss(&e) => {
                    BatchEnd::Unknown(committed_anyway(pool, stats, &leases).await)
                }
                Err(e) => {
                    *broken = true;
                    batch_failure(stats, &e)
                }
            }
        }
    };
    steps
        .into_iter()
        .zip(&leases)
        .map(|(step, lease)| step.settle(lease, &end))
        .collect()
}

/// The statement of a batch that writes nothing (`prepared`: the success statement prepared on
/// `client`): each job `Claimed → Succeeded`, or `Ended` cancelled (fenced, but its owner asked
/// to cancel it) or with its lease lost.
async fn succeed_alone(
    client: &tokio_postgres::Client,
    stats: &WorkerStats,
    (leases, steps): (&[Lease], &mut [Step]),
    prepared: Option<&Statement>,
) -> Result<(), tokio_postgres::Error> {
    stats.record_round_trips(1);
    let entries: Vec<(Lease, Option<Output>)> = leases.iter().map(|&l| (l, None)).collect();
    let fenced = completer::succeed_many_with(client, prepared, &entries).await?;
    let succeeded = fenced.values().filter(|f| **f == Fenced::Succeeded).count();
    if succeeded < leases.len() {
        // The second statement, which told a cancel request from a lost lease.
        stats.record_round_trips(1);
    }
    for (step, lease) in steps.iter_mut().zip(leases) {
        *step = match fenced.get(lease) {
            Some(Fenced::Succeeded) => Step::Succeeded,
            Some(Fenced::CancelRequested) => Step::Ended(Failure::Cancelled),
            None => Step::Ended(Failure::LeaseLost),
        };
    }
    Ok(())
}

/// The transaction of a batch that writes effects: fences and locks the rows (`Claimed →
/// Fenced | Ended`), applies the effects of the jobs whose kind sets them together (`sets`),
/// then each other job's, each under its own savepoint when the batch has several jobs
/// (`Fenced → Applied | Ended`), writes the ledger rows and `succeeded` of the
/// jobs whose effects applied (`Applied → Succeeded`, through `prepared`, the locked success
/// statement prepared on `conn`), and commits.
async fn write_effects(
    conn: &mut tokio_postgres::Client,
    stats: &WorkerStats,
    (leases, steps): (&[Lease], &mut [Step]),
    prepared: Option<&Statement>,
) -> Result<(), tokio_postgres::Error> {
    let isolate = steps.len() > 1;
    let cancel = conn.cancel_token();
    stats.record_round_trips(2);
    let mut tx = conn.transaction().await?;
    let fenced = completer::lock_fenced(&tx, leases).await?;
    for (step, lease) in steps.iter_mut().zip(leases) {
        advance(step, |claimed| claimed.fence(fenced.get(lease)));
    }
    if isolate {
        apply_sets(&mut tx, stats, steps, &cancel).await?;
    }
    for step in steps.iter_mut() {
        let ready = match std::mem::replace(step, Step::Applying) {
            Step::Fenced(ready) => ready,
            other => {
                *step = other;
                continue;
            }
        };
        let applied = if isolate {
            stats.record_round_trips(2);
            let savepoint = tx.savepoint(JOB_SAVEPOINT).await?;
            let applying = apply(&savepoint, ready.effects, ready.budget, &cancel);
            let applied = tracing::Instrument::instrument(applying, ready.span).await;
            if applied.is_ok() {
                savepoint.commit().await?;
            } else {
                roll_back(savepoint, JOB_SAVEPOINT, stats).await?;
            }
            applied
        } else {
            let applying = apply(&tx, ready.effects, ready.budget, &cancel);
            tracing::Instrument::instrument(applying, ready.span).await
        };
        crash_point!("effects.applied");
        *step = applied.map_or_else(Step::Ended, Step::Applied);
    }
    let entries: Vec<(Lease, Option<Output>)> = steps
        .iter()
        .zip(leases)
        .filter_map(|(step, &lease)| match step {
            Step::Applied(ledger) => Some((lease, ledger.clone())),
            _ => None,
        })
        .collect();
    stats.record_round_trips(1);
    if entries.is_empty() {
        return tx.rollback().await;
    }
    stats.record_round_trips(1);
    let succeeded = completer::succeed_locked(&tx, prepared, &entries).await?;
    for (step, lease) in steps.iter_mut().zip(leases) {
        if matches!(step, Step::Applied(_)) && succeeded.contains(lease) {
            *step = Step::Succeeded;
        }
    }
    crash_point!("commit.before");
    tx.commit().await
}

/// The batch's connection was lost, perhaps during COMMIT: reads, on another connection, which
/// of `leases` have their ledger row under their claim (those committed; the others did not,
/// and their fenced retry follows). `None` if the ledger cannot be read either.
async fn committed_anyway(
    pool: &CommitPool,
    stats: &WorkerStats,
    leases: &[Lease],
) -> Option<HashSet<Lease>> {
    stats.record_round_trips(1);
    let conn = crate::db::checkout(pool).await.ok()?;
    completer::ledger_by_claim(&conn.client, leases).await.ok()
}

/// How a failure of the batch statements themselves (not of a job's effects, which end only
/// their own job) ends the batch: an infrastructure fault (`infrastructure`) is never the jobs'
/// (each commits again or is given back, uncharged); any other is always transient, whatever
/// the SQLSTATE, since only a handler's own verdict may fail a job for good (a prepared
/// statement gone behind a pooler, a cached plan a migration changed: each job retries within
/// its attempt bound). Counted and logged by SQLSTATE.
fn batch_failure(stats: &WorkerStats, e: &tokio_postgres::Error) -> BatchEnd {
    stats.record_commit_failure();
    stats.record_statement_failure(e.code());
    let sqlstate = e.code().map_or("none", |c| c.code());
    let infrastructure = is_infrastructure(e);
    tracing::warn!(
        code = %Code::TransientDatabase,
        sqlstate,
        infrastructure,
        "a group commit's own statement failed; its jobs commit again or retry"
    );
    if infrastructure {
        BatchEnd::Infrastructure
    } else {
        BatchEnd::Failed(Code::TransientDatabase, e.code().cloned())
    }
}

mod effects;
mod lane;
pub(crate) mod sessions;
mod sets;
mod step;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transaction_tests;
