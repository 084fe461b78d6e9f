//! The timers the roles of a replica share: tickers that never burst, jittered periods, and
//! waits on optional deadlines and signals.
//!
//! Invariants this module keeps:
//! - A ticker fires at once, then every period, and never catches up in a burst after a stall.
//! - A jittered period stays within ±10% of the period.

use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

/// An interval timer that fires at once, then every `period`, without bursts after a stall.
pub(crate) fn ticker(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

/// `period` with ±10% jitter, so replicas do not poll in lockstep.
pub(crate) fn jittered(period: Duration) -> Duration {
    period.mul_f64(0.9 + fastrand::f64() * 0.2)
}

/// Waits for a permit of `signal`; never resolves when there is no signal (no session).
pub(crate) async fn wait(signal: Option<&Notify>) {
    match signal {
        Some(signal) => signal.notified().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; never resolves when there is none.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::jittered;
    use std::time::Duration;

    #[test]
    fn the_poll_jitters_within_ten_percent() {
        let period = Duration::from_secs(1);
        for _ in 0..1000 {
            let d = jittered(period);
            assert!(
                d >= Duration::from_millis(900) && d <= Duration::from_millis(1100),
                "{d:?}"
            );
        }
    }
}
