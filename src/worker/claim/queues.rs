//! How a replica shares each claim's room among the queues it serves: by weight, with deficit
//! carry, among the queues that may have work.
//!
//! Invariants this module keeps:
//! - The counts of one claim add up to its room exactly, and no queue is asked for a job more
//!   than its share: each queue's share of the room is `room × weight / total weight` of the
//!   queues asked, the fractions carried from claim to claim (a deficit round robin), so over
//!   consecutive full claims every queue is asked for its weighted share to within one job.
//! - A claim that keeps draining a backlog asks at most [`DRAIN_FAN_OUT`] queues, those owed the
//!   most; the rest keep their credit and are owed the most later, so over consecutive claims
//!   every queue still gets its weighted share (to within a few percent, tested).
//! - A queue whose last claim came back short (it had no more due jobs of the replica's kinds)
//!   is left out of the next claims, and its share goes to the others, until a wake that may
//!   have brought it work: a notification, the poll, a due deferred job or a catch-up
//!   ([`QueueShares::refresh`]), or until it has been left out for [`LEFT_OUT_MAX`]
//!   ([`QueueShares::expire`]). So a replica with one busy queue and many empty ones sends one
//!   probe of the empty ones per such wake, or per [`LEFT_OUT_MAX`] of a backlog, not one per
//!   claim. When every queue came back short, all are asked again.
//! - A queue is left out only while the replica drains a backlog, and a replica draining a
//!   backlog is parked (`presence`): wakes do not reach it. So a job enqueued into a queue left
//!   out, that only this replica serves, is asked for by the first claim at least
//!   [`LEFT_OUT_MAX`] after the queue came back short, never only once the backlog is gone.

use crate::queue::ServedQueue;
use std::time::Duration;
use tokio::time::Instant;

/// The most queues a claim that keeps draining a backlog asks at once (`asks_of_at_most`): a
/// replica serving 100 busy queues probes 16 of them per claim, for about 9 jobs each of a
/// 144-job room, instead of all 100 for one or two each (each ask is one index probe per
/// registered kind). Every other claim (a wake, the poll, freed permits) asks every queue that
/// may have work.
pub(crate) const DRAIN_FAN_OUT: usize = 16;

/// The longest a queue that came back short is left out of a backlog's claims: the longest a job
/// enqueued into it waits past its commit for a busy replica's claim (which no wake reaches)
/// beyond the backlog's next claim.
pub(crate) const LEFT_OUT_MAX: Duration = Duration::from_millis(32);

use crate::worker::lease::ClaimedJob;

/// One served queue and what the sharing remembers of it.
#[derive(Debug, Clone)]
struct Served {
    /// The queue's name.
    name: String,
    /// Its weight.
    weight: u64,
    /// What it was owed beyond whole jobs, in units of `1 / total weight` of a job.
    credit: u64,
    /// When its last claim came back short, if it did.
    short: Option<Instant>,
}

/// The room-sharing state of one replica's claim loop.
#[derive(Debug, Clone)]
pub(crate) struct QueueShares {
    /// The served queues, in configured order.
    queues: Vec<Served>,
}

impl QueueShares {
    /// Sharing for `queues`, none of them short yet.
    pub(crate) fn new(queues: &[ServedQueue]) -> QueueShares {
        QueueShares {
            queues: queues
                .iter()
                .map(|q| Served {
                    name: q.name.clone(),
                    weight: u64::from(q.weight),
                    credit: 0,
                    short: None,
                })
                .collect(),
        }
    }

    /// Shares `room` among the queues that may have work (every queue, when all came back
    /// short): `(queue, count)` for each queue asked for at least one job, in configured order.
    pub(crate) fn asks(&mut self, room: usize) -> Vec<(&str, usize)> {
        self.asks_of_at_most(room, usize::MAX)
    }

    /// [`QueueShares::asks`], asking at most `fan_out` queues: when more may have work, the
    /// `fan_out` owed the most (their carried credit, ties to the first configured) share the
    /// room in proportion to what they are owed, and the others keep their credit, growing, so
    /// they are owed the most at a later claim. Over consecutive claims every queue is still
    /// asked for its weighted share; each claim probes fewer queues, for more jobs each.
    pub(crate) fn asks_of_at_most(&mut self, room: usize, fan_out: usize) -> Vec<(&str, usize)> {
        if self.queues.iter().all(|q| q.short.is_some()) {
            self.refresh();
        }
        let total: u64 = self
            .queues
            .iter()
            .filter(|q| q.short.is_none())
            .map(|q| q.weight)
            .sum();
        let room_units = u64::try_from(room).unwrap_or(u64::MAX);
        for q in self.queues.iter_mut().filter(|q| q.short.is_none()) {
            q.credit = q.credit.saturating_add(room_units.saturating_mul(q.weight));
        }
        let mut open: Vec<usize> = (0..self.queues.len())
            .filter(|&i| self.queues[i].short.is_none())
            .collect();
        let limited = open.len() > fan_out;
        if limited {
            open.sort_by_key(|&i| (std::cmp::Reverse(self.queues[i].credit), i));
            open.truncate(fan_out);
            open.sort_unstable();
        }
        // Each asked queue's whole jobs: its credit's, or (limited) its share of the room by
        // what the asked queues are owed.
        let owed = u128::from(
            open.iter()
                .map(|&i| self.queues[i].credit)
                .sum::<u64>()
                .max(1),
        );
        let mut counts = vec![0u64; self.queues.len()];
        let mut given = 0u64;
        for &i in &open {
            let q = &mut self.queues[i];
            counts[i] = if limited {
                let share = u128::from(room_units) * u128::from(q.credit) / owed;
                u64::try_from(share).unwrap_or(u64::MAX)
            } else {
                q.credit / total.max(1)
            };
            q.credit = q
                .credit
                .saturating_sub(counts[i].saturating_mul(total.max(1)));
            given += counts[i];
        }
        // What whole shares left over goes, a job each, to the asked queues owed the most.
        while given < room_units {
            let Some(&i) = open
                .iter()
                .max_by_key(|&&i| (self.queues[i].credit, std::cmp::Reverse(i)))
            else {
                break;
            };
            let q = &mut self.queues[i];
            q.credit = q.credit.saturating_sub(total);
            counts[i] += 1;
            given += 1;
        }
        self.queues
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|(q, n)| (q.name.as_str(), usize::try_from(n).unwrap_or(usize::MAX)))
            .collect()
    }

    /// Records what a claim of `asks`, back at `now`, took of each: `took[i]` jobs of `asks[i]`.
    /// A queue that got fewer than it was asked for is short from `now` until
    /// [`QueueShares::refresh`] or [`QueueShares::expire`].
    pub(crate) fn took(&mut self, asks: &[(String, usize)], took: &[usize], now: Instant) {
        for ((name, asked), got) in asks.iter().zip(took) {
            if let Some(q) = self.queues.iter_mut().find(|q| &q.name == name) {
                q.short = (got < asked).then_some(now);
            }
        }
    }

    /// Before a claim sent at `now`: forgets which queues came back short when the claim brings
    /// `news` (a wake), else only those left out for [`LEFT_OUT_MAX`] ([`QueueShares::expire`]).
    pub(crate) fn renew(&mut self, news: bool, now: Instant) {
        if news {
            self.refresh();
        } else {
            self.expire(now);
        }
    }

    /// Forgets, at `now`, that a queue came back short once it has been left out for
    /// [`LEFT_OUT_MAX`]: a claim of a backlog asks it again.
    fn expire(&mut self, now: Instant) {
        for q in &mut self.queues {
            if q.short.is_some_and(|at| now >= at + LEFT_OUT_MAX) {
                q.short = None;
            }
        }
    }

    /// Whether some queue has not come back short since the last wake: it filled its last ask,
    /// or was not asked since. Until none has, a short claim is no sign that the replica is idle.
    pub(crate) fn may_have_work(&self) -> bool {
        self.queues.iter().any(|q| q.short.is_none())
    }

    /// Forgets that `queue` came back short: this replica just freed permits of it.
    pub(crate) fn reopen(&mut self, queue: &str) {
        if let Some(q) = self.queues.iter_mut().find(|q| q.name == queue) {
            q.short = None;
        }
    }

    /// Forgets which queues came back short: a wake may have brought any of them work.
    fn refresh(&mut self) {
        for q in &mut self.queues {
            q.short = None;
        }
    }
}

/// How many of `jobs` each of a claim's `asks` asks took, by position.
pub(crate) fn took_per_ask(asks: usize, jobs: &[ClaimedJob]) -> Vec<usize> {
    let mut took = vec![0; asks];
    for job in jobs {
        if let Some(n) = took.get_mut(job.asked_of) {
            *n += 1;
        }
    }
    took
}

#[cfg(test)]
mod tests {
    use super::{QueueShares, LEFT_OUT_MAX};
    use crate::queue::ServedQueue;
    use tokio::time::Instant;

    /// Sharing for queues `a` and `b` with weights `wa` and `wb`.
    fn two(wa: u32, wb: u32) -> QueueShares {
        QueueShares::new(&[
            ServedQueue::new("a").weighted(wa),
            ServedQueue::new("b").weighted(wb),
        ])
    }

    /// The count asked of `name` in `asks`, 0 if it was not asked.
    fn count(asks: &[(&str, usize)], name: &str) -> usize {
        asks.iter().find(|(q, _)| *q == name).map_or(0, |a| a.1)
    }

    #[test]
    fn a_claims_room_is_shared_by_weight_and_adds_up_exactly() {
        let mut shares = two(3, 1);
        let (mut a, mut b) = (0, 0);
        for room in [7, 1, 1, 5, 13, 2, 3, 64, 4] {
            let asks = shares.asks(room);
            assert_eq!(asks.iter().map(|x| x.1).sum::<usize>(), room);
            a += count(&asks, "a");
            b += count(&asks, "b");
        }
        // 100 jobs asked at 3:1, every fraction carried: exactly 75 and 25.
        assert_eq!((a, b), (75, 25));
    }

    #[test]
    fn single_jobs_alternate_by_weight() {
        let mut shares = two(2, 1);
        let order: Vec<String> = (0..6).map(|_| shares.asks(1)[0].0.to_owned()).collect();
        assert_eq!(order, ["a", "a", "b", "a", "a", "b"]);
    }

    #[test]
    fn work_may_remain_until_every_queue_came_back_short_since_the_last_wake() {
        let mut shares = QueueShares::new(&[ServedQueue::new("hot"), ServedQueue::new("empty")]);
        let asks = vec![("hot".to_owned(), 1)];
        shares.took(&asks, &[1], Instant::now());
        assert!(shares.may_have_work(), "hot filled its ask");
        shares.took(&asks, &[0], Instant::now());
        assert!(shares.may_have_work(), "empty was never asked");
        shares.took(&[("empty".to_owned(), 3)], &[0], Instant::now());
        assert!(!shares.may_have_work(), "both came back short");
        shares.refresh();
        assert!(shares.may_have_work());
    }

    #[test]
    fn a_short_queue_gives_its_share_to_the_others_until_a_refresh() {
        let mut shares = two(1, 1);
        assert_eq!(shares.asks(10), vec![("a", 5), ("b", 5)]);
        shares.took(&[("a".into(), 5), ("b".into(), 5)], &[2, 5], Instant::now());
        assert_eq!(shares.asks(10), vec![("b", 10)], "a came back short");
        shares.took(&[("b".into(), 10)], &[10], Instant::now());
        assert_eq!(shares.asks(4), vec![("b", 4)]);
        shares.refresh();
        assert_eq!(count(&shares.asks(10), "a"), 5, "asked again after a wake");
    }

    #[test]
    fn a_queue_left_out_of_a_backlogs_claims_is_asked_again_after_the_longest_wait() {
        let mut shares = two(1, 1);
        let at = Instant::now();
        shares.took(&[("a".into(), 5), ("b".into(), 5)], &[0, 5], at);
        shares.renew(false, at + LEFT_OUT_MAX / 2);
        assert_eq!(shares.asks(10), vec![("b", 10)], "a left out");
        shares.took(&[("b".into(), 10)], &[10], at);
        shares.renew(false, at + LEFT_OUT_MAX);
        assert_eq!(count(&shares.asks(10), "a"), 5, "a asked again");
        assert!(shares.may_have_work());
        shares.took(&[("a".into(), 5)], &[0], at);
        shares.renew(true, at);
        assert_eq!(count(&shares.asks(10), "a"), 5, "a wake asks every queue");
    }

    #[test]
    fn when_every_queue_came_back_short_all_are_asked_again() {
        let mut shares = two(1, 3);
        shares.took(&[("a".into(), 1), ("b".into(), 3)], &[0, 0], Instant::now());
        let asks = shares.asks(8);
        assert_eq!(asks, vec![("a", 2), ("b", 6)]);
    }

    #[test]
    fn a_claim_asks_at_most_its_fan_out_and_every_queue_gets_its_weighted_share_over_claims() {
        let queues: Vec<ServedQueue> = (0..100)
            .map(|i| ServedQueue::new(&format!("q{i}")).weighted(if i < 10 { 3 } else { 1 }))
            .collect();
        let mut shares = QueueShares::new(&queues);
        let mut got = vec![0usize; 100];
        for _ in 0..600 {
            let asks = shares.asks_of_at_most(144, 16);
            assert!(asks.len() <= 16, "{} queues asked", asks.len());
            assert_eq!(asks.iter().map(|a| a.1).sum::<usize>(), 144);
            for (name, n) in asks {
                got[name[1..].parse::<usize>().unwrap()] += n;
            }
        }
        // 86,400 jobs at 3 for the first ten and 1 for the other ninety: 2,160 and 720 each.
        for (i, n) in got.iter().enumerate() {
            let due = if i < 10 { 2160.0 } else { 720.0 };
            let off = (*n as f64 - due).abs() / due;
            assert!(off < 0.05, "q{i} got {n} of {due}");
        }
        // Within the fan-out nothing changes.
        let mut few = two(3, 1);
        assert_eq!(few.asks_of_at_most(8, 2), vec![("a", 6), ("b", 2)]);
    }
}
