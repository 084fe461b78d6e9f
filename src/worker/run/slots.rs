//! Slots: how many of a replica's jobs are in their compute phase, and a signal when one leaves
//! it.
//!
//! A job takes a slot when its task starts and gives it back when its compute phase ends
//! ([`Handler::prepare`](crate::job::handler::Handler::prepare) returned, failed, timed out or was
//! cancelled), not when its transition has committed: a job waiting for its group commit uses
//! no handler concurrency, and freeing its slot then lets the next job compute while this one
//! commits. So commit batches are not bounded by the slot count (they gather whatever finished
//! while the other lane committed), and what the replica holds in all (computing, committing and
//! buffered) stays bounded by the producer's room.
//!
//! Invariants this module keeps:
//! - [`Slots::busy`] counts the permits alive: a permit gives its slot back exactly once, when it
//!   is dropped, whatever ends it (the end of the compute phase, a panic, an aborted task).
//! - Every slot given back wakes the producer: the signal is stored when nobody waits, so it is
//!   never lost between two waits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A replica's slots.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// Jobs in their compute phase.
    busy: AtomicUsize,
    /// Signalled each time a slot is given back.
    freed: Notify,
}

impl Slots {
    /// How many jobs are in their compute phase.
    pub(crate) fn busy(&self) -> usize {
        self.busy.load(Ordering::Acquire)
    }

    /// Takes a slot for a job about to start.
    pub(crate) fn take(self: &Arc<Self>) -> SlotPermit {
        self.busy.fetch_add(1, Ordering::AcqRel);
        SlotPermit(Arc::clone(self))
    }

    /// Resolves once a slot has been given back since the last time this resolved.
    pub(crate) async fn freed(&self) {
        self.freed.notified().await;
    }
}

/// One job's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct SlotPermit(Arc<Slots>);

impl Drop for SlotPermit {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_permit_gives_its_slot_back_once_and_the_signal_waits_for_its_waiter() {
        let slots = Arc::new(Slots::default());
        let (a, b) = (slots.take(), slots.take());
        assert_eq!(slots.busy(), 2);
        drop(a);
        assert_eq!(slots.busy(), 1);
        // Given back while nobody waited: the next wait resolves at once.
        tokio::time::timeout(Duration::from_secs(5), slots.freed())
            .await
            .unwrap();
        let panicking = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move {
                let _slot = slots.take();
                panic!("a job's task died");
            })
        };
        assert!(panicking.await.unwrap_err().is_panic());
        assert_eq!(slots.busy(), 1, "the dead task's slot came back");
        drop(b);
        assert_eq!(slots.busy(), 0);
        tokio::time::timeout(Duration::from_secs(5), slots.freed())
            .await
            .unwrap();
    }
}
