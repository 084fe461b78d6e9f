//! The producer: the replica's one claim loop. It claims due jobs when notified, polled, due or
//! freed, runs each claimed job on a task of its own as soon as a slot is free (the others wait in
//! the prefetch buffer, [`Prefetch`]), and at shutdown gives the running jobs their grace period.
//!
//! Invariants this module keeps:
//! - ONE claim loop per replica, with at most one claim in flight. Notifications, the poll, due
//!   deferred jobs, freed slots, session reconnects and the rescuer's catch-up signal all feed it;
//!   each wake causes at most one claim (a wake during a claim causes one more after it). A claim
//!   never asks for more than the room: the slots plus what the buffer claims ahead now (what the
//!   replica starts in half a second at its recent rate, at most the prefetch), less the jobs it
//!   holds (computing, committing or buffered). The claim runs while the jobs run: a freed slot
//!   never waits for it while a buffered job waits.
//! - After a claim that came back full (or a wake that found no room), the replica claims again
//!   as soon as half of `slots + ahead` is room, or [`REFILL_DELAY`] after a slot freed with
//!   nothing buffered (so claims and group commits stay batches, and no slot idles behind long
//!   jobs); after a short one it waits for the next signal, but only once every served queue came
//!   back short since the last wake: while one filled its ask or was not asked yet, the replica
//!   claims again at once for the room left, the short queues left out (without it, a replica
//!   serving many queues drained a busy one by one share per poll).
//! - A buffered job is held from its claim (renewed by heartbeats, released at shutdown) and
//!   waits at most [`HOLD`](crate::worker::claim::prefetch::HOLD): then it is released, attempt not
//!   charged.
//! - A claim that fails (a lost connection, a timeout) is tried again after
//!   [`CLAIM_RETRY_DELAY`], not only at the next notification or poll, and only after an
//!   adoption of what it may have claimed with its reply lost ([`adopt`]).
//! - A wake that names another replica, for a queue this one waits for and a kind it runs, is
//!   backed up: this replica claims `wake::BACKUP_DELAY` later unless it claims before then.
//! - A wake's claim sent sooner than `claim_cooldown` after the last claim waits out the rest,
//!   joined by every wake meanwhile (see `wake`); a backlog's claims never wait.
//! - The poll runs whatever happens to notifications, every `poll_interval` with ±10% jitter so
//!   replicas do not poll in lockstep; when a deferred job is due sooner, the loop wakes then.
//! - Every claimed job is held ([`HeldJobs`]) until its task ends. Each job task watches its own
//!   local lease clock and ends `LeaseLost` when it runs out. A task that dies of a panic no guard
//!   caught is replaced by a fenced `handler_panicked` write, so no claim stays held forever.
//! - The claim loop's statements (in [`dispatch`](crate::worker::claim::dispatch)) are bounded on the
//!   client.
//! - A completion of a job whose claim held a permit wakes nobody (migration 0023): the replica
//!   claims that queue again as soon as the job's task ends (trigger `freed`), or wakes the
//!   waiting replicas when it cannot answer for the permit ([`freed`](crate::worker::claim::freed),
//!   `drain`).

mod adopt;
mod claimed;
mod drain;
mod wake;

use crate::shutdown::{Shutdown, Stage};
use crate::worker::claim::claimer::Claim;
use crate::worker::claim::dispatch::{self, claim_with, next_due, settle_dead_task, timed_execute};
use crate::worker::claim::freed::{self, FreedPermits};
use crate::worker::claim::prefetch::{refill_now, Prefetch};
use crate::worker::claim::queues::{QueueShares, DRAIN_FAN_OUT};
use crate::worker::complete::completer::Transition;
use crate::worker::complete::give_back as release;
use crate::worker::lease::{self, ClaimedJob, LeaseClock};
use crate::worker::liveness::held::{HeldJob, HeldJobs};
use crate::worker::liveness::presence::{self, Presence};
use crate::worker::liveness::session::Signals;
use crate::worker::run::slots::Slots;
use crate::worker::shared::Shared;
use crate::worker::stats::ClaimReason;
use crate::worker::timing::{jittered, sleep_until_opt, wait};
use claimed::Claimed;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use wake::WakeState;

/// How long slots freed under a backlog wait for more to free before they are claimed anyway:
/// long enough to gather the next group commit's slots, short enough that a slot never idles
/// behind long-running jobs.
pub(crate) const REFILL_DELAY: Duration = Duration::from_millis(25);

/// How soon a failed claim is tried again.
pub(crate) const CLAIM_RETRY_DELAY: Duration = Duration::from_millis(100);

/// A job claimed ahead, waiting in the buffer for a slot, with what it is held under.
struct Waiting {
    /// The job.
    job: ClaimedJob,
    /// Cancels the job when its lease is lost (the heartbeat reaches it while it waits).
    lost: CancellationToken,
    /// Its local lease clock, running from its claim.
    clock: Arc<LeaseClock>,
}

/// A future the loop keeps across its iterations until it is back.
type Kept<T> = Option<Pin<Box<dyn Future<Output = T> + Send>>>;

/// The claim loop and the job tasks it runs.
pub(crate) struct Producer {
    /// What the replica's roles share.
    shared: Arc<Shared>,
    /// The jobs this replica holds.
    held: HeldJobs,
    /// One task per running job (computing or committing), ending with its claim and transition.
    tasks: JoinSet<(Uuid, Transition)>,
    /// The jobs in their compute phase.
    slots: Arc<Slots>,
    /// Jobs claimed ahead, waiting for a slot.
    buffer: Prefetch<Waiting>,
    /// The claim in flight, if any.
    claiming: Kept<Claimed>,
    /// A claim failed since the last adoption: its reply may have been lost with jobs it took.
    orphans: bool,
    /// The adoption in flight, if any ([`adopt`]).
    adopting: Kept<adopt::Adopted>,
    /// What the loop remembers between wakes.
    wake: WakeState,
    /// Whether the replica waits for work, as enqueues see it.
    presence: Presence,
    /// How each claim's room is shared among the served queues.
    shares: QueueShares,
    /// The permits this replica's completions freed since its last claim ([`freed`]).
    freed: FreedPermits,
}

/// Why the claim loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Shutdown asked it to drain.
    Draining,
    /// Another process took the owner id: stop at once.
    OwnerIdTaken,
    /// A claim met an undeclared transaction-mode pooler ([`dispatch::undeclared_pooler`]).
    TransactionPooler,
    /// The replica's cell moved to another Citus node: a claim met the node fence
    /// ([`dispatch::cell_moved`]), or the placement watch saw it (`liveness::placement`).
    CellMoved,
}

impl Producer {
    /// A producer for the replica `shared` whose running jobs are `held`.
    pub(crate) fn new(shared: Arc<Shared>, held: HeldJobs) -> Producer {
        // Only a replica that a NOTIFY can wake, and that would claim what it wakes for, waits.
        let listening =
            shared.signals.is_some() && !shared.config.poll_only && !shared.registry.is_empty();
        let poll_interval = shared.config.poll_interval;
        let queues = shared
            .queue_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        Producer {
            buffer: Prefetch::new(shared.config.prefetch),
            shares: QueueShares::new(&shared.config.queues),
            shared,
            held,
            tasks: JoinSet::new(),
            slots: Arc::new(Slots::default()),
            claiming: None,
            orphans: false,
            adopting: None,
            wake: WakeState::default(),
            presence: Presence::new(listening, queues, poll_interval),
            freed: FreedPermits::default(),
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
                let held = self.wake.held_until().is_some();
                match self.wake.gate(why, Instant::now(), config.claim_cooldown) {
                    Some(why) => self.send_claim(why),
                    None if !held => self.shared.stats.record_claim_held(),
                    None => {}
                }
            }
            let release_at = self.buffer.next_release_at();
            let slots = Arc::clone(&self.slots);
            tokio::select! {
                () = shutdown.reached(Stage::Draining) => return Stopped::Draining,
                () = wait(signals.as_deref().map(|s| &s.fatal)) => return Stopped::OwnerIdTaken,
                () = self.shared.moved.notified() => return Stopped::CellMoved,
                claimed = in_flight(&mut self.claiming) => {
                    self.claiming = None;
                    if dispatch::undeclared_pooler(&self.shared, claimed.jobs.as_ref().err()) {
                        return Stopped::TransactionPooler;
                    }
                    if dispatch::cell_moved(claimed.jobs.as_ref().err()) {
                        return Stopped::CellMoved;
                    }
                    let join = self.take_claimed(claimed).await;
                    reason = self.wake.again.take().or(join);
                }
                adopted = in_flight(&mut self.adopting) => reason = self.adopted(adopted),
                () = wait(signals.as_deref().map(|s| &s.notified)) => {
                    self.presence.heard(signals.as_deref());
                    self.wake.notified_since_claim = true;
                    reason = Some(ClaimReason::Notify);
                }
                () = wait(signals.as_deref().map(|s| &s.others_woken)) => {
                    self.back_up(signals.as_deref());
                }
                () = sleep_until_opt(self.wake.backup_at) => {
                    self.wake.backup_at = None;
                    self.shared.stats.record_backup_claim();
                    self.wake.notified_since_claim = true;
                    reason = Some(ClaimReason::Notify);
                }
                () = wait(signals.as_deref().map(|s| &s.reconnected)) => {
                    self.presence.reconnected();
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
                () = slots.freed() => reason = self.slots_freed(),
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    self.finish_task(done);
                    // A group commit ends its jobs' tasks together: take them all before
                    // deciding, so the next claim fills the room in one statement.
                    while let Some(done) = self.tasks.try_join_next() {
                        self.finish_task(done);
                    }
                    reason = self.slots_freed();
                }
                () = sleep_until_opt(self.wake.refill_at) => {
                    self.wake.refill_at = None;
                    reason = Some(ClaimReason::Drain);
                }
                () = sleep_until_opt(self.wake.held_until()) => reason = self.wake.release_held(),
                () = sleep_until_opt(release_at) => self.release_overdue().await,
                () = sleep_until_opt(self.presence.retry_at()) => {
                    // Cleared here, not by the claim: a claim that cannot be sent now (no room)
                    // must not leave a past deadline that fires again at once.
                    self.presence.retrying();
                    reason = Some(ClaimReason::Presence);
                }
            }
        }
    }

    /// Backs up the wakes that named other replicas on `signals`' session ([`WakeState::back_up`]).
    fn back_up(&mut self, signals: Option<&Signals>) {
        let queues = self.shared.queue_names();
        let others = signals.map(Signals::take_others).unwrap_or_default();
        let ours = others
            .iter()
            .any(|(q, k)| queues.contains(&q.as_str()) && self.shared.kinds.contains(&k.as_str()));
        self.wake
            .back_up(ours && self.presence.registered(), Instant::now());
    }

    /// After slots freed or tasks ended: starts buffered jobs in the free slots and, under a
    /// backlog, decides whether to claim now (half the room free), soon (a slot idles with nothing
    /// buffered), or later.
    fn slots_freed(&mut self) -> Option<ClaimReason> {
        self.start_waiting();
        if !self.freed.is_empty() {
            return Some(ClaimReason::Freed);
        }
        if !self.wake.backlog {
            return None;
        }
        if refill_now(self.capacity(), self.tasks.len() + self.buffer.len()) {
            return Some(ClaimReason::Drain);
        }
        let idle = self.slots.busy() < self.shared.config.slots;
        if idle && self.buffer.is_empty() && self.wake.refill_at.is_none() {
            self.wake.refill_at = Some(Instant::now() + REFILL_DELAY);
        }
        None
    }

    /// How many jobs the replica may hold now: its slots and what its buffer claims ahead.
    fn capacity(&self) -> usize {
        self.shared.config.slots + self.buffer.ahead(Instant::now())
    }

    /// Sends a claim for the room (see the module's invariants), unless one is in flight (this
    /// wake then claims once it is back) or there is no room.
    fn send_claim(&mut self, why: ClaimReason) {
        if self.claiming.is_some() || self.adopting.is_some() {
            self.wake.join_again(why);
            return;
        }
        if self.orphans {
            self.send_adoption(why);
            return;
        }
        self.wake.refill_at = None;
        let room = self
            .capacity()
            .saturating_sub(self.tasks.len() + self.buffer.len());
        if room == 0 {
            self.wake.backlog = true;
            self.wake_for_freed();
            return;
        }
        let freed = self.freed.take();
        self.presence
            .opened(freed.iter().map(|(queue, _)| queue.as_str()));
        let why = wake::reason_carrying(why, !freed.is_empty());
        let sent = Instant::now();
        let ticket = self.presence.ticket(self.wake.backlog, sent);
        // A claim with tries asks every queue (each it settles must be one it asked); without
        // news, only the queues left out for long are asked again (no wake reaches a busy one).
        let tries = Presence::tries(&ticket);
        let news = self.wake.news(why) || tries;
        self.shares.renew(news, sent);
        for (queue, _) in &freed {
            self.shares.reopen(queue);
        }
        let asks = dispatch::owned(if why == ClaimReason::Drain && !tries {
            self.shares.asks_of_at_most(room, DRAIN_FAN_OUT)
        } else {
            self.shares.asks(room)
        });
        let shared = Arc::clone(&self.shared);
        self.wake.last_sent = Some(sent);
        self.wake.claim_sent(presence::retry_alone(why, &ticket));
        self.presence.retrying();
        self.claiming = Some(Box::pin(async move {
            let alone = presence::retry_alone(why, &ticket);
            let change = ticket.change.as_ref();
            let (claim, answer) = claim_with(&shared, &asks, why, change, alone).await;
            let went = claim.is_some();
            let (jobs, left_free) = match claim.unwrap_or_else(|| Ok(Claim::default())) {
                Ok(claim) => (Ok(claim.jobs), claim.left_free),
                Err(e) => (Err(e), Vec::new()),
            };
            Claimed {
                why,
                asks,
                went,
                sent,
                jobs,
                ticket,
                answer,
                freed,
                left_free,
            }
        }));
    }

    /// Holds what a claim took and starts as much of it as slots allow; then, after a short
    /// claim, learns when the next deferred job is due (the jobs are already running by then).
    /// Returns a reason to claim again at once: a short claim while some queue has not come back
    /// short since the last wake (it filled its ask, or was not asked) is no sign of idleness, so
    /// it claims again for the room left (a drain: the short queues are left out); a short claim
    /// once every queue came back short found the replica busy, and it registers as waiting on
    /// the next one.
    async fn take_claimed(&mut self, claimed: Claimed) -> Option<ClaimReason> {
        let took = claimed.took();
        if claimed.went {
            self.shares.took(&claimed.asks, &took, Instant::now());
        }
        let answered = claimed.jobs.is_ok().then_some(&claimed.left_free[..]);
        if freed::unclaimed(&claimed.freed, &claimed.asks, &took, answered) {
            self.spawn_wake();
        }
        let full = claimed.full();
        let more = claimed.went && !full && self.shares.may_have_work();
        let join = self.presence.after(
            &claimed.ticket,
            claimed.answer.as_ref(),
            &claimed.asked_queues(),
            full || more,
            Instant::now(),
            &self.shared.stats,
        );
        let jobs = match claimed.jobs {
            Ok(jobs) => jobs,
            Err(e) => {
                // Claim again soon, not at the next wake (the notification will not come again),
                // after adopting what this one may have taken.
                tracing::warn!(code = %e.code(), "claim failed");
                self.orphans = true;
                let retry = Instant::now() + CLAIM_RETRY_DELAY;
                self.wake.next_due = Some(self.wake.next_due.map_or(retry, |due| due.min(retry)));
                return None;
            }
        };
        if claimed.why == ClaimReason::Poll && !jobs.is_empty() && !self.wake.notified_since_claim {
            self.shared.stats.record_poll_found_work();
        }
        self.wake.notified_since_claim = false;
        self.wake.backlog = full || more;
        for job in jobs {
            let queue = job
                .held_permit
                .then(|| claimed.asks[job.asked_of].0.clone());
            self.hold(job, claimed.sent, queue);
        }
        self.start_waiting();
        if !self.wake.backlog && self.wake.next_due_stale(claimed.why, Instant::now()) {
            self.wake.next_due_asked_at = Some(Instant::now());
            match next_due(&self.shared).await {
                Ok(due_in) => self.wake.next_due = due_in.map(|d| Instant::now() + d),
                Err(e) => tracing::warn!(code = %e.code(), "next-due query failed"),
            }
        }
        if more {
            return Some(ClaimReason::Drain);
        }
        join.then_some(ClaimReason::Presence)
    }

    /// Holds `job` (claimed at `sent`; of `permit_queue` if it holds a permit) until a slot frees.
    fn hold(&mut self, job: ClaimedJob, sent: Instant, permit_queue: Option<String>) {
        let (lease, queue) = (job.lease(), Arc::clone(&job.queue));
        let lost = job.ctx.lease_lost.token();
        let trusted = sent + lease::trusted_for(self.shared.config.lease);
        let clock = Arc::new(LeaseClock::new(trusted));
        self.held.insert(
            lease.claim_id,
            HeldJob {
                lease,
                lost: lost.clone(),
                clock: Arc::clone(&clock),
                task: None,
                queue,
                permit_queue,
            },
        );
        self.buffer
            .push(Waiting { job, lost, clock }, Instant::now());
    }

    /// Starts buffered jobs, oldest first, while slots are free.
    fn start_waiting(&mut self) {
        while self.slots.busy() < self.shared.config.slots {
            let Some(waiting) = self.buffer.pop(Instant::now()) else {
                return;
            };
            self.spawn_job(waiting);
        }
    }

    /// Starts a task for the buffered job `waiting`, held since its claim.
    fn spawn_job(&mut self, waiting: Waiting) {
        let Waiting { job, lost, clock } = waiting;
        let lease = job.lease();
        let (id, claim) = (lease.job_id, lease.claim_id);
        let shared = Arc::clone(&self.shared);
        let slot = self.slots.take();
        let task = self.tasks.spawn(async move {
            let beats = shared.signals.as_deref().map(|s| &s.beats);
            let execution = timed_execute(&shared, job, lost.clone(), slot);
            tokio::pin!(execution);
            let transition = tokio::select! {
                transition = &mut execution => transition,
                // A clock ran out and cancelled the job: let it settle as a lost lease.
                () = lease::watch_lease(&clock, beats, &lost, id) => execution.await,
            };
            (claim, transition)
        });
        self.held.run_by(claim, task.id());
    }

    /// Records a finished task and forgets its claim. A task aborted by shutdown stays held, to
    /// be released. A task that died of a panic that escaped every guard is replaced by one that
    /// ends its job `failed` with `handler_panicked` under its fence.
    fn finish_task(&mut self, done: Result<(Uuid, Transition), JoinError>) {
        match done {
            Ok((claim, transition)) => {
                let Some(job) = self.held.remove(claim) else {
                    self.shared.stats.record(transition);
                    return;
                };
                if matches!(transition, Transition::LeaseLost | Transition::GivenBack) {
                    release::give_back(&self.shared, job.lease, transition);
                }
                self.shared.stats.record_in(&job.queue, transition);
                if let Some(queue) = job.permit_queue.filter(|_| transition.frees_permits()) {
                    self.freed.record(&queue);
                }
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
                self.held.run_by(lease.claim_id, settle.id());
            }
            Err(_) => {}
        }
    }
}

/// The future in `slot` once it is back (cancel-safe: it stays there); pending while none is.
async fn in_flight<T>(slot: &mut Kept<T>) -> T {
    match slot {
        Some(claim) => claim.await,
        None => std::future::pending().await,
    }
}
