//! What the claim loop remembers between wakes, and when a short claim asks when the next
//! deferred job is due.
//!
//! Invariants this module keeps:
//! - A short claim that the clock or a reconnect caused always asks; any other asks at most once
//!   per [`NEXT_DUE_REFRESH`]: a deferred job enqueued meanwhile (deferred enqueues announce
//!   nothing) is found at most that much later, or by the poll.

use crate::worker::stats::ClaimReason;
use std::time::Duration;
use tokio::time::Instant;

/// How long the answer to "when is the next deferred job due" is trusted after a short claim
/// that a notification, freed slots or permits caused: a deferred job enqueued meanwhile is
/// found at most this much later by the next short claim, or by the poll.
pub(super) const NEXT_DUE_REFRESH: Duration = Duration::from_millis(50);

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
    /// The first wake that arrived while a claim was in flight: it claims once that one is back.
    pub(super) again: Option<ClaimReason>,
    /// When the replica last asked when the next deferred job is due.
    pub(super) next_due_asked_at: Option<Instant>,
}

impl WakeState {
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
