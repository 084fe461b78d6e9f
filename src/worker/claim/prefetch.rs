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
//! - The replica claims ahead only what it starts in [`LOOKAHEAD`] at its recent start rate, and
//!   never more than the configured prefetch ([`Prefetch::ahead`]). An idle replica's start rate
//!   decays to nothing, so the first claim of a burst asks only for free slots and the replicas
//!   share the burst; a replica running long jobs starts few per second and so claims few ahead.
//! - A job waits in the buffer at most [`HOLD`]: the claim loop then releases it (attempt not
//!   charged), so jobs claimed ahead never wait long behind running ones while another replica
//!   idles.
//! - Holding (the lease, its renewals, its release at shutdown) is not this module's: the jobs it
//!   buffers are in the replica's held jobs from their claim on.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How long a job may wait in the buffer before the claim loop releases it.
pub(crate) const HOLD: Duration = Duration::from_secs(1);

/// How far ahead a replica claims, in time at its recent start rate: half the hold, so that what
/// it claims ahead starts well within the hold.
pub(crate) const LOOKAHEAD: Duration = Duration::from_millis(500);

/// The window over which starts are counted; the rate halves with each window that passes.
pub(crate) const RATE_WINDOW: Duration = Duration::from_millis(50);

/// Jobs claimed ahead of free slots, oldest first, and the recent rate at which jobs start.
#[derive(Debug)]
pub(crate) struct Prefetch<T> {
    /// The buffered jobs, each with when it entered, oldest first.
    jobs: VecDeque<(T, Instant)>,
    /// The configured prefetch: the most the replica ever claims ahead.
    max: usize,
    /// Jobs started per second, as of `window_start`.
    rate: f64,
    /// When the current window of starts began.
    window_start: Instant,
    /// Jobs started since `window_start`.
    started: u32,
}

impl<T> Prefetch<T> {
    /// An empty buffer that claims ahead up to `max` jobs, with no starts yet.
    pub(crate) fn new(max: usize) -> Prefetch<T> {
        Prefetch {
            jobs: VecDeque::new(),
            max,
            rate: 0.0,
            window_start: Instant::now(),
            started: 0,
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

    /// Jobs started per second as of `now`: the windows that ended since the last one closed
    /// each halve the older rate and weigh in the starts counted since.
    fn rate_at(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < RATE_WINDOW {
            return self.rate;
        }
        let old = 0.5_f64.powf(elapsed.as_secs_f64() / RATE_WINDOW.as_secs_f64());
        self.rate * old + f64::from(self.started) / elapsed.as_secs_f64() * (1.0 - old)
    }

    /// How many jobs the replica claims ahead of its free slots at `now`: what it starts in
    /// [`LOOKAHEAD`] at its recent rate, at most the configured prefetch.
    pub(crate) fn ahead(&self, now: Instant) -> usize {
        let ahead = self.rate_at(now) * LOOKAHEAD.as_secs_f64();
        // A float to a count: negative is impossible, the cast saturates, and `max` bounds it.
        (ahead as usize).min(self.max)
    }

    /// Buffers `job`, claimed at `now`.
    pub(crate) fn push(&mut self, job: T, now: Instant) {
        self.jobs.push_back((job, now));
    }

    /// The job that waited longest, if any, to start at `now` (counted in the start rate).
    pub(crate) fn pop(&mut self, now: Instant) -> Option<T> {
        let (job, _) = self.jobs.pop_front()?;
        if now.saturating_duration_since(self.window_start) >= RATE_WINDOW {
            self.rate = self.rate_at(now);
            self.window_start = now;
            self.started = 0;
        }
        self.started = self.started.saturating_add(1);
        Some(job)
    }

    /// When the oldest job will have waited [`HOLD`].
    pub(crate) fn next_release_at(&self) -> Option<Instant> {
        self.jobs.front().map(|(_, since)| *since + HOLD)
    }

    /// Removes the jobs that have waited [`HOLD`] or longer by `now`, for release.
    pub(crate) fn take_overdue(&mut self, now: Instant) -> Vec<T> {
        let overdue = self
            .jobs
            .iter()
            .take_while(|(_, since)| *since + HOLD <= now)
            .count();
        self.jobs.drain(..overdue).map(|(job, _)| job).collect()
    }

    /// Every buffered job, emptying the buffer.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.jobs.drain(..).map(|(job, _)| job)
    }
}

/// Whether a replica draining a backlog should claim now, holding `held` (running and buffered)
/// of its `capacity`: once at least half of it is room, so each claim (and the group commits
/// that follow) carries a batch worth its statement, instead of one claim per freed job.
pub(crate) fn refill_now(capacity: usize, held: usize) -> bool {
    capacity.saturating_sub(held) >= capacity.div_ceil(2)
}

#[cfg(test)]
mod tests {
    use super::{Prefetch, HOLD, RATE_WINDOW};
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
        assert_eq!(buffer.pop(start), Some(1));
        assert_eq!(
            buffer.next_release_at(),
            Some(start + Duration::from_millis(10) + HOLD)
        );
        assert!(buffer.take_overdue(start + HOLD).is_empty());
        assert_eq!(
            buffer.take_overdue(start + Duration::from_millis(15) + HOLD),
            vec![2]
        );
        assert_eq!(buffer.drain().collect::<Vec<_>>(), vec![3]);
        assert_eq!(buffer.pop(start), None);
    }

    #[test]
    fn a_replica_claims_ahead_what_it_starts_in_half_a_second_and_no_more_than_its_prefetch() {
        let start = Instant::now();
        let (mut wide, mut capped) = (Prefetch::new(1000), Prefetch::new(100));
        // No start yet: nothing ahead, so the first claim of a burst asks for free slots only.
        assert_eq!(wide.ahead(start), 0);
        // 40 starts in one window (800 per second), then the window closes.
        for buffer in [&mut wide, &mut capped] {
            for i in 0..40 {
                buffer.push(i, start);
            }
            for _ in 0..40 {
                buffer.pop(start + Duration::from_millis(1));
            }
        }
        let closed = start + Duration::from_millis(1) + RATE_WINDOW;
        // Half the older rate (none) and half of 800 per second: 400, so 200 in 500 ms.
        let ahead = wide.ahead(closed);
        assert!((190..=200).contains(&ahead), "{ahead}");
        assert_eq!(capped.ahead(closed), 100, "capped by the prefetch");
        // The next start keeps the rate.
        wide.push(99, closed);
        wide.pop(closed);
        assert_eq!(wide.ahead(closed), ahead);
        // Idle, the rate halves with every window: after a second, nothing ahead.
        assert!(wide.ahead(closed + RATE_WINDOW * 2) < ahead / 2);
        assert_eq!(wide.ahead(closed + Duration::from_secs(1)), 0);
    }

    #[test]
    fn slow_jobs_are_claimed_only_a_few_ahead() {
        let start = Instant::now();
        let mut buffer = Prefetch::new(128);
        // Eight slots of 200 ms jobs: 40 starts a second, one every 25 ms, for two seconds.
        for i in 0..80u32 {
            let at = start + Duration::from_millis(25) * i;
            buffer.push(i, at);
            buffer.pop(at);
        }
        let ahead = buffer.ahead(start + Duration::from_secs(2));
        assert!((10..=30).contains(&ahead), "about 20 ahead: {ahead}");
    }

    #[test]
    fn a_replica_without_prefetch_never_claims_ahead() {
        let start = Instant::now();
        let mut buffer = Prefetch::new(0);
        for i in 0..10 {
            buffer.push(i, start);
            buffer.pop(start);
        }
        assert_eq!(buffer.ahead(start + RATE_WINDOW), 0);
    }

    #[test]
    fn a_draining_replica_refills_once_half_its_room_is_free() {
        assert!(!super::refill_now(8, 5));
        assert!(super::refill_now(8, 4));
        assert!(super::refill_now(1, 0));
        assert!(!super::refill_now(1, 1));
        assert!(super::refill_now(3, 1));
        assert!(!super::refill_now(3, 2));
        // The buffer's allowance may shrink below what is already held.
        assert!(!super::refill_now(4, 9));
    }
}
