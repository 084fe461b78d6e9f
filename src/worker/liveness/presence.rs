//! Presence: whether this replica waits for work, as the wakes see it (`etl_waiting_replicas`,
//! migrations 0009 and 0028), and which queues it still has to settle.
//!
//! An enqueue (or a release, or recovery) wakes through `durable_etl_wake` in its own
//! transaction: it reads the waiting rows without locks and notifies some of the replicas that
//! wait for the work's queue and kind; when none waits, or the queue may not be claimed (paused,
//! or no free permit), it notifies nobody and holds the queue's enqueue barrier in share mode to
//! its commit. So a replica that starts waiting, or learns that a queue it serves became
//! claimable, must claim once more after every such enqueue ended: it *settles* the queue, by a
//! try of the barrier in exclusive mode (never a wait) followed by a claim.
//!
//! The state machine, one per replica, driven by the claim loop. Every change rides on a claim:
//! its statements are pipelined before the claim on the same connection, each in its own
//! implicit transaction, so a change costs no round trip of its own. The exception is a retry of
//! a held barrier: its try goes alone, and its claim follows only once some queue settled.
//!
//! ```text
//!  start (listening) ─────┐
//!                         ▼
//!   Busy ── short claim ─▶ Joining ── Register: upsert the row, try every ─▶ Waiting
//!    ▲     (claims again     ▲        served queue's barrier, then claim      │ unsettled: the queues
//!    │      at once)         │                                                │ whose try failed, tried
//!    │                       └── statement failed, or the session reconnected │ again after 1, 2, 4 …
//!    │                                                                        │ ms (at most 32), and the
//!    │                                                                        │ queues a `q` wake or a
//!    │                                                                        │ freed permit opened
//!    └──── Park (empty its lists): the claim after a full one, from any state ┘
//! ```
//!
//! Invariants this module keeps:
//! - No enqueue, and no other replica, ever locks this replica's row: only the replica writes it
//!   (recovery deletes it once stale), so no statement here waits for a caller's transaction.
//! - A replica counts a queue settled only after a try of that queue's barrier succeeded after
//!   its row committed (or after the event that opened the queue), with a claim after the try
//!   that asked that queue (a claim that failed, or gave the queue no share of its room, leaves
//!   it owed):
//!   every enqueue of the queue that notified nobody held the barrier from before its read of the
//!   waiting table to its commit, so it had ended and that claim saw its jobs; every enqueue that
//!   read after the row committed saw it and notified. Until then the queue stays unsettled and
//!   its try is sent again at doubling intervals from [`FIRST_BACKOFF`] to [`SETTLE_BACKOFF_MAX`]
//!   (the try alone while the pauses are shorter than that; then the try and a claim, every
//!   time): a job committed by an enqueue that was open while the replica began to wait is
//!   claimed at most about twice that long after its commit, even while another enqueue that
//!   notified nobody keeps the barrier held.
//! - The try never waits: a waiting exclusive request would queue every new enqueue behind it.
//! - A claim's jobs are taken whatever its presence statements answered: a failed registration
//!   never loses claimed jobs.
//! - Only a replica that a NOTIFY can wake (a LISTEN session, not `--poll-only`) and that has
//!   handlers registers; any other would be named by wakes it never hears.
//! - A registered replica upserts its row at least once per poll interval, so recovery's
//!   stale-row delete ([`STALE_AFTER`]) only ever finds the rows of replicas that are gone.
//! - A busy replica (its last claim came back full) parks its row: it claims again by itself as
//!   its jobs end, so enqueues need not wake it, and it has nothing to settle. A row left waiting
//!   by a failed park only draws wakes that the other waiting replicas back up.
//! - No registration writes an empty list (a replica serves at least one queue and runs at least
//!   one kind): empty lists mean parked, and nothing else.

use crate::config::POLL_INTERVAL_MAX;
use crate::error::Error;
use crate::worker::liveness::session::Signals;
use crate::worker::stats::{ClaimReason, WorkerStats};
use std::time::Duration;
use tokio::time::Instant;

mod statements;

pub(crate) use statements::{leave, send, Change, Statements, FORGET_STALE_SQL};

/// How long a row may go unrefreshed before recovery deletes it as a dead replica's: twice the
/// longest poll interval, since a registered replica refreshes its row at least once per poll
/// interval.
pub(crate) const STALE_AFTER: Duration = POLL_INTERVAL_MAX.saturating_mul(2);

/// The first pause before a held barrier is tried again.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);

/// The longest pause between two tries of a held barrier: the most a job enqueued by a
/// transaction that was open while this replica began to wait can wait past its commit.
pub(crate) const SETTLE_BACKOFF_MAX: Duration = Duration::from_millis(32);

/// What a presence change sent before a claim answered: `None` when none was sent; else the
/// queues whose barrier is still held, or the statement's error.
pub(crate) type Answer = Option<Result<Vec<String>, Error>>;

/// Whether a claim for `why` carrying `ticket` is an early retry of held barriers, whose tries
/// go alone, the claim following only if one succeeds (`dispatch::claim_with`): a retry while
/// the pauses are still shorter than [`SETTLE_BACKOFF_MAX`]. Once a barrier has stayed held that
/// long, every retry claims too, so a job that another enqueue committed meanwhile (one that
/// also notified nobody, and no longer holds the barrier) is claimed within that pause, not
/// only once the barrier's last holder ends.
pub(crate) fn retry_alone(why: ClaimReason, ticket: &Ticket) -> bool {
    why == ClaimReason::Presence && ticket.early_retry
}

/// The change a claim carries, and the session generation it was decided in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The change, if any.
    pub(crate) change: Option<Change>,
    /// How many reconnects the replica had seen when it sent the claim.
    generation: u64,
    /// How many events had opened a queue when it sent the claim: its tries settle no queue
    /// opened again after them.
    openings: u64,
    /// Its change is a try of held barriers whose pauses are still shorter than
    /// [`SETTLE_BACKOFF_MAX`] ([`retry_alone`]).
    early_retry: bool,
}

/// Where the replica stands (see the module's state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not registered: its claims come back full, or nothing can wake it.
    Busy,
    /// Registers on its next claim.
    Joining,
    /// Registered: wakes name it, or reach it as a backup.
    Waiting,
}

/// One replica's presence.
#[derive(Debug)]
pub(crate) struct Presence {
    /// Where it stands.
    state: State,
    /// Whether it may register at all (see the module's invariants).
    listening: bool,
    /// The queues it serves: a registration settles them all.
    queues: Vec<String>,
    /// The queues whose barrier it still has to try (a registered replica only), each with the
    /// number of the latest event that opened it: a try sent before that event settles nothing.
    unsettled: Vec<(String, u64)>,
    /// How many events opened a queue so far ([`Presence::opened`], a registration).
    openings: u64,
    /// The next pause before trying a held barrier again.
    backoff: Duration,
    /// The refresh interval: the replica's poll interval.
    poll_interval: Duration,
    /// When to claim again to retry a try or a registration.
    retry_at: Option<Instant>,
    /// When a registration last wrote the row: a waiting replica refreshes it a poll interval
    /// later.
    written_at: Option<Instant>,
    /// Reconnects seen: answers of claims sent before the latest one are ignored.
    generation: u64,
}

impl Presence {
    /// The presence of a replica serving `queues` that may register when `listening` (it then
    /// registers on its first claim), polling every `poll_interval`.
    pub(crate) fn new(listening: bool, queues: Vec<String>, poll_interval: Duration) -> Presence {
        Presence {
            state: if listening {
                State::Joining
            } else {
                State::Busy
            },
            listening,
            queues,
            unsettled: Vec::new(),
            openings: 0,
            backoff: FIRST_BACKOFF,
            poll_interval,
            retry_at: None,
            written_at: None,
            generation: 0,
        }
    }

    /// The change the next claim carries, sent at `now` after a claim that came back full
    /// (`backlog`) or not.
    pub(crate) fn ticket(&self, backlog: bool, now: Instant) -> Ticket {
        let refresh_due = self
            .written_at
            .is_none_or(|at| now >= at + self.poll_interval);
        let change = match self.state {
            State::Busy => None,
            _ if backlog => Some(Change::Park),
            State::Joining => Some(Change::Register(self.queues.clone())),
            State::Waiting if refresh_due => Some(Change::Register(self.queues.clone())),
            State::Waiting if !self.unsettled.is_empty() => Some(Change::Settle(
                self.unsettled.iter().map(|(q, _)| q.clone()).collect(),
            )),
            State::Waiting => None,
        };
        Ticket {
            early_retry: matches!(change, Some(Change::Settle(_)))
                && self.backoff < SETTLE_BACKOFF_MAX,
            change,
            generation: self.generation,
            openings: self.openings,
        }
    }

    /// `queues` may have become claimable (a `q` wake named them, or this replica freed their
    /// permits): a registered replica (waiting, or registering) settles those it serves on its
    /// next claim, whatever tries of them are in flight (they were sent before this event). A
    /// busy one has nothing to settle: it claims again as its jobs end, and settles every queue
    /// when it registers.
    pub(crate) fn opened<'a>(&mut self, queues: impl IntoIterator<Item = &'a str>) {
        if self.state == State::Busy {
            return;
        }
        self.openings += 1;
        for queue in queues {
            if !self.queues.iter().any(|q| q == queue) {
                continue;
            }
            match self.unsettled.iter_mut().find(|(q, _)| q == queue) {
                Some(owed) => owed.1 = self.openings,
                None => self.unsettled.push((queue.to_owned(), self.openings)),
            }
        }
    }

    /// A wake for this replica arrived on the session of `signals`: the queues `q` wakes named
    /// are settled ([`Presence::opened`]), and a bare token of its own (the take of a schema
    /// before 0028) means its row is gone, so it registers again.
    pub(crate) fn heard(&mut self, signals: Option<&Signals>) {
        let Some(signals) = signals else {
            return;
        };
        self.opened(signals.take_opened().iter().map(String::as_str));
        if signals.take_row_taken() {
            self.reconnected();
        }
    }

    /// Takes what the claim of `ticket` answered (`None` when its change was not sent) after it
    /// came back `full` or short, having asked `asked` (no queue when it failed or was not
    /// sent); returns whether to claim again at once (a short claim found the replica busy: it
    /// registers on the next one).
    pub(crate) fn after(
        &mut self,
        ticket: &Ticket,
        answer: Option<&Result<Vec<String>, Error>>,
        asked: &[String],
        full: bool,
        now: Instant,
        stats: &WorkerStats,
    ) -> bool {
        if ticket.generation == self.generation {
            self.take(ticket, answer, asked, now, stats);
        }
        if self.listening && !full && self.state == State::Busy {
            self.state = State::Joining;
            return true;
        }
        false
    }

    /// Moves the state machine on what `change` answered, its claim having asked `asked`.
    fn take(
        &mut self,
        ticket: &Ticket,
        answer: Option<&Result<Vec<String>, Error>>,
        asked: &[String],
        now: Instant,
        stats: &WorkerStats,
    ) {
        if matches!(answer, Some(Err(_))) {
            stats.record_presence_failure();
        }
        match (ticket.change.as_ref(), answer) {
            (Some(Change::Park), _) => {
                if self.state == State::Waiting {
                    stats.record_wait_left();
                }
                self.state = State::Busy;
                self.unsettled.clear();
                self.retry_at = None;
            }
            (Some(Change::Register(sent)), Some(Ok(held))) => {
                if self.state != State::Waiting {
                    stats.record_wait();
                }
                self.state = State::Waiting;
                self.written_at = Some(now);
                self.settled(sent, held, asked, ticket.openings, now, stats);
            }
            (Some(Change::Settle(sent)), Some(Ok(held))) => {
                self.settled(sent, held, asked, ticket.openings, now, stats);
            }
            // Failed, or not sent: a registration is sent again later; a try stays owed.
            (Some(Change::Register(_)), _) => {
                if self.state != State::Waiting {
                    self.state = State::Joining;
                }
                self.retry_later(now);
            }
            (Some(Change::Settle(_)), _) => self.retry_later(now),
            (None, _) => {}
        }
    }

    /// The tries of `sent`, sent when `openings` events had opened a queue, came back with
    /// `held` still held, and the claim sent after them asked `asked`: the others that it asked
    /// are settled (it saw their enqueues) unless an event opened them again since; the held
    /// ones, and those it did not ask (it failed, or shared its room among other queues), are
    /// tried again later, each time with a claim.
    fn settled(
        &mut self,
        sent: &[String],
        held: &[String],
        asked: &[String],
        openings: u64,
        now: Instant,
        stats: &WorkerStats,
    ) {
        let owed: Vec<&String> = sent
            .iter()
            .filter(|q| held.contains(q) || !asked.contains(q))
            .collect();
        self.unsettled
            .retain(|(q, opened)| !sent.contains(q) || owed.contains(&q) || *opened > openings);
        for queue in &owed {
            if !self.unsettled.iter().any(|(q, _)| q == *queue) {
                self.unsettled.push(((*queue).clone(), openings));
            }
        }
        if !held.is_empty() {
            stats.record_barrier_held();
        }
        if owed.is_empty() {
            self.backoff = FIRST_BACKOFF;
            if self.unsettled.is_empty() {
                self.retry_at = None;
            }
        } else {
            self.retry_later(now);
        }
    }

    /// Whether the claim carrying `ticket` tries barriers: it then asks every queue, so that
    /// each queue its tries settle is one it asked.
    pub(crate) fn tries(ticket: &Ticket) -> bool {
        matches!(ticket.change, Some(Change::Register(_) | Change::Settle(_)))
    }

    /// Schedules the next try, and doubles the pause after it (up to [`SETTLE_BACKOFF_MAX`]).
    fn retry_later(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff);
        self.backoff = self.backoff.saturating_mul(2).min(SETTLE_BACKOFF_MAX);
    }

    /// When to claim again to retry a try or a registration, if one is pending.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The retry's time has come, or a claim sent for another reason takes its place.
    pub(crate) fn retrying(&mut self) {
        self.retry_at = None;
    }

    /// The LISTEN session reconnected: what it missed is claimed now, and the row may be gone
    /// (crash recovery empties the table), so a registered replica registers again; what claims
    /// already in flight answer is ignored.
    pub(crate) fn reconnected(&mut self) {
        self.generation += 1;
        if self.state != State::Busy {
            self.state = State::Joining;
            self.unsettled.clear();
        }
    }

    /// Whether the replica may have a row (to leave at shutdown).
    pub(crate) fn registered(&self) -> bool {
        self.state != State::Busy
    }
}

#[cfg(test)]
mod tests;
