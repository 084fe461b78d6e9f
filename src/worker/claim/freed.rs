//! The permits a replica's own completions freed, and what it owes the other replicas for them.
//!
//! A completion of a capped (or key-capped) queue's job frees its permits and wakes nobody
//! (migration 0023): the replica that completed it has a free slot and serves the queue, so it
//! claims the permits' next jobs itself, instead of every waiting replica racing for them (the
//! freed-permit herd).
//!
//! Invariants this module keeps:
//! - Every permit a completion of this replica freed is counted here (by queue) until the next
//!   claim is sent, which asks every such queue again, whether or not its last ask came back
//!   short ([`FreedPermits::take`]).
//! - The replica wakes the waiting replicas (`dispatch::wake_waiting`, after the permits' commit)
//!   whenever it cannot account for every permit it freed: no claim can be sent (no room, or it
//!   is draining), the claim failed, or it took fewer of a queue's jobs than the permits it
//!   freed there ([`unclaimed`]): the queue ran dry of its kinds, or the next job of a freed key
//!   is of a kind it does not run. So a freed permit with a due job waits for no poll, and under
//!   a capped backlog of its kinds no other replica is woken.

/// Permits freed by this replica's completions since its last claim was sent: `(queue, count)`.
#[derive(Debug, Default)]
pub(crate) struct FreedPermits(Vec<(String, usize)>);

impl FreedPermits {
    /// Counts one permit freed in `queue` (a job that held one ended on this replica).
    pub(crate) fn record(&mut self, queue: &str) {
        match self.0.iter_mut().find(|(q, _)| q == queue) {
            Some((_, n)) => *n += 1,
            None => self.0.push((queue.to_owned(), 1)),
        }
    }

    /// Whether no permit was freed since the last claim.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The freed permits, forgotten here: the claim being sent answers for them.
    pub(crate) fn take(&mut self) -> Vec<(String, usize)> {
        std::mem::take(&mut self.0)
    }
}

/// Whether a claim that asked `asks`, took `took[i]` jobs of `asks[i]` and said `left_free` of
/// its capped asks (`None`: the claim failed) left some of the `freed` permits to the other
/// replicas: a freed queue it did not ask at all; one whose queue cap it saw free permits of
/// beyond the due jobs it could run (`Some(true)`, whatever it took: another kind's jobs, or a
/// queue run dry, where a wake costs the others one claim each); or, for a queue with a key cap
/// only, whose free permits the claim cannot count, one of which it took fewer jobs than the
/// permits freed there. A claim that saw no free permit left (`Some(false)`) answers for them
/// all, even having taken none: claimers racing it took them.
pub(crate) fn unclaimed(
    freed: &[(String, usize)],
    asks: &[(String, usize)],
    took: &[usize],
    left_free: Option<&[(usize, Option<bool>)]>,
) -> bool {
    let Some(left_free) = left_free else {
        return !freed.is_empty();
    };
    freed.iter().any(|(queue, n)| {
        let Some(i) = asks.iter().position(|(q, _)| q == queue) else {
            return true;
        };
        match left_free.iter().find(|(ask, _)| *ask == i) {
            Some((_, Some(left))) => *left,
            _ => took.get(i).copied().unwrap_or(0) < *n,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{unclaimed, FreedPermits};

    #[test]
    fn freed_permits_are_counted_by_queue_and_taken_once() {
        let mut freed = FreedPermits::default();
        assert!(freed.is_empty());
        freed.record("a");
        freed.record("b");
        freed.record("a");
        assert!(!freed.is_empty());
        assert_eq!(freed.take(), vec![("a".to_owned(), 2), ("b".to_owned(), 1)]);
        assert!(freed.is_empty());
        assert!(freed.take().is_empty());
    }

    #[test]
    fn a_claim_answers_for_freed_permits_by_what_it_saw_left_free() {
        let freed = vec![("a".to_owned(), 2)];
        let asks = vec![("b".to_owned(), 8), ("a".to_owned(), 8)];
        // A queue cap: what the claim saw decides, not what it took.
        assert!(unclaimed(&freed, &asks, &[0, 5], Some(&[(1, Some(true))])));
        assert!(!unclaimed(
            &freed,
            &asks,
            &[8, 0],
            Some(&[(1, Some(false))])
        ));
        // A key cap only, or no marker: as many jobs of the queue as it freed permits.
        assert!(!unclaimed(&freed, &asks, &[0, 2], Some(&[(1, None)])));
        assert!(unclaimed(&freed, &asks, &[8, 1], Some(&[(1, None)])));
        assert!(!unclaimed(&freed, &asks, &[0, 3], Some(&[])));
        assert!(unclaimed(&freed, &asks, &[0, 1], Some(&[(0, Some(false))])));
        // The freed queue was not asked, or the claim failed.
        assert!(unclaimed(&freed, &asks[..1], &[8], Some(&[])));
        assert!(unclaimed(&freed, &asks, &[], None));
        assert!(!unclaimed(&[], &asks, &[], None));
        assert!(!unclaimed(&[], &asks, &[0, 0], Some(&[])));
    }
}
