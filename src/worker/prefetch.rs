//! The prefetch buffer: jobs a replica claimed ahead of its free slots while a backlog lasts,
//! waiting (leased, held, renewed by heartbeats) for a slot to free.
//!
//! Why: a claim and a group commit cost per statement as well as per job, so batches of 25 cost
//! 1.4–2× per job what batches of 100 cost (`../shared/research/throughput`, Table B). Claiming only
//! for free slots ties the batch to the slot count (and so shrinks it as replicas are added), and
//! leaves freed slots idle for a claim's round trip. With a buffer, a freed slot starts its next
//! job at once, and the claim loop tops the buffer up in batches of about half of
//! `slots + prefetch`, while the running jobs run.
//!
//! Invariants this module keeps:
//! - Jobs leave the buffer in the order they were claimed (the claim's due order).
//! - The buffer never asks for more than the configured prefetch ([`Prefetch::ahead`] is at most
//!   the configured maximum), and a job waits in it at most [`HOLD`]: the claim loop then releases
//!   it (attempt not charged), so jobs claimed ahead never wait behind long-running ones while
//!   another replica idles.
//! - Claiming ahead adapts: every release of waiting jobs halves what the replica claims ahead
//!   (down to none, claiming only for free slots); every freed slot that finds the buffer empty
//!   under a backlog doubles it again, up to the configured maximum.
//! - Holding (the lease, its renewals, its release at shutdown) is not this module's: the jobs it
//!   buffers are in the replica's held jobs from their claim on.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How long a job may wait in the buffer before the claim loop releases it.
pub(crate) const HOLD: Duration = Duration::from_secs(1);

/// Jobs claimed ahead of free slots, oldest first, with what the replica claims ahead now.
#[derive(Debug)]
pub(crate) struct Prefetch<T> {
    /// The buffered jobs, each with when it entered, oldest first.
    jobs: VecDeque<(T, Instant)>,
    /// How many jobs the replica claims ahead of its free slots now.
    ahead: usize,
    /// The configured prefetch: the most `ahead` ever is.
    max: usize,
}

impl<T> Prefetch<T> {
    /// An empty buffer that claims ahead up to `max` jobs.
    pub(crate) fn new(max: usize) -> Prefetch<T> {
        Prefetch {
            jobs: VecDeque::new(),
            ahead: max,
            max,
        }
    }

    /// How many jobs wait.
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// How many jobs the replica claims ahead of its free slots now.
    pub(crate) fn ahead(&self) -> usize {
        self.ahead
    }

    /// Buffers `job`, claimed at `now`.
    pub(crate) fn push(&mut self, job: T, now: Instant) {
        self.jobs.push_back((job, now));
    }

    /// The job that waited longest, if any.
    pub(crate) fn pop(&mut self) -> Option<T> {
        self.jobs.pop_front().map(|(job, _)| job)
    }

    /// When the oldest job will have waited [`HOLD`].
    pub(crate) fn next_release_at(&self) -> Option<Instant> {
        self.jobs.front().map(|(_, since)| *since + HOLD)
    }

    /// Removes the jobs that have waited [`HOLD`] or longer by `now`, for release; when there are
    /// any, halves what the replica claims ahead.
    pub(crate) fn take_overdue(&mut self, now: Instant) -> Vec<T> {
        let overdue = self
            .jobs
            .iter()
            .take_while(|(_, since)| *since + HOLD <= now)
            .count();
        if overdue > 0 {
            self.ahead /= 2;
        }
        self.jobs.drain(..overdue).map(|(job, _)| job).collect()
    }

    /// Records that a slot freed under a backlog found the buffer empty: claims ahead twice as
    /// many (at least one), up to the configured prefetch.
    pub(crate) fn ran_dry(&mut self) {
        self.ahead = (self.ahead * 2).max(1).min(self.max);
    }

    /// Every buffered job, emptying the buffer.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.jobs.drain(..).map(|(job, _)| job)
    }
}

#[cfg(test)]
mod tests {
    use super::{Prefetch, HOLD};
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn jobs_leave_in_claim_order_and_overdue_ones_go_to_release() {
        let start = Instant::now();
        let mut buffer = Prefetch::new(8);
        assert!(buffer.is_empty());
        assert_eq!(buffer.next_release_at(), None);
        buffer.push(1, start);
        buffer.push(2, start + Duration::from_millis(10));
        buffer.push(3, start + Duration::from_millis(20));
        assert_eq!(buffer.len(), 3);
        assert_eq!(buffer.next_release_at(), Some(start + HOLD));
        assert_eq!(buffer.pop(), Some(1));
        assert_eq!(
            buffer.next_release_at(),
            Some(start + Duration::from_millis(10) + HOLD)
        );
        // Nothing is overdue before its hold ends, and the allowance stays.
        assert!(buffer.take_overdue(start + HOLD).is_empty());
        assert_eq!(buffer.ahead(), 8);
        assert_eq!(
            buffer.take_overdue(start + Duration::from_millis(15) + HOLD),
            vec![2]
        );
        assert_eq!(buffer.ahead(), 4);
        assert_eq!(buffer.drain().collect::<Vec<_>>(), vec![3]);
        assert_eq!(buffer.pop(), None);
    }

    #[test]
    fn claiming_ahead_halves_on_release_and_doubles_when_slots_run_dry() {
        let start = Instant::now();
        let mut buffer = Prefetch::new(6);
        for expected in [3, 1, 0, 0] {
            buffer.push((), start);
            assert_eq!(buffer.take_overdue(start + HOLD).len(), 1);
            assert_eq!(buffer.ahead(), expected);
        }
        for expected in [1, 2, 4, 6, 6] {
            buffer.ran_dry();
            assert_eq!(buffer.ahead(), expected);
        }
    }

    #[test]
    fn a_replica_without_prefetch_never_claims_ahead() {
        let mut buffer: Prefetch<()> = Prefetch::new(0);
        assert_eq!(buffer.ahead(), 0);
        buffer.ran_dry();
        assert_eq!(buffer.ahead(), 0);
    }
}
