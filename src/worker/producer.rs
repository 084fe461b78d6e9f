//! The producer: the replica's one claim loop. It claims due jobs into free slots when notified,
//! polled, due or freed, runs each claimed job on a task of its own, and at shutdown gives the
//! running jobs their grace period.
//!
//! Invariants this module keeps:
//! - ONE claim loop per replica. Notifications, the poll, due deferred jobs, freed slots, session
//!   reconnects and the rescuer's catch-up signal all feed it, and each wake causes at most one
//!   claim. A claim never asks for more jobs than there are free slots. After a claim that came
//!   back full (or a wake that found no free slot), the replica claims again as soon as half its
//!   slots are free, or [`REFILL_DELAY`] after the first slot freed (so claims and group commits
//!   stay batches, and no slot idles behind long jobs); after a short one it waits for the next
//!   signal.
//! - A claim that fails (a lost connection, a timeout) is tried again after
//!   [`CLAIM_RETRY_DELAY`], not only at the next notification or poll.
//! - The poll runs whatever happens to notifications, every `poll_interval` with ±10% jitter so
//!   replicas do not poll in lockstep; when a deferred job is due sooner, the loop wakes then.
//! - Every running job is held ([`HeldJobs`]) until its task ends. Each job task watches its own
//!   local lease clock and ends `LeaseLost` when it runs out. A task that dies of a panic no guard
//!   caught is replaced by a fenced `handler_panicked` write, so no claim stays held forever.
//! - The claim loop's statements are bounded on the client ([`db::bounded`]).

use crate::codes::Code;
use crate::db;
use crate::error::Error;
use crate::shutdown::{Shutdown, Stage};
use crate::worker::claimer::Claimant;
use crate::worker::completer::{self, Transition};
use crate::worker::executor;
use crate::worker::held::{HeldJob, HeldJobs};
use crate::worker::lease::{self, ClaimedJob, Lease, LeaseClock};
use crate::worker::session::Signals;
use crate::worker::shared::Shared;
use crate::worker::stats::ClaimReason;
use crate::worker::timing::{jittered, sleep_until_opt, wait};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long slots freed under a backlog wait for more to free before they are claimed anyway:
/// long enough to gather the next group commit's slots, short enough that a slot never idles
/// behind long-running jobs.
pub(crate) const REFILL_DELAY: Duration = Duration::from_millis(25);

/// How soon a failed claim is tried again.
pub(crate) const CLAIM_RETRY_DELAY: Duration = Duration::from_millis(100);

/// What the claim loop remembers between wakes.
#[derive(Debug, Default)]
struct WakeState {
    /// The last claim came back full (or a wake found no free slot): claim when a slot frees.
    backlog: bool,
    /// A notification arrived since the last claim.
    notified_since_claim: bool,
    /// When the next known deferred job is due.
    next_due: Option<Instant>,
    /// When slots freed under a backlog are claimed even if fewer than half are free.
    refill_at: Option<Instant>,
}

/// The claim loop and the job tasks it runs.
pub(crate) struct Producer {
    /// What the replica's roles share.
    shared: Arc<Shared>,
    /// The jobs this replica holds.
    held: HeldJobs,
    /// One task per running job, each ending with its claim id and transition.
    tasks: JoinSet<(Uuid, Transition)>,
    /// What the loop remembers between wakes.
    wake: WakeState,
}

/// Why the claim loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Shutdown asked it to drain.
    Draining,
    /// Another process took the owner id: stop at once.
    OwnerIdTaken,
}

impl Producer {
    /// A producer for the replica `shared` whose running jobs are `held`.
    pub(crate) fn new(shared: Arc<Shared>, held: HeldJobs) -> Producer {
        Producer {
            shared,
            held,
            tasks: JoinSet::new(),
            wake: WakeState::default(),
        }
    }

    /// Claims and runs jobs until `shutdown` asks the replica to drain or the session reports
    /// the owner id taken; `catch_up` is the rescuer's signal that it returned jobs to `pending`.
    pub(crate) async fn run(&mut self, catch_up: &Notify, shutdown: &mut Shutdown) -> Stopped {
        let config = self.shared.config.clone();
        let signals: Option<Arc<Signals>> = self.shared.signals.clone();
        let mut next_poll = Instant::now() + jittered(config.poll_interval);
        let mut reason = Some(ClaimReason::Startup);
        loop {
            if let Some(why) = reason.take() {
                self.claim_and_spawn(why).await;
            }
            tokio::select! {
                () = shutdown.reached(Stage::Draining) => return Stopped::Draining,
                () = wait(signals.as_deref().map(|s| &s.fatal)) => return Stopped::OwnerIdTaken,
                () = wait(signals.as_deref().map(|s| &s.notified)) => {
                    self.wake.notified_since_claim = true;
                    reason = Some(ClaimReason::Notify);
                }
                () = wait(signals.as_deref().map(|s| &s.reconnected)) => {
                    reason = Some(ClaimReason::CatchUp);
                }
                () = catch_up.notified() => reason = Some(ClaimReason::CatchUp),
                () = tokio::time::sleep_until(next_poll) => {
                    next_poll = Instant::now() + jittered(config.poll_interval);
                    reason = Some(ClaimReason::Poll);
                }
                () = sleep_until_opt(self.wake.next_due) => {
                    self.wake.next_due = None;
                    reason = Some(ClaimReason::Due);
                }
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    self.finish_task(done);
                    // A group commit frees its jobs' slots together: take them all before
                    // claiming, so the next claim fills them in one statement.
                    while let Some(done) = self.tasks.try_join_next() {
                        self.finish_task(done);
                    }
                    if self.wake.backlog {
                        if refill_now(config.slots, self.tasks.len()) {
                            reason = Some(ClaimReason::Drain);
                        } else if self.wake.refill_at.is_none() {
                            self.wake.refill_at = Some(Instant::now() + REFILL_DELAY);
                        }
                    }
                }
                () = sleep_until_opt(self.wake.refill_at) => {
                    self.wake.refill_at = None;
                    reason = Some(ClaimReason::Drain);
                }
            }
        }
    }

    /// Lets running jobs finish within the grace period (none when `now`, or once a second
    /// signal asks to stop immediately), then aborts the rest; their claims stay held, to be
    /// released.
    pub(crate) async fn drain(&mut self, shutdown: &mut Shutdown, now: bool) {
        tracing::info!(running = self.tasks.len(), "draining");
        let grace = tokio::time::sleep(if now {
            Duration::ZERO
        } else {
            self.shared.config.shutdown_grace
        });
        tokio::pin!(grace);
        while !self.tasks.is_empty() {
            tokio::select! {
                () = &mut grace => break,
                () = shutdown.reached(Stage::Immediate) => break,
                Some(done) = self.tasks.join_next() => self.finish_task(done),
            }
        }
        self.tasks.abort_all();
        while let Some(done) = self.tasks.join_next().await {
            self.finish_task(done);
        }
    }

    /// Claims for the free slots and starts the claimed jobs; then, after a short claim, learns
    /// when the next deferred job is due (the jobs are already running by then).
    async fn claim_and_spawn(&mut self, why: ClaimReason) {
        self.wake.refill_at = None;
        let free = self.shared.config.slots - self.tasks.len();
        if free == 0 {
            self.wake.backlog = true;
            return;
        }
        let claimed = Instant::now();
        let jobs = match claim(&self.shared, free, why).await {
            Ok(jobs) => jobs,
            Err(e) => {
                // Claim again soon rather than at the next wake, which may be a whole poll away
                // (a notification that caused this claim will not come again).
                tracing::warn!(code = %e.code(), "claim failed");
                let retry = Instant::now() + CLAIM_RETRY_DELAY;
                self.wake.next_due = Some(self.wake.next_due.map_or(retry, |due| due.min(retry)));
                return;
            }
        };
        if why == ClaimReason::Poll && !jobs.is_empty() && !self.wake.notified_since_claim {
            self.shared.stats.record_poll_found_work();
        }
        self.wake.notified_since_claim = false;
        self.wake.backlog = jobs.len() == free;
        for job in jobs {
            self.spawn_job(job, claimed);
        }
        if !self.wake.backlog {
            match next_due(&self.shared).await {
                Ok(due_in) => self.wake.next_due = due_in.map(|d| Instant::now() + d),
                Err(e) => tracing::warn!(code = %e.code(), "next-due query failed"),
            }
        }
    }

    /// Starts a task for `job`, claimed by a statement sent at `claimed`, and holds it.
    fn spawn_job(&mut self, job: ClaimedJob, claimed: Instant) {
        let lease = job.lease();
        let (id, claim) = (lease.job_id, lease.claim_id);
        let shared = Arc::clone(&self.shared);
        let lost = CancellationToken::new();
        let clock = Arc::new(LeaseClock::new(
            claimed + lease::trusted_for(self.shared.config.lease),
        ));
        let (task_lost, task_clock) = (lost.clone(), Arc::clone(&clock));
        let task = self.tasks.spawn(async move {
            let execution = timed_execute(&shared, job, task_lost.clone());
            tokio::pin!(execution);
            let transition = tokio::select! {
                transition = &mut execution => transition,
                // The clock ran out and cancelled the job: let it settle as a lost lease.
                () = lease::watch_lease(&task_clock, &task_lost, id) => execution.await,
            };
            (claim, transition)
        });
        self.held.insert(
            claim,
            HeldJob {
                lease,
                lost,
                clock,
                task: task.id(),
            },
        );
    }

    /// Records a finished task and forgets its claim. A task aborted by shutdown stays held, to
    /// be released. A task that died of a panic that escaped every guard is replaced by one that
    /// ends its job `failed` with `handler_panicked` under its fence.
    fn finish_task(&mut self, done: Result<(Uuid, Transition), JoinError>) {
        match done {
            Ok((claim, transition)) => {
                if let Some(job) = self.held.remove(claim) {
                    if transition == Transition::LeaseLost {
                        tracing::warn!(job_id = %job.lease.job_id, code = "lease_lost", "abandoned job: lease lost");
                    }
                }
                self.shared.stats.record(transition);
            }
            Err(died) if died.is_panic() => {
                let Some(lease) = self.held.of_task(died.id()) else {
                    return;
                };
                tracing::error!(job_id = %lease.job_id, code = "handler_panicked", "a job's task died");
                let shared = Arc::clone(&self.shared);
                let settle = self
                    .tasks
                    .spawn(async move { (lease.claim_id, settle_dead_task(&shared, lease).await) });
                self.held.reassign(lease.claim_id, settle.id());
            }
            Err(_) => {}
        }
    }
}

/// One step: claims what is due now (up to the slots), runs every claimed job to its transition
/// on a task of its own, and returns `(job id, transition)` for each, by job id.
pub(crate) async fn step(shared: &Arc<Shared>) -> Result<Vec<(Uuid, Transition)>, Error> {
    let jobs = claim(shared, shared.config.slots, ClaimReason::Step).await?;
    let mut tasks = JoinSet::new();
    for job in jobs {
        let shared = Arc::clone(shared);
        tasks.spawn(async move {
            let id = job.id();
            let transition = timed_execute(&shared, job, CancellationToken::new()).await;
            shared.stats.record(transition);
            (id, transition)
        });
    }
    let mut done: Vec<(Uuid, Transition)> = tasks.join_all().await;
    done.sort_by_key(|d| d.0);
    Ok(done)
}

/// Claims up to `free` due jobs for `reason`. A replica with no handlers claims nothing (it would
/// only fail every job it took with `unknown_kind`).
#[tracing::instrument(name = "claim", skip_all, fields(free, ?reason))]
pub(crate) async fn claim(
    shared: &Shared,
    free: usize,
    reason: ClaimReason,
) -> Result<Vec<ClaimedJob>, Error> {
    if shared.registry.is_empty() {
        return Ok(Vec::new());
    }
    let conn = db::checkout(&shared.claim_pool).await?;
    let claimant = Claimant {
        owner_id: shared.owner_id(),
        owner_locked: shared.owner_locked(),
        lease: shared.config.lease,
    };
    crash_point!("claim.before");
    let jobs = db::bounded(shared.statement_bound, conn.claim(claimant, free)).await?;
    crash_point!("claim.after_commit");
    shared.stats.record_claim(reason, jobs.len());
    for job in &jobs {
        shared.stats.pickup_latency.observe(job.due_for);
    }
    Ok(jobs)
}

/// How long until the next deferred job is due, asked after a short claim (once its jobs are
/// already running, so the question never delays them).
async fn next_due(shared: &Shared) -> Result<Option<Duration>, Error> {
    let conn = db::checkout(&shared.claim_pool).await?;
    shared.stats.record_round_trips(1);
    db::bounded(shared.statement_bound, conn.next_due()).await
}

/// Executes `job` inside a span with its safe fields, recording its duration.
async fn timed_execute(shared: &Shared, job: ClaimedJob, lost: CancellationToken) -> Transition {
    let started = Instant::now();
    let span = tracing::info_span!("execute", job_id = %job.id(), attempt = job.ctx.attempt);
    let transition =
        tracing::Instrument::instrument(executor::execute(shared, job, lost), span.clone()).await;
    shared
        .stats
        .execution
        .observe(started.elapsed().as_secs_f64());
    span.in_scope(|| tracing::debug!(?transition, "job settled"));
    transition
}

/// Ends the job of `lease` `failed` with `handler_panicked`, under its fence, after its task
/// died: what the executor would have written had the panic reached its guard.
async fn settle_dead_task(shared: &Shared, lease: Lease) -> Transition {
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

/// Whether a replica draining a backlog should claim now, with `running` of its `slots` busy:
/// once at least half its slots are free, so each claim (and the group commits that follow)
/// carries a batch worth its statement, instead of one claim per freed job.
fn refill_now(slots: usize, running: usize) -> bool {
    slots - running >= slots.div_ceil(2)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_draining_replica_refills_once_half_its_slots_are_free() {
        assert!(!super::refill_now(8, 5));
        assert!(super::refill_now(8, 4));
        assert!(super::refill_now(1, 0));
        assert!(!super::refill_now(1, 1));
        assert!(super::refill_now(3, 1));
        assert!(!super::refill_now(3, 2));
    }
}
