//! Presence: whether this replica waits for work, as the enqueue trigger and the notifiers see it
//! (`etl_waiting_replicas`, migration 0009). They NOTIFY only while some replica waits, so that
//! enqueues under a backlog commit without PostgreSQL's cluster-wide notify lock (which keeps
//! notifying commits from sharing a WAL flush).
//!
//! The state machine, one per replica, driven by the claim loop. Every change rides on a claim:
//! its statements are pipelined before the claim on the same connection, each in its own implicit
//! transaction, so a change costs no round trip of its own.
//!
//! ```text
//!  start (listening) ──────┐
//!                          ▼
//!   Busy ── short claim ─▶ Joining ── Register ──┬── try succeeded ───────────────▶ Waiting
//!    ▲     (claims again    ▲  (upsert the row,   │                                   │
//!    │      at once)        │   then try the      └── try failed ─▶ Unsettled ──────┤
//!    │                      │   enqueue barrier)       Settle: try again after      │ poll claims:
//!    │                      └── statement failed       1, 2, 4 … ms until it works  │ Register
//!    │                                                                              │ (a refresh)
//!    └──── Leave (delete the row): the claim after a full one, from any other state ┘
//! ```
//! A reconnected session sends a waiting replica back to `Joining` (crash recovery empties the
//! unlogged table), and shutdown leaves.
//!
//! Invariants this module keeps:
//! - A replica counts itself `Waiting` only after its row committed and, after that, a try of the
//!   enqueue barrier (`pg_try_advisory_xact_lock`) succeeded, with a claim after the try: every
//!   enqueue that read the table before the row existed holds the barrier in share mode from before
//!   its read to its commit, so it had ended by then and that claim saw its jobs; every enqueue
//!   that reads after sees the row and notifies. Until the try succeeds (`Unsettled`) the row is
//!   there all the same, and the replica tries again at doubling intervals capped at its poll
//!   interval (its poll is the backstop for a long-running enqueue transaction).
//! - The try never waits: a waiting exclusive request would queue every new enqueue behind it.
//! - A claim's jobs are taken whatever its presence statements answered: a failed registration
//!   never loses claimed jobs.
//! - Only a replica with a LISTEN session and handlers registers; a poll-only replica is woken by
//!   nothing, so it never makes an enqueue notify.
//! - A busy replica (its last claim came back full) leaves: it claims again by itself as its jobs
//!   end, so enqueues need not wake it. Leaving, like everything here, may fail: a row left
//!   behind only makes enqueues notify as they did before 0009, and recovery deletes rows nobody
//!   refreshed for [`STALE_AFTER`]; a row lost while its replica waits is restored at the
//!   replica's next poll, which is also what finds the jobs meanwhile.

use crate::config::POLL_INTERVAL_MAX;
use crate::error::Error;
use crate::worker::stats::WorkerStats;
use std::time::Duration;
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Records owner `$1` as waiting, or refreshes its row.
///
/// Locks: the row's lock, to the end of its own implicit transaction (no other session writes a
/// replica's row but recovery's stale-row delete). The table is UNLOGGED: no WAL.
pub(crate) const REGISTER_SQL: &str = "
INSERT INTO etl_waiting_replicas (owner_id) VALUES ($1)
    ON CONFLICT (owner_id) DO UPDATE SET refreshed_at = now()";

/// Tries the enqueue barrier ('detl', 1) in exclusive mode, and releases it at once (its implicit
/// transaction ends with the statement): true when no enqueue transaction holds it.
///
/// Locks: none held after the statement; the try never waits, so it never queues an enqueue.
pub(crate) const SETTLE_SQL: &str = "SELECT pg_try_advisory_xact_lock(1684370540, 1)";

/// Deletes owner `$1`'s row: it no longer waits.
///
/// Locks: the row's lock, to the end of its own implicit transaction.
pub(crate) const LEAVE_SQL: &str = "DELETE FROM etl_waiting_replicas WHERE owner_id = $1";

/// How long a row may go unrefreshed before recovery deletes it as a dead replica's: twice the
/// longest poll interval, since a waiting replica refreshes its row at every poll.
pub(crate) const STALE_AFTER: Duration = POLL_INTERVAL_MAX.saturating_mul(2);

/// Deletes the rows nobody refreshed for `$1` milliseconds ([`STALE_AFTER`]): replicas that died
/// while waiting.
///
/// Locks: the lock of each deleted row; a row its replica refreshes meanwhile is re-checked
/// against its new `refreshed_at` and kept.
pub(crate) const FORGET_STALE_SQL: &str = "
DELETE FROM etl_waiting_replicas WHERE refreshed_at < now() - $1 * interval '1 millisecond'";

/// What a presence change sent before a claim answered: `None` when none was sent, else whether
/// the barrier's try succeeded (true for a leave), or why it failed.
pub(crate) type Answer = Option<Result<bool, Error>>;

/// A presence change, sent before a claim on the claim's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Upsert the row, then try the barrier.
    Register,
    /// Try the barrier again.
    Settle,
    /// Delete the row.
    Leave,
}

/// Where the replica stands (see the module's state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not registered: its claims come back full, or it has no LISTEN session.
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
    /// Whether it may register at all (a LISTEN session and handlers).
    listening: bool,
    /// The next pause before trying the barrier again.
    backoff: Duration,
    /// The longest pause: the replica's poll interval.
    max_backoff: Duration,
    /// When to claim again to retry a change that failed or a barrier that was held.
    retry_at: Option<Instant>,
}

/// The first pause before trying a held barrier again.
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
            max_backoff: poll_interval,
            retry_at: None,
        }
    }

    /// The change to send with the next claim, `poll` when the backstop poll sends it, after a
    /// claim that came back full (`backlog`) or not.
    pub(crate) fn change(&self, poll: bool, backlog: bool) -> Option<Change> {
        match self.state {
            State::Busy => None,
            _ if backlog => Some(Change::Leave),
            State::Joining => Some(Change::Register),
            State::Unsettled => Some(Change::Settle),
            State::Waiting => poll.then_some(Change::Register),
        }
    }

    /// Takes what `change` answered (`None` when the claim's own statement failed first) after a
    /// claim that came back `full` or short; returns whether to claim again at once (a short claim
    /// found the replica busy: it registers on the next one).
    pub(crate) fn after(
        &mut self,
        change: Option<Change>,
        answer: Option<&Result<bool, Error>>,
        full: bool,
        now: Instant,
        stats: &WorkerStats,
    ) -> bool {
        match (change, answer) {
            (Some(Change::Leave), _) => {
                self.state = State::Busy;
                stats.record_wait_left();
            }
            (Some(Change::Register | Change::Settle), Some(Ok(true))) => {
                if self.state != State::Waiting {
                    stats.record_wait();
                }
                self.state = State::Waiting;
                self.backoff = FIRST_BACKOFF;
                self.retry_at = None;
            }
            (Some(Change::Register | Change::Settle), Some(Ok(false))) => {
                if self.state != State::Waiting {
                    stats.record_barrier_held();
                    self.state = State::Unsettled;
                    self.retry_later(now);
                }
            }
            (Some(Change::Register | Change::Settle), _) => {
                // Failed, or not sent: try again later; a waiting replica's failed refresh
                // waits for its next poll.
                if self.state != State::Waiting {
                    self.retry_later(now);
                }
            }
            (None, _) => {}
        }
        if self.listening && !full && self.state == State::Busy {
            self.state = State::Joining;
            return true;
        }
        false
    }

    /// Schedules the next try, and doubles the pause after it (up to the poll interval).
    fn retry_later(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff);
        self.backoff = self.backoff.saturating_mul(2).min(self.max_backoff);
    }

    /// When to claim again to retry a change, if one is pending; a claim sent for any other
    /// reason first takes its place.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The retry is being sent now.
    pub(crate) fn retrying(&mut self) {
        self.retry_at = None;
    }

    /// The LISTEN session reconnected: what it missed is claimed now, and the row may be gone
    /// (crash recovery empties the table), so a registered replica registers again.
    pub(crate) fn reconnected(&mut self) {
        if self.state != State::Busy {
            self.state = State::Joining;
        }
    }

    /// Whether the replica may have a row (to leave at shutdown).
    pub(crate) fn registered(&self) -> bool {
        self.state != State::Busy
    }
}

/// Sends `change` for `owner_id` on `client`, to be pipelined before a claim on the same client:
/// every statement is queued when this future is first polled, so poll it before the claim.
/// Answers whether the barrier's try succeeded (true for [`Change::Leave`]).
///
/// # Errors
/// The database error of a statement.
pub(crate) async fn send(
    client: &Client,
    change: Change,
    owner_id: &str,
) -> Result<bool, tokio_postgres::Error> {
    let owner: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1] = [(&owner_id, Type::TEXT)];
    match change {
        Change::Register => {
            let (registered, settled) = futures::join!(
                client.query_typed(REGISTER_SQL, &owner),
                client.query_typed(SETTLE_SQL, &[])
            );
            registered?;
            settled_of(settled?)
        }
        Change::Settle => settled_of(client.query_typed(SETTLE_SQL, &[]).await?),
        Change::Leave => {
            client.query_typed(LEAVE_SQL, &owner).await?;
            Ok(true)
        }
    }
}

/// The answer of [`SETTLE_SQL`]'s rows.
fn settled_of(rows: Vec<tokio_postgres::Row>) -> Result<bool, tokio_postgres::Error> {
    rows.first().map_or(Ok(false), |row| row.try_get(0))
}

#[cfg(test)]
mod tests {
    use super::{Change, Presence, State};
    use crate::error::Error;
    use crate::worker::stats::WorkerStats;
    use std::time::Duration;
    use tokio::time::Instant;

    /// A listening replica polling every second.
    fn presence() -> Presence {
        Presence::new(true, Duration::from_secs(1))
    }

    /// A failed presence statement.
    fn failed() -> Result<bool, Error> {
        Err(Error::Unavailable(None))
    }

    /// Feeds `p` what `change` answered after a short claim at `now`; returns whether it claims
    /// again at once.
    fn answered(
        p: &mut Presence,
        change: Change,
        answer: Result<bool, Error>,
        now: Instant,
    ) -> bool {
        p.after(
            Some(change),
            Some(&answer),
            false,
            now,
            &WorkerStats::default(),
        )
    }

    #[test]
    fn a_listening_replica_registers_on_its_first_claim_and_waits_once_settled() {
        let (mut p, stats) = (presence(), WorkerStats::default());
        assert!(p.registered());
        assert_eq!(p.change(false, false), Some(Change::Register));
        let settled = Ok(true);
        assert!(!p.after(
            Some(Change::Register),
            Some(&settled),
            false,
            Instant::now(),
            &stats
        ));
        assert_eq!((p.state, stats.snapshot().waits), (State::Waiting, 1));
        // Waiting: claims carry nothing, polls refresh the row.
        assert_eq!(p.change(false, false), None);
        assert_eq!(p.change(true, false), Some(Change::Register));
    }

    #[test]
    fn a_held_barrier_is_tried_again_at_doubling_intervals_up_to_the_poll() {
        let (mut p, stats) = (
            Presence::new(true, Duration::from_millis(5)),
            WorkerStats::default(),
        );
        let now = Instant::now();
        p.after(Some(Change::Register), Some(&Ok(false)), false, now, &stats);
        assert_eq!(p.state, State::Unsettled);
        assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
        assert_eq!(p.change(false, false), Some(Change::Settle));
        p.retrying();
        assert_eq!(p.retry_at(), None);
        for pause in [2, 4, 5, 5] {
            p.after(Some(Change::Settle), Some(&Ok(false)), false, now, &stats);
            assert_eq!(p.retry_at(), Some(now + Duration::from_millis(pause)));
        }
        p.after(Some(Change::Settle), Some(&Ok(true)), false, now, &stats);
        assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
        assert_eq!(p.backoff, super::FIRST_BACKOFF);
        let counted = stats.snapshot();
        assert_eq!((counted.barrier_held, counted.waits), (5, 1));
    }

    #[test]
    fn a_failed_registration_is_retried_and_a_failed_refresh_waits_for_the_poll() {
        let (mut p, now) = (presence(), Instant::now());
        answered(&mut p, Change::Register, failed(), now);
        assert_eq!(p.state, State::Joining);
        assert!(p.retry_at().is_some());
        // Not sent (the claim failed first): the same.
        p.after(
            Some(Change::Register),
            None,
            false,
            now,
            &WorkerStats::default(),
        );
        assert_eq!(p.change(false, false), Some(Change::Register));
        answered(&mut p, Change::Register, Ok(true), now);
        answered(&mut p, Change::Register, failed(), now);
        assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
        // A refresh that finds the barrier held changes nothing: the row was there all along.
        answered(&mut p, Change::Register, Ok(false), now);
        assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
    }

    #[test]
    fn a_full_claim_makes_a_registered_replica_leave_on_its_next_claim() {
        let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
        answered(&mut p, Change::Register, Ok(true), now);
        assert_eq!(p.change(false, true), Some(Change::Leave));
        // Leaving ends in Busy, even when the delete failed (a row left behind is harmless).
        assert!(!p.after(Some(Change::Leave), Some(&failed()), true, now, &stats));
        assert_eq!((p.state, stats.snapshot().waits_left), (State::Busy, 1));
        assert!(!p.registered());
        // Busy: full claims carry nothing; a short claim makes it join, on a claim sent at once.
        assert_eq!(p.change(false, true), None);
        assert!(!p.after(None, None, true, now, &stats));
        assert!(p.after(None, None, false, now, &stats));
        assert_eq!(p.state, State::Joining);
        assert!(answered(&mut p, Change::Leave, Ok(true), now));
    }

    #[test]
    fn a_replica_that_cannot_be_woken_never_registers() {
        let mut p = Presence::new(false, Duration::from_secs(1));
        assert!(!p.registered());
        assert!(!p.after(None, None, false, Instant::now(), &WorkerStats::default()));
        assert_eq!(p.change(true, false), None);
        p.reconnected();
        assert_eq!(p.state, State::Busy);
    }

    #[test]
    fn a_reconnect_makes_a_registered_replica_register_again() {
        let mut p = presence();
        answered(&mut p, Change::Register, Ok(true), Instant::now());
        p.reconnected();
        assert_eq!(p.change(false, false), Some(Change::Register));
    }
}
