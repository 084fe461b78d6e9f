//! Presence: whether this replica waits for work, as the enqueue trigger and the notifiers see it
//! (`etl_waiting_replicas`, migration 0009). They NOTIFY only while some replica waits, so that
//! enqueues under a backlog commit without PostgreSQL's cluster-wide notify lock (which keeps
//! notifying commits from sharing a WAL flush).
//!
//! The state machine, one per replica, driven by the claim loop. Every change rides on a claim:
//! its statements are pipelined before the claim on the same connection, each in its own implicit
//! transaction, so a change costs no round trip of its own. The exception is a retry after a held
//! barrier: its try goes alone, and its claim follows only once the try succeeds (a claim sent
//! with a failing try finds nothing the enqueue holding the barrier added).
//!
//! ```text
//!  start (listening) ──────┐
//!                          ▼
//!   Busy ── short claim ─▶ Joining ── Register ──┬── try succeeded ───────────────▶ Waiting
//!    ▲     (claims again    ▲  (upsert the row,   │                                   │
//!    │      at once)        │   then try the      └── try failed ─▶ Unsettled ──────┤
//!    │                      │   enqueue barrier)       Settle (try again) after     │ a claim a poll
//!    │                      ├── statement failed       1, 2, 4 … ms until it works  │ interval after the
//!    │                      │   (or a reconnect)                                    │ last refresh:
//!    │                      └── its own token arrived: an enqueue took the row ◀────┤ Register (refresh)
//!    └──── Park (empty its lists): the claim after a full one, from any other state ┘
//! ```
//! A reconnected session sends a registered replica back to `Joining` (crash recovery empties the
//! unlogged table), and the answers of claims sent before the reconnect are then ignored; shutdown
//! deletes the row, unless another process took the owner id (the row is that process's now). So
//! does a take (migration 0024: an enqueue parked the row to wake this replica alone), and a claim
//! sent before the latest take settles nothing: the row it registered may be the one taken.
//!
//! A row is parked, not deleted, when its replica stops waiting but lives on (migration 0027): its
//! queues and kinds are set to empty lists, which match no job, permit or queue, so no reader
//! counts it as waiting, and the next registration updates the same row again. Updates that touch
//! no indexed column stay on the row's page (heap-only tuples) and are pruned by the next read of
//! a full page, so the table stays about one page: one after 10,000 wakes at 1,000 jobs/s. A
//! delete and an insert per wake left a dead line pointer each, reusable only after a vacuum: 13
//! to 42 pages after the same 10,000 wakes.
//!
//! Invariants this module keeps:
//! - A replica counts itself `Waiting` only after its registration wrote its row, the row
//!   committed and, after that, a try of the enqueue barrier (`pg_try_advisory_xact_lock`)
//!   succeeded, with a claim after the try: every enqueue that read the table before the row
//!   existed holds the barrier in share mode from before its read to its commit, so it had ended
//!   by then and that claim saw its jobs; every enqueue that reads after sees the row and
//!   notifies. Until the try succeeds (`Unsettled`) the row is there all the same, and the
//!   replica tries the barrier again at doubling intervals capped at its poll interval (its poll
//!   is the backstop for a long-running enqueue transaction), with the try alone and the claim
//!   only once it succeeds; it registers again instead once a poll interval has passed since it
//!   wrote the row, so the row never goes stale. A refresh needs a successful try too: while it
//!   holds the row, an enqueue skips it (`SKIP LOCKED`, 0024) and wakes nobody.
//! - Writing the row is not finding it: a registration skips a row another transaction holds,
//!   and that transaction may never notify the replica. Recovery deleting the row as stale is
//!   one; an enqueue whose take meets a row another enqueue parked since its snapshot is another
//!   (`FOR UPDATE` locks the newest version, re-checks it, drops it as parked, and keeps the lock
//!   to its commit). A registration that wrote nothing is retried (as a registration) like a held
//!   barrier.
//! - The try never waits: a waiting exclusive request would queue every new enqueue behind it.
//! - A claim's jobs are taken whatever its presence statements answered: a failed registration
//!   never loses claimed jobs.
//! - Only a replica that a NOTIFY can wake (a LISTEN session, not `--poll-only`) and that has
//!   handlers registers; any other would make enqueues notify for nothing.
//! - A registered replica upserts its row at least once per poll interval (each registration,
//!   each retry, and the first claim a poll interval after the last refresh), so recovery's
//!   stale-row delete ([`STALE_AFTER`], twice the longest poll interval) only ever finds the rows
//!   of replicas that are gone.
//! - A busy replica (its last claim came back full) parks its row: it claims again by itself as
//!   its jobs end, so enqueues need not wake it. Parking, like everything here, may fail: a row
//!   left waiting only makes enqueues notify as they did before 0009.
//! - No registration writes an empty list (a replica serves at least one queue and runs at least
//!   one kind): empty lists mean parked, and nothing else.

use crate::config::POLL_INTERVAL_MAX;
use crate::error::Error;
use crate::worker::stats::WorkerStats;
use std::time::Duration;
use tokio::time::Instant;

mod statements;

pub(crate) use statements::{leave, send, Change, Registered, Statements, FORGET_STALE_SQL};

/// How long a row may go unrefreshed before recovery deletes it as a dead replica's: twice the
/// longest poll interval, since a registered replica refreshes its row at least once per poll
/// interval.
pub(crate) const STALE_AFTER: Duration = POLL_INTERVAL_MAX.saturating_mul(2);

/// What a presence change sent before a claim answered: `None` when none was sent.
pub(crate) type Answer = Option<Result<Registered, Error>>;

/// The change a claim carries, and the session generation it was decided in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The change, if any.
    pub(crate) change: Option<Change>,
    /// How many reconnects the replica had seen when it sent the claim.
    generation: u64,
    /// How many takes of its row the replica had seen when it sent the claim.
    takes: u64,
}

/// Where the replica stands (see the module's state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not registered: its claims come back full, or nothing can wake it.
    Busy,
    /// Registers on its next claim.
    Joining,
    /// Registered; its try of the barrier has not succeeded yet.
    Unsettled,
    /// Registered and settled: enqueues notify it.
    Waiting,
}

/// One replica's presence.
#[derive(Debug)]
pub(crate) struct Presence {
    /// Where it stands.
    state: State,
    /// Whether it may register at all (see the module's invariants).
    listening: bool,
    /// The next pause before registering again after a held barrier or a failed statement.
    backoff: Duration,
    /// The longest pause, and the refresh interval: the replica's poll interval.
    poll_interval: Duration,
    /// When to claim again to retry a registration.
    retry_at: Option<Instant>,
    /// When a registration last wrote the row: a waiting replica refreshes it, and an unsettled
    /// one retries with the try alone, until a poll interval has passed since.
    written_at: Option<Instant>,
    /// Reconnects seen: answers of claims sent before the latest one are ignored.
    generation: u64,
    /// Takes of the row seen ([`Presence::taken`]): registrations sent before the latest one
    /// settle nothing.
    takes: u64,
}

/// The first pause before registering again.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);

impl Presence {
    /// The presence of a replica that may register when `listening` (it then registers on its
    /// first claim), polling every `poll_interval`.
    pub(crate) fn new(listening: bool, poll_interval: Duration) -> Presence {
        Presence {
            state: if listening {
                State::Joining
            } else {
                State::Busy
            },
            listening,
            backoff: FIRST_BACKOFF,
            poll_interval,
            retry_at: None,
            written_at: None,
            generation: 0,
            takes: 0,
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
            State::Joining => Some(Change::Register),
            // The row is written: try the barrier alone, unless the row is due a refresh.
            State::Unsettled if refresh_due => Some(Change::Register),
            State::Unsettled => Some(Change::Settle),
            State::Waiting => refresh_due.then_some(Change::Register),
        };
        Ticket {
            change,
            generation: self.generation,
            takes: self.takes,
        }
    }

    /// The session has seen `takes` takes of this replica's row in all (an enqueue parked it to
    /// wake this replica alone): after a new one, a registered replica registers again on its
    /// next claim (the wake's), retried from the first pause if the barrier is held, and what
    /// claims already in flight register settles nothing.
    pub(crate) fn taken(&mut self, takes: u64) {
        if takes <= self.takes {
            return;
        }
        self.takes = takes;
        if self.state != State::Busy {
            self.state = State::Joining;
            // A new registration: its retries start again from the first pause, since a held
            // barrier now most likely means a job that skipped the taken row is about to commit.
            self.backoff = FIRST_BACKOFF;
            self.retry_at = None;
        }
    }

    /// Takes what the claim of `ticket` answered (`None` when its change was not sent) after it
    /// came back `full` or short; returns whether to claim again at once (a short claim found
    /// the replica busy: it registers on the next one).
    pub(crate) fn after(
        &mut self,
        ticket: Ticket,
        answer: Option<&Result<Registered, Error>>,
        full: bool,
        now: Instant,
        stats: &WorkerStats,
    ) -> bool {
        if ticket.generation == self.generation {
            self.take(ticket.change, ticket.takes, answer, now, stats);
        }
        if self.listening && !full && self.state == State::Busy {
            self.state = State::Joining;
            return true;
        }
        false
    }

    /// Moves the state machine on what `change` answered.
    fn take(
        &mut self,
        change: Option<Change>,
        takes: u64,
        answer: Option<&Result<Registered, Error>>,
        now: Instant,
        stats: &WorkerStats,
    ) {
        if matches!(answer, Some(Err(_))) {
            stats.record_presence_failure();
        }
        match (change, answer) {
            (Some(Change::Park), _) => {
                self.state = State::Busy;
                stats.record_wait_left();
            }
            // Registered (or settled) before the row was last taken: the row may be the one
            // taken.
            (Some(Change::Register | Change::Settle), Some(Ok(_))) if takes < self.takes => {}
            (Some(Change::Register), Some(Ok(registered))) if !registered.written => {
                stats.record_registration_skipped();
                self.state = State::Joining;
                self.retry_later(now);
            }
            (Some(change @ (Change::Register | Change::Settle)), Some(Ok(registered))) => {
                if change == Change::Register {
                    self.written_at = Some(now);
                }
                if registered.free {
                    if self.state != State::Waiting {
                        stats.record_wait();
                    }
                    self.state = State::Waiting;
                    self.backoff = FIRST_BACKOFF;
                    self.retry_at = None;
                } else {
                    stats.record_barrier_held();
                    self.state = State::Unsettled;
                    self.retry_later(now);
                }
            }
            // Failed, or not sent: a registration or a try is tried again later; a waiting
            // replica's refresh rides on its next claim (its refresh is still due).
            (Some(Change::Register | Change::Settle), _) => {
                if self.state != State::Waiting {
                    self.retry_later(now);
                }
            }
            (None, _) => {}
        }
    }

    /// Schedules the next registration, and doubles the pause after it (up to the poll
    /// interval).
    fn retry_later(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff);
        self.backoff = self.backoff.saturating_mul(2).min(self.poll_interval);
    }

    /// When to claim again to retry a registration, if one is pending.
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
        }
    }

    /// Whether the replica may have a row (to leave at shutdown).
    pub(crate) fn registered(&self) -> bool {
        self.state != State::Busy
    }
}

#[cfg(test)]
mod tests;
