//! What the claim loop remembers between wakes, when a short claim asks when the next deferred
//! job is due, and which claims wait out the claim cooldown
//! ([`crate::config::WorkerConfig::claim_cooldown`]).
//!
//! Invariants this module keeps:
//! - A short claim that the clock or a reconnect caused always asks; any other asks at most once
//!   per [`NEXT_DUE_REFRESH`]: a deferred job enqueued meanwhile (deferred enqueues announce
//!   nothing) is found at most that much later, or by the poll.
//! - Only a wake's claim (a notification, the poll, a due job, a catch-up, a registration as
//!   waiting) waits out the cooldown, counted from when the last claim was sent; a claim under a
//!   backlog (room or permits freed) or at start-up never waits. A wake that waits is never
//!   lost: it is held, every wake meanwhile joins it, and one claim goes at the cooldown's end.

use crate::worker::stats::ClaimReason;
use std::time::Duration;
use tokio::time::Instant;

/// How long the answer to "when is the next deferred job due" is trusted after a short claim
/// that a notification, freed slots or permits caused: a deferred job enqueued meanwhile is
/// found at most this much later by the next short claim, or by the poll.
pub(super) const NEXT_DUE_REFRESH: Duration = Duration::from_millis(50);

/// How long a waiting replica that heard a wake naming another replica, for a queue it serves
/// and a kind it runs, waits before it claims itself (unless it claims before then): so a wake
/// named for a replica that died, stopped or filled up since it was named still reaches one that
/// can act, while the named one, when it can, is the only one to claim at once.
pub(crate) const BACKUP_DELAY: Duration = Duration::from_millis(50);

/// What the claim loop remembers between wakes.
#[derive(Debug, Default)]
pub(super) struct WakeState {
    /// The last claim came back full (or a wake found no free slot): claim when a slot frees.
    pub(super) backlog: bool,
    /// A notification arrived since the last claim.
    pub(super) notified_since_claim: bool,
    /// When the next known deferred job is due.
    pub(super) next_due: Option<Instant>,
    /// When slots freed under a backlog are claimed even if fewer than half are free.
    pub(super) refill_at: Option<Instant>,
    /// The wake that arrived while a claim was in flight ([`WakeState::join_again`]): it claims
    /// once that one is back.
    pub(super) again: Option<ClaimReason>,
    /// Some wake joined into `again` brought news ([`brings_news`]): the claim it causes asks
    /// every queue again, whatever its reason.
    again_news: bool,
    /// When the replica last asked when the next deferred job is due.
    pub(super) next_due_asked_at: Option<Instant>,
    /// When the last claim was sent.
    pub(super) last_sent: Option<Instant>,
    /// The wake held until the cooldown after the last claim is over, and when that is.
    pub(super) held: Option<(ClaimReason, Instant)>,
    /// When this replica claims to back up a wake that named another replica (cleared by any
    /// claim it sends before then).
    pub(super) backup_at: Option<Instant>,
}

impl WakeState {
    /// A claim is being sent: it answers for every wake this replica was backing up, unless it
    /// is a retry of held barriers sent alone (`retry_alone`), which claims nothing while they
    /// stay held and so leaves the backup armed.
    pub(super) fn claim_sent(&mut self, retry_alone: bool) {
        if !retry_alone {
            self.backup_at = None;
        }
    }

    /// A wake for `why` arrived while a claim was in flight: one claim follows once that one is
    /// back, for the first such wake, unless that was a retry of held barriers (which may go
    /// alone and claim nothing: any other wake replaces it); and if any of them brought news,
    /// that claim asks every queue ([`WakeState::news`]).
    pub(super) fn join_again(&mut self, why: ClaimReason) {
        self.again = match self.again {
            Some(first) if first != ClaimReason::Presence => Some(first),
            _ => Some(why),
        };
        self.again_news |= brings_news(why);
    }

    /// Whether a claim for `why`, being sent, asks every queue again: its own reason brings news,
    /// or a wake joined into it did (forgotten here).
    pub(super) fn news(&mut self, why: ClaimReason) -> bool {
        std::mem::take(&mut self.again_news) || brings_news(why)
    }

    /// A wake named another replica at `now`: when `ours` (this replica waits for its queue and
    /// kind), claim [`BACKUP_DELAY`] later, unless a backup is armed already (the earlier one
    /// answers for both) or a claim is sent before then (see `backup_at`).
    pub(super) fn back_up(&mut self, ours: bool, now: Instant) {
        if ours && self.backup_at.is_none() {
            self.backup_at = Some(now + BACKUP_DELAY);
        }
    }

    /// Whether a short claim for `why`, back at `now`, asks when the next deferred job is due:
    /// always after a claim the clock or a reconnect caused (start-up, poll, a due job, a
    /// catch-up), else at most once per [`NEXT_DUE_REFRESH`], so that a steady stream of
    /// single-job wakes does not pay a round trip per job for a question whose answer only a
    /// deferred enqueue (which announces nothing) can change.
    pub(super) fn next_due_stale(&self, why: ClaimReason, now: Instant) -> bool {
        let clocked = matches!(
            why,
            ClaimReason::Startup | ClaimReason::Poll | ClaimReason::Due | ClaimReason::CatchUp
        );
        clocked
            || self
                .next_due_asked_at
                .is_none_or(|at| now >= at + NEXT_DUE_REFRESH)
    }

    /// Sends a claim for `why` now (`Some`), or holds it until the `cooldown` after the last
    /// claim sent is over (`None`), joined with the wake held already, if any (see the module's
    /// invariants). A wake sent now takes the held one with it (one claim answers both).
    pub(super) fn gate(
        &mut self,
        why: ClaimReason,
        now: Instant,
        cooldown: Duration,
    ) -> Option<ClaimReason> {
        let waits = matches!(
            why,
            ClaimReason::Notify
                | ClaimReason::Presence
                | ClaimReason::Poll
                | ClaimReason::Due
                | ClaimReason::CatchUp
        );
        let until = self.last_sent.map(|at| at + cooldown);
        let joined = match self.held {
            Some((held, _)) if waits && rank(held) >= rank(why) => held,
            _ => why,
        };
        match until {
            Some(until) if waits && now < until => {
                self.held = Some((joined, until));
                None
            }
            _ if waits => {
                self.held = None;
                Some(joined)
            }
            _ => Some(why),
        }
    }

    /// When the held wake's cooldown is over, if a wake is held.
    pub(super) fn held_until(&self) -> Option<Instant> {
        self.held.map(|(_, until)| until)
    }

    /// The held wake, its cooldown over (it goes through [`WakeState::gate`] again: a claim sent
    /// meanwhile started a new cooldown).
    pub(super) fn release_held(&mut self) -> Option<ClaimReason> {
        self.held.take().map(|(why, _)| why)
    }
}

/// Whether a claim for `why` may find work in any queue: every reason but slots freed under a
/// backlog (`Drain`) and permits this replica freed (`Freed`), which bring no news of other
/// queues.
fn brings_news(why: ClaimReason) -> bool {
    why != ClaimReason::Drain && why != ClaimReason::Freed
}

/// Which of two held wakes a claim is sent for: a registration's (it claims only once its try
/// succeeds) gives way to a notification's, and both to the clock's or a reconnect's (they also
/// refresh what the replica caches: the capped queues, the next due time).
fn rank(why: ClaimReason) -> u8 {
    match why {
        ClaimReason::Presence => 0,
        ClaimReason::Notify => 1,
        _ => 2,
    }
}

/// The reason a claim for `why` is sent with, when it carries permits this replica freed
/// (`carries_freed`): a presence retry is sent only once its try of the barrier succeeds
/// (`dispatch::claim_with`), so one that carries freed permits is a claim for them, sent whatever
/// the try answers.
pub(super) fn reason_carrying(why: ClaimReason, carries_freed: bool) -> ClaimReason {
    if why == ClaimReason::Presence && carries_freed {
        ClaimReason::Freed
    } else {
        why
    }
}

#[cfg(test)]
mod tests {
    use super::{reason_carrying, WakeState, NEXT_DUE_REFRESH};
    use crate::worker::stats::ClaimReason;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn a_short_claim_asks_the_next_due_time_at_most_once_per_refresh_unless_the_clock_caused_it() {
        let (mut wake, now) = (WakeState::default(), Instant::now());
        assert!(wake.next_due_stale(ClaimReason::Notify, now), "never asked");
        wake.next_due_asked_at = Some(now);
        let soon = now + NEXT_DUE_REFRESH - Duration::from_millis(1);
        for why in [
            ClaimReason::Notify,
            ClaimReason::Freed,
            ClaimReason::Presence,
        ] {
            assert!(!wake.next_due_stale(why, soon), "{why:?}");
        }
        for why in [
            ClaimReason::Startup,
            ClaimReason::Poll,
            ClaimReason::Due,
            ClaimReason::CatchUp,
        ] {
            assert!(wake.next_due_stale(why, soon), "{why:?}");
        }
        assert!(wake.next_due_stale(ClaimReason::Notify, now + NEXT_DUE_REFRESH));
    }

    #[test]
    fn a_wake_during_a_claim_is_never_lost_behind_a_barrier_retry_and_keeps_its_news() {
        let mut wake = WakeState::default();
        wake.join_again(ClaimReason::Presence);
        wake.join_again(ClaimReason::Notify);
        assert_eq!(wake.again, Some(ClaimReason::Notify), "a retry gives way");
        assert!(wake.news(ClaimReason::Notify));
        let mut wake = WakeState::default();
        wake.join_again(ClaimReason::Drain);
        wake.join_again(ClaimReason::Notify);
        wake.join_again(ClaimReason::Presence);
        assert_eq!(
            wake.again,
            Some(ClaimReason::Drain),
            "the first wake claims"
        );
        assert!(
            wake.news(ClaimReason::Drain),
            "the notification's news is kept"
        );
        assert!(!wake.news(ClaimReason::Drain), "and taken once");
        wake.join_again(ClaimReason::Freed);
        assert!(
            !wake.news(ClaimReason::Freed),
            "freed permits bring no news"
        );
    }

    #[test]
    fn only_a_wake_waits_out_the_cooldown_and_the_wakes_meanwhile_join_it() {
        let (mut wake, now) = (WakeState::default(), Instant::now());
        let cooldown = Duration::from_millis(5);
        // No claim sent yet: nothing waits.
        assert_eq!(
            wake.gate(ClaimReason::Notify, now, cooldown),
            Some(ClaimReason::Notify)
        );
        wake.last_sent = Some(now);
        let soon = now + Duration::from_millis(1);
        // A backlog's claims and the start-up never wait.
        for why in [
            ClaimReason::Drain,
            ClaimReason::Freed,
            ClaimReason::Startup,
            ClaimReason::Step,
        ] {
            assert_eq!(wake.gate(why, soon, cooldown), Some(why), "{why:?}");
            assert_eq!(wake.held_until(), None, "{why:?}");
        }
        // A registration waits; a notification joins it and takes its place; a later
        // registration does not displace the notification; the clock's wake displaces both.
        assert_eq!(wake.gate(ClaimReason::Presence, soon, cooldown), None);
        assert_eq!(wake.held_until(), Some(now + cooldown));
        assert_eq!(wake.gate(ClaimReason::Notify, soon, cooldown), None);
        assert_eq!(wake.gate(ClaimReason::Presence, soon, cooldown), None);
        assert_eq!(wake.held, Some((ClaimReason::Notify, now + cooldown)));
        assert_eq!(wake.gate(ClaimReason::Poll, soon, cooldown), None);
        assert_eq!(wake.gate(ClaimReason::Notify, soon, cooldown), None);
        assert_eq!(wake.release_held(), Some(ClaimReason::Poll));
        assert_eq!((wake.held_until(), wake.release_held()), (None, None));
        for why in [ClaimReason::Due, ClaimReason::CatchUp] {
            assert_eq!(wake.gate(why, soon, cooldown), None, "{why:?}");
            assert_eq!(wake.release_held(), Some(why));
        }
        // The cooldown over, or none set: every wake claims at once, taking the held one with
        // it; a backlog's claim leaves it held.
        let later = now + cooldown;
        assert_eq!(
            wake.gate(ClaimReason::Notify, later, cooldown),
            Some(ClaimReason::Notify)
        );
        assert_eq!(wake.gate(ClaimReason::Poll, soon, cooldown), None);
        assert_eq!(
            wake.gate(ClaimReason::Drain, later, cooldown),
            Some(ClaimReason::Drain)
        );
        assert_eq!(wake.held_until(), Some(now + cooldown));
        assert_eq!(
            wake.gate(ClaimReason::Notify, later, cooldown),
            Some(ClaimReason::Poll)
        );
        assert_eq!(wake.held_until(), None);
        assert_eq!(
            wake.gate(ClaimReason::Notify, soon, Duration::ZERO),
            Some(ClaimReason::Notify)
        );
        assert_eq!(wake.held_until(), None);
    }

    #[test]
    fn a_presence_retry_that_carries_freed_permits_is_sent_as_a_claim_for_them() {
        assert_eq!(
            reason_carrying(ClaimReason::Presence, true),
            ClaimReason::Freed
        );
        assert_eq!(
            reason_carrying(ClaimReason::Presence, false),
            ClaimReason::Presence
        );
        assert_eq!(
            reason_carrying(ClaimReason::Notify, true),
            ClaimReason::Notify
        );
    }
}
