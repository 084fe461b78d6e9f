//! What one recovery pass did ([`Recovered`]): a leaf, so the replica's counters can take a
//! pass's figures without importing recovery itself.
//!
//! Invariant this module keeps: a pass's figures only count; they decide nothing.

use std::time::Duration;

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Rows recovered because their lease expired.
    pub expired: u64,
    /// Rows recovered because their owner was dead.
    pub dead_owner: u64,
    /// Of those, rows that ended instead of going back to `pending` (`lease_expired_exhausted`,
    /// or `cancelled` at their owner's request).
    pub exhausted: u64,
    /// When the first running row of an owner whose locks are gone but whose beats are not yet
    /// silent for its silence becomes reclaimable, from now: when to judge again.
    pub judge_again_in: Option<Duration>,
}

impl Recovered {
    /// Whether the pass recovered any row.
    pub fn any(&self) -> bool {
        self.expired + self.dead_owner > 0
    }
}
