//! How the producer lets go of what it holds: the drain at shutdown (running jobs finish within
//! their grace period, the rest stay held to be released), the release of buffered jobs that
//! waited too long for a slot, and the wakes it owes the other replicas for permits its
//! completions freed and it does not claim again ([`crate::worker::claim::freed`]).
//!
//! Invariants this module keeps:
//! - A draining replica claims nothing, so every permit its completions free while it drains is
//!   answered by a wake of the waiting replicas (before each wait for a task, and once at the
//!   end).
//! - A wake sent from the claim loop runs on a task of its own: the loop never waits for it.
//! - What a lost claim reply left is adopted before the held jobs are released, an adoption
//!   that fails being sent again (up to [`DRAIN_ADOPTIONS`] in all), so a replica that stops
//!   right after a cut leaves none of its jobs `running` for recovery.

use super::{Producer, CLAIM_RETRY_DELAY};
use crate::shutdown::{Shutdown, Stage};
use crate::worker::claim::dispatch::{self, leave};
use crate::worker::complete::give_back;
use crate::worker::lease::Lease;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How many adoptions a draining replica sends at most (the one in flight included) for what a
/// lost claim reply left, each after the last one failed.
const DRAIN_ADOPTIONS: usize = 4;

impl Producer {
    /// Lets running jobs finish within the grace period (none when another process took the
    /// owner id, or once a second signal asks to stop immediately), then aborts the rest; their
    /// claims stay held, to be released.
    pub(crate) async fn drain(&mut self, shutdown: &mut Shutdown, owner_id_taken: bool) {
        tracing::info!(
            running = self.tasks.len(),
            buffered = self.buffer.len(),
            "draining"
        );
        // What a claim in flight takes is held like the buffered jobs: never started now, it is
        // released with them.
        if let Some(claim) = self.claiming.take() {
            let claimed = claim.await;
            let answer = claimed.answer.as_ref();
            let (now, stats) = (Instant::now(), &self.shared.stats);
            self.presence
                .after(&claimed.ticket, answer, &[], true, now, stats);
            for job in claimed.jobs.into_iter().flatten() {
                self.hold(job, claimed.sent, None);
            }
        }
        // So is what a lost claim reply left, adopted now to be released. An adoption that fails
        // (its reply lost too) is sent again, up to DRAIN_ADOPTIONS in all, the one in flight
        // included; after that the jobs come back when their leases expire.
        let mut adoption = self.adopting.take();
        for attempt in 0..DRAIN_ADOPTIONS {
            let sent = match adoption.take() {
                Some(in_flight) => in_flight,
                None if self.orphans => {
                    if attempt > 0 {
                        tokio::time::sleep(CLAIM_RETRY_DELAY).await;
                    }
                    self.adoption()
                }
                None => break,
            };
            self.orphans = false;
            self.take_adopted(sent.await, false);
        }
        // A replica whose owner id another process took leaves the row alone: it is that
        // process's now.
        if self.presence.registered() && !owner_id_taken {
            leave(&self.shared).await;
        }
        self.buffer.drain().for_each(drop);
        let grace = tokio::time::sleep(if owner_id_taken {
            Duration::ZERO
        } else {
            self.shared.config.shutdown_grace
        });
        tokio::pin!(grace);
        while !self.tasks.is_empty() {
            // A draining replica claims nothing: the permits it freed are the others'.
            if !self.freed.take().is_empty() {
                dispatch::wake_waiting(&self.shared).await;
            }
            tokio::select! {
                () = &mut grace => break,
                () = shutdown.reached(Stage::Immediate) => break,
                Some(done) = self.tasks.join_next() => self.finish_task(done),
            }
        }
        self.tasks.abort_all();
        while let Some(done) = self.tasks.join_next().await {
            self.finish_task(done);
        }
        if !self.freed.take().is_empty() {
            dispatch::wake_waiting(&self.shared).await;
        }
    }

    /// Wakes the waiting replicas, on a task of its own, for the permits this replica freed and
    /// will not claim again now ([`freed`]).
    pub(super) fn wake_for_freed(&mut self) {
        if !self.freed.take().is_empty() {
            self.spawn_wake();
        }
    }

    /// Wakes the waiting replicas on a task of its own, so the claim loop never waits for it.
    pub(super) fn spawn_wake(&self) {
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move { dispatch::wake_waiting(&shared).await });
    }

    /// Releases the buffered jobs that waited [`HOLD`](crate::worker::claim::prefetch::HOLD) for a slot
    /// (attempt not charged), so that another replica may run them.
    pub(super) async fn release_overdue(&mut self) {
        let overdue: Vec<Lease> = self
            .buffer
            .take_overdue(Instant::now())
            .into_iter()
            .map(|waiting| waiting.job.lease())
            .collect();
        for lease in &overdue {
            self.held.remove(lease.claim_id);
        }
        // They waited in the buffer: none started an attempt, so none is recorded.
        match give_back::release_leases(&self.shared, &overdue, &[]).await {
            Ok(n) => tracing::debug!(released = n, "released jobs that waited for a slot"),
            // Unreleased, they are no longer renewed: their leases expire and recovery returns
            // them.
            Err(e) => tracing::warn!(code = %e.code(), "release of waiting jobs failed"),
        }
    }
}
