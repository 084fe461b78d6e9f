//! How a handler learns that its replica stopped trusting the lease of the job it runs.
//!
//! Invariant this module keeps: the signal only ever goes from trusted to lost, never back.

/// Tells a job's handler that its replica no longer trusts the claim's lease: its renewals or
/// its beats failed for too long (a lost database, a cut of every connection), or the heartbeat
/// found the lease gone. It fires before recovery may give the job to another replica, so work
/// that stops when it fires never overlaps with the next attempt's. The handler's own future is
/// dropped at its next `.await` once it fires; watch it in work the handler started elsewhere
/// (a spawned task, a blocking thread, a remote call) and stop that work too. Nothing the job
/// does after it fires commits.
#[derive(Debug, Clone, Default)]
pub struct LeaseLost(tokio_util::sync::CancellationToken);

impl LeaseLost {
    /// Whether the lease is no longer trusted.
    pub fn is_lost(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the lease is no longer trusted (at once if it already is not).
    pub async fn lost(&self) {
        self.0.cancelled().await;
    }

    /// The token the replica cancels when it stops trusting the lease.
    pub(crate) fn token(&self) -> tokio_util::sync::CancellationToken {
        self.0.clone()
    }
}

/// Two signals are equal when they say the same: both lost, or both trusted.
impl PartialEq for LeaseLost {
    fn eq(&self, other: &LeaseLost) -> bool {
        self.is_lost() == other.is_lost()
    }
}

impl Eq for LeaseLost {}
