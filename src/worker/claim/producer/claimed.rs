//! A claim that came back to the claim loop, and what the loop reads off it.
//!
//! Invariants this module keeps:
//! - A claim that was not sent (an early retry of held barriers, none of them free) asked
//!   nothing: it is neither full nor short, and settles no queue.
//! - A claim settles, with the tries sent before it, only the queues it asked, and only when it
//!   succeeded.

use crate::error::Error;
use crate::worker::claim::queues::took_per_ask;
use crate::worker::lease::ClaimedJob;
use crate::worker::liveness::presence::{Answer, Ticket};
use crate::worker::stats::ClaimReason;
use tokio::time::Instant;

/// A claim that came back.
pub(super) struct Claimed {
    /// Why it was sent.
    pub(super) why: ClaimReason,
    /// How many jobs it asked of each queue.
    pub(super) asks: Vec<(String, usize)>,
    /// Whether it was sent (an early retry of held barriers claims only once one of them is
    /// free).
    pub(super) went: bool,
    /// When it was sent (the claimed jobs' lease clocks run from then).
    pub(super) sent: Instant,
    /// The claimed jobs, or why the claim failed.
    pub(super) jobs: Result<Vec<ClaimedJob>, Error>,
    /// The presence change sent before it, if any.
    pub(super) ticket: Ticket,
    /// What that change answered.
    pub(super) answer: Answer,
    /// The permits this replica's completions freed that it answers for
    /// ([`crate::worker::claim::freed`]).
    pub(super) freed: Vec<(String, usize)>,
    /// What the claim said of its capped asks ([`crate::worker::claim::claimer::Claim::left_free`]).
    pub(super) left_free: Vec<(usize, Option<bool>)>,
}

impl Claimed {
    /// How many jobs it took of each ask, by position (none when it failed).
    pub(super) fn took(&self) -> Vec<usize> {
        self.jobs
            .as_ref()
            .map_or_else(|_| Vec::new(), |jobs| took_per_ask(self.asks.len(), jobs))
    }

    /// Whether it came back full: it was sent and took all it asked, or it failed (the replica
    /// then claims again soon, as after a full claim).
    pub(super) fn full(&self) -> bool {
        let asked: usize = self.asks.iter().map(|a| a.1).sum();
        self.went && self.jobs.as_ref().map_or(true, |j| j.len() == asked)
    }

    /// The queues it asked, when it was sent and succeeded: the only ones the tries sent before
    /// it may settle.
    pub(super) fn asked_queues(&self) -> Vec<String> {
        match (&self.jobs, self.went) {
            (Ok(_), true) => self.asks.iter().map(|(q, _)| q.clone()).collect(),
            _ => Vec::new(),
        }
    }
}
