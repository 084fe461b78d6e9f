//! Claiming and running jobs, outside the claim loop's own state: the claim and next-due
//! statements as a replica sends them (on its claim pool, bounded, counted), the body of one
//! job's task (its timed execution, and the fenced settle of a task that died), and [`step`],
//! which claims once and runs what it took.
//!
//! Invariants this module keeps:
//! - Every statement here is bounded on the client ([`db::bounded`]) and counted as a round trip.
//! - A replica with no handlers claims nothing (it has no kind to claim).
//! - A task that died of a panic no guard caught is settled `failed` with `handler_panicked`
//!   under its fence, so no claim stays held forever.

use crate::codes::Code;
use crate::db;
use crate::error::Error;
use crate::worker::claim::claimer::{Claim, Claimant};
use crate::worker::claim::queues::QueueShares;
use crate::worker::complete::completer::{self, Transition};
use crate::worker::lease::{ClaimedJob, Lease};
use crate::worker::liveness::presence::{self, Answer, Change};
use crate::worker::run::executor;
use crate::worker::run::slots::{SlotPermit, Slots};
use crate::worker::shared::Shared;
use crate::worker::stats::ClaimReason;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One step: claims what is due now (up to the slots, shared among the served queues by
/// weight), runs every claimed job to its transition on a task of its own, and returns `(job id,
/// transition)` for each, by job id.
pub(crate) async fn step(shared: &Arc<Shared>) -> Result<Vec<(Uuid, Transition)>, Error> {
    let asks = owned(QueueShares::new(&shared.config.queues).asks(shared.config.slots));
    let jobs = claim_with(shared, &asks, ClaimReason::Step, None, false)
        .await
        .0
        .unwrap_or_else(|| Ok(Claim::default()))?
        .jobs;
    let slots = Arc::new(Slots::default());
    let mut tasks = JoinSet::new();
    for job in jobs {
        let shared = Arc::clone(shared);
        let slot = slots.take();
        tasks.spawn(async move {
            let (id, held_permit, queue) = (job.id(), job.held_permit, Arc::clone(&job.queue));
            let lease = job.lease();
            let transition = timed_execute(&shared, job, CancellationToken::new(), slot).await;
            if transition == Transition::GivenBack {
                crate::worker::complete::give_back::give_back(&shared, lease, transition);
            }
            shared.stats.record_in(&queue, transition);
            (id, transition, held_permit && transition.frees_permits())
        });
    }
    let ended: Vec<(Uuid, Transition, bool)> = tasks.join_all().await;
    // A step claims nothing after it: the permits it freed are the waiting replicas'.
    if ended.iter().any(|e| e.2) {
        wake_waiting(shared).await;
    }
    let mut done: Vec<(Uuid, Transition)> = ended.into_iter().map(|(id, t, _)| (id, t)).collect();
    done.sort_by_key(|d| d.0);
    Ok(done)
}

/// `asks`, owned: what a claim sent later asks of each queue.
pub(crate) fn owned(asks: Vec<(&str, usize)>) -> Vec<(String, usize)> {
    asks.into_iter().map(|(q, n)| (q.to_owned(), n)).collect()
}

/// Claims, of each queue of `asks`, up to as many due jobs as it asks, for `reason`, with the
/// presence `change` (if any) pipelined before it on the same connection, in the same round
/// trip. Returns the claim (its jobs, and what it says of the capped asks) and what the change
/// answered (`None` when it was not sent); the jobs are returned whatever the change answered,
/// so a failed presence statement never loses a claim. The one exception is an early retry of
/// held barriers (`alone`, `presence::retry_alone`: a `Change::Settle`): its tries go first,
/// alone, and the claim follows only if one succeeded (claiming nothing loses nothing); the
/// claim is `None` when it did not. A replica with no handlers claims nothing.
#[tracing::instrument(name = "claim", skip_all, fields(?reason, ?change))]
pub(crate) async fn claim_with(
    shared: &Shared,
    asks: &[(String, usize)],
    reason: ClaimReason,
    change: Option<&Change>,
    alone: bool,
) -> (Option<Result<Claim, Error>>, Answer) {
    if shared.registry.is_empty() {
        return (Some(Ok(Claim::default())), None);
    }
    let conn = match db::checkout(&shared.claim_pool).await {
        Ok(conn) => conn,
        Err(e) => return (Some(Err(e)), None),
    };
    let claimant = Claimant {
        owner_id: shared.owner_id(),
        owner_locked: shared.owner_locked(),
        lease: shared.config.lease,
        heartbeat_interval: shared.config.heartbeat_interval,
        alive_locked: shared.holds_alive_locks(),
        kinds: &shared.kinds,
    };
    let asks: Vec<(&str, usize)> = asks.iter().map(|(q, n)| (q.as_str(), *n)).collect();
    let queues = shared.queue_names();
    crash_point!("claim.before");
    let bound = shared.statement_bound;
    // Polled first, so its statements are queued (and run) before the claim's.
    let presence = async {
        match change {
            Some(change) => Some(
                db::bounded(
                    bound,
                    presence::send(
                        conn.client(),
                        conn.presence(),
                        change,
                        claimant.owner_id,
                        (&queues, &shared.kinds),
                        shared.wake_token(),
                    ),
                )
                .await,
            ),
            None => None,
        }
    };
    if reason == ClaimReason::Poll {
        // A queue uncapped since takes the cheaper claim again (`claimer::CappedQueues`).
        shared.capped.forget();
    }
    let claim = conn.claim(claimant, &asks, &shared.capped);
    let (answer, claim) = if let (true, Some(Change::Settle(tried))) = (alone, change) {
        // A retry of a held barrier, and nothing else: the claim is worth sending only once
        // the try succeeds (it then sees every enqueue that held the barrier).
        let answer = presence.await;
        // The try's own round trip (a claim sent after it counts its own).
        shared.stats.record_round_trips(1);
        if !matches!(&answer, Some(Ok(held)) if held.len() < tried.len()) {
            return (None, answer);
        }
        (answer, db::bounded(bound, claim).await)
    } else {
        futures::join!(presence, db::bounded(bound, claim))
    };
    if claim.as_ref().is_ok_and(|claim| !claim.jobs.is_empty()) {
        // Only after a claim that took jobs: an empty (or failed) one crashing here would leave
        // nothing claimed for the crash test to find.
        crash_point!("claim.after_commit");
    }
    if !conn.is_prepared() {
        shared.stats.record_unnamed_claim();
    }
    if let Err(e) = &claim {
        shared.stats.record_statement_failure(e.db_code());
    }
    if let Ok(claim) = &claim {
        shared.stats.record_claim(reason, claim.jobs.len());
        for job in &claim.jobs {
            shared.stats.record_pickup(job.due_for);
        }
    }
    (Some(claim), answer)
}

/// Wakes the waiting replicas for permits this replica's completions freed and it will not claim
/// again itself (`freed`), best effort: a lost wake leaves the permits to the others' poll.
pub(crate) async fn wake_waiting(shared: &Shared) {
    let woken = async {
        let conn = db::checkout(&shared.pool).await?;
        shared.stats.record_round_trips(1);
        let queues = shared.queue_names();
        db::bounded(
            shared.statement_bound,
            completer::wake_waiting(&*conn, &queues),
        )
        .await
    };
    match woken.await {
        Ok(()) => shared.stats.record_freed_wake(),
        Err(e) => tracing::warn!(code = %e.code(), "waking the waiting replicas failed"),
    }
}

/// Deletes the replica's waiting row (it stops), best effort: a row left behind only makes
/// enqueues notify, and recovery deletes it once it is stale.
pub(crate) async fn leave(shared: &Shared) {
    let left = async {
        let conn = db::checkout(&shared.claim_pool).await?;
        let leave = presence::leave(conn.client(), shared.owner_id());
        db::bounded(shared.statement_bound, leave).await
    };
    if let Err(e) = left.await {
        tracing::warn!(code = %e.code(), "leaving the waiting replicas failed");
    }
}

/// How long until the next deferred job is due, asked after a short claim (once its jobs are
/// already running, so the question never delays them).
pub(crate) async fn next_due(shared: &Shared) -> Result<Option<Duration>, Error> {
    let conn = db::checkout(&shared.claim_pool).await?;
    shared.stats.record_round_trips(1);
    let queues = shared.queue_names();
    let next = conn.next_due(&queues, &shared.kinds);
    db::bounded(shared.statement_bound, next).await
}

/// Executes `job` in `slot` inside its span (its id, kind, queue and attempt: never its
/// payload), which the handler's own logs carry, recording its duration.
pub(crate) async fn timed_execute(
    shared: &Shared,
    job: ClaimedJob,
    lost: CancellationToken,
    slot: SlotPermit,
) -> Transition {
    let started = Instant::now();
    let span = tracing::info_span!(
        "execute",
        job_id = %job.id(),
        kind = %job.ctx.kind,
        queue = %job.queue,
        attempt = job.ctx.attempt
    );
    let transition =
        tracing::Instrument::instrument(executor::execute(shared, job, lost, slot), span.clone())
            .await;
    shared
        .stats
        .execution
        .observe(started.elapsed().as_secs_f64());
    span.in_scope(|| tracing::debug!(?transition, "job settled"));
    transition
}

/// Ends the job of `lease` `failed` with `handler_panicked`, under its fence, after its task
/// died: what the executor would have written had the panic reached its guard.
pub(crate) async fn settle_dead_task(shared: &Shared, lease: Lease) -> Transition {
    let Ok(conn) = db::checkout(&shared.pool).await else {
        return Transition::Unwritten;
    };
    shared.stats.record_round_trips(1);
    db::bounded(
        shared.statement_bound,
        completer::fail(&*conn, lease, Code::HandlerPanicked, None),
    )
    .await
    .unwrap_or(Transition::Unwritten)
}

/// Whether a claim `failed` on the node fence of a cell whose shards moved to another Citus
/// node (`db::citus::CELL_MOVED`): the replica stops at once and starts again on the new node.
/// (Once the node dropped the moved shards, the placement watch tells it,
/// `liveness::placement`.)
pub(super) fn cell_moved(failed: Option<&Error>) -> bool {
    failed.is_some_and(|e| {
        e.db_code()
            .is_some_and(|code| code.code() == crate::db::citus::CELL_MOVED)
    })
}

/// Whether a claim that failed with `failed` met a transaction-mode pooler the configuration did
/// not declare (a named prepared statement missing or already there on its server connection,
/// while the configuration says the URL keeps sessions): the start-up check did not catch it,
/// and every claim would fail the same way, so the replica stops. Its jobs (none were claimed)
/// are left as they are.
pub(super) fn undeclared_pooler(shared: &Shared, failed: Option<&Error>) -> bool {
    shared.pooler.keeps_sessions()
        && failed.is_some_and(|e| {
            e.db_code()
                .is_some_and(crate::db::is_prepared_statement_miss)
        })
}
