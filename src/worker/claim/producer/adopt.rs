//! The claim loop's side of adoption ([`crate::worker::claim::claimer::adopt`]): a claim that
//! failed may have committed on the server with its reply lost, so the loop adopts before it
//! claims again.
//!
//! Invariants this module keeps:
//! - After a failed claim, the next statement the loop sends on its claim sessions is an
//!   adoption, and the wake that asked for a claim meanwhile is kept for the claim after it; an
//!   adoption that fails is sent again after [`CLAIM_RETRY_DELAY`], still before any claim.
//! - Adopted jobs are held like claimed ones, their lease clocks running from when the adoption
//!   was sent; at shutdown they are released with the buffered jobs.

use super::{Producer, CLAIM_RETRY_DELAY};
use crate::db;
use crate::error::Error;
use crate::worker::claim::claimer;
use crate::worker::lease::ClaimedJob;
use crate::worker::stats::ClaimReason;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

/// What an adoption found: when it was sent, and the jobs with their queues.
pub(super) type Adopted = (Instant, Result<Vec<(ClaimedJob, String)>, Error>);

/// The adoption in flight.
pub(super) type Adopting = Pin<Box<dyn Future<Output = Adopted> + Send>>;

impl Producer {
    /// Sends the adoption of what failed claims may have taken, in place of the claim `why`
    /// asked for, which follows it.
    pub(super) fn send_adoption(&mut self, why: ClaimReason) {
        self.orphans = false;
        self.wake.join_again(why);
        self.adopting = Some(self.adoption());
    }

    /// The adoption, on a claim session, of every row of this replica's failed claims.
    pub(super) fn adoption(&self) -> Adopting {
        let shared = Arc::clone(&self.shared);
        let held = self.held.claims();
        let sent = Instant::now();
        Box::pin(async move {
            let adopted = async {
                let conn = db::checkout(&shared.claim_pool).await?;
                shared.stats.record_round_trips(1);
                let lease = shared.config.lease;
                let adopt = claimer::adopt(
                    conn.client(),
                    shared.owner_id(),
                    &shared.orphans,
                    held,
                    lease,
                );
                db::bounded(shared.statement_bound, adopt).await
            };
            (sent, adopted.await)
        })
    }

    /// The adoption in flight came back: holds what it took and starts what slots allow;
    /// returns the claim that waited for it, unless it failed (it is sent again soon).
    pub(super) fn adopted(&mut self, adopted: Adopted) -> Option<ClaimReason> {
        self.adopting = None;
        self.take_adopted(adopted, true);
        self.start_waiting();
        if self.orphans {
            None
        } else {
            self.wake.again.take()
        }
    }

    /// Holds what an adoption took (answering for its queue's permit when `permits`); one that
    /// failed is sent again soon, before any claim.
    pub(super) fn take_adopted(&mut self, (sent, adopted): Adopted, permits: bool) {
        match adopted {
            Ok(jobs) => {
                if !jobs.is_empty() {
                    tracing::info!(
                        adopted = jobs.len(),
                        "adopted the jobs of a lost claim reply"
                    );
                }
                self.shared.stats.record_adopted(jobs.len());
                for (job, queue) in jobs {
                    let queue = (permits && job.held_permit).then_some(queue);
                    self.hold(job, sent, queue);
                }
            }
            Err(e) => {
                tracing::warn!(code = %e.code(), "adoption failed");
                self.orphans = true;
                let retry = Instant::now() + CLAIM_RETRY_DELAY;
                self.wake.next_due = Some(self.wake.next_due.map_or(retry, |due| due.min(retry)));
            }
        }
    }
}
