//! The retry delay policy: exponential with a cap and jitter, from `backon`.
//!
//! Invariants this module keeps:
//! - The delay of attempt `n` is at least `min_delay * 2^(n-1)` (capped) and never above
//!   `max_delay`: every delay is finite, and the attempt bound lives in the database
//!   (`max_attempts`), not here.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// The delay before retrying after failed attempt number `attempt` (from 1).
pub(crate) fn delay(attempt: i32, min_delay: Duration, max_delay: Duration) -> Duration {
    let steps = usize::try_from(attempt.max(1) - 1).unwrap_or(0);
    ExponentialBuilder::default()
        .with_min_delay(min_delay)
        .with_max_delay(max_delay)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(steps)
        .map_or(max_delay, |d| d.min(max_delay))
}

#[cfg(test)]
mod tests {
    use super::delay;
    use std::time::Duration;

    #[test]
    fn delays_grow_with_jitter_and_stay_under_the_cap() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for attempt in 1..=10 {
            let d = delay(attempt, min, max);
            let floor = (min * 2u32.pow(u32::try_from(attempt - 1).unwrap())).min(max);
            assert!(d >= floor, "attempt {attempt}: {d:?} < {floor:?}");
            assert!(d <= max, "attempt {attempt}: {d:?} > {max:?}");
            assert!(d < floor * 2 || d == max, "jitter is under 100%");
        }
        assert!(delay(0, min, max) >= min);
    }
}
