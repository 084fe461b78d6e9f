//! Pickup latencies over a rolling window, in bounded memory.
//!
//! Invariants:
//! - Memory does not grow with the rate or the run's length: one histogram of fixed size per
//!   second of the window ([`SLOTS`] of them), reused as the seconds roll over.
//! - A value is kept to three significant figures: below [`EXACT`] microseconds exactly, above
//!   in one of [`SUB_BUCKETS`] buckets per power of two (a relative error under 0.1 %), and
//!   values above [`MAX_MICROS`] count as [`MAX_MICROS`].
//! - A percentile is the midpoint of the bucket holding the nearest-rank value, so it is within
//!   the bucket's width of a recorded value.

/// Values below this many microseconds have a bucket each.
const EXACT: u64 = 2048;
/// Buckets per power of two above [`EXACT`].
const SUB_BUCKETS: u64 = 1024;
/// The largest value kept apart, in microseconds (about 67 s); larger ones count as it.
const MAX_MICROS: u64 = (1 << 26) - 1;
/// Buckets of one histogram: the exact ones, then [`SUB_BUCKETS`] per power of two from 2^11
/// to 2^25.
const BUCKETS: usize = (EXACT + (26 - 11) * SUB_BUCKETS) as usize;
/// Seconds the window can span (the contract's 30 s, with one spare for the current second).
pub(crate) const SLOTS: usize = 31;

/// The bucket of `micros`.
fn bucket_of(micros: u64) -> usize {
    let v = micros.min(MAX_MICROS);
    if v < EXACT {
        return v as usize;
    }
    let exponent = u64::from(63 - v.leading_zeros()); // 11..=25
    let shift = exponent - 10;
    let sub = (v >> shift) - SUB_BUCKETS; // 0..SUB_BUCKETS
    (EXACT + (exponent - 11) * SUB_BUCKETS + sub) as usize
}

/// The smallest value of `bucket` and its width, in microseconds.
fn bounds_of(bucket: usize) -> (u64, u64) {
    let b = bucket as u64;
    if b < EXACT {
        return (b, 1);
    }
    let exponent = (b - EXACT) / SUB_BUCKETS + 11;
    let sub = (b - EXACT) % SUB_BUCKETS;
    let shift = exponent - 10;
    ((SUB_BUCKETS + sub) << shift, 1 << shift)
}

/// One second's histogram.
struct Slot {
    /// The second (since the Unix epoch) it counts; a slot of another second is stale.
    second: u64,
    /// Values per bucket.
    counts: Vec<u32>,
}

/// Percentiles of a window, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Percentiles {
    /// Median.
    pub(crate) p50: f64,
    /// 95th percentile.
    pub(crate) p95: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
}

/// A rolling window of latencies.
pub(crate) struct Window {
    /// One histogram per second, indexed by the second modulo [`SLOTS`].
    slots: Vec<Slot>,
}

impl Window {
    /// An empty window.
    pub(crate) fn new() -> Window {
        Window {
            slots: (0..SLOTS)
                .map(|_| Slot {
                    second: 0,
                    counts: vec![0; BUCKETS],
                })
                .collect(),
        }
    }

    /// Records a latency of `micros` at Unix second `second`.
    pub(crate) fn record(&mut self, second: u64, micros: u64) {
        let slot = &mut self.slots[(second % SLOTS as u64) as usize];
        if slot.second != second {
            slot.counts.fill(0);
            slot.second = second;
        }
        let count = &mut slot.counts[bucket_of(micros)];
        *count = count.saturating_add(1);
    }

    /// Percentiles of the values recorded in the `seconds` seconds up to Unix second `now`
    /// (at most [`SLOTS`]), or `None` when there were none.
    pub(crate) fn percentiles(&self, now: u64, seconds: u64) -> Option<Percentiles> {
        let oldest = now.saturating_sub(seconds.min(SLOTS as u64).saturating_sub(1));
        let mut merged = vec![0u64; BUCKETS];
        for slot in &self.slots {
            if (oldest..=now).contains(&slot.second) {
                for (sum, count) in merged.iter_mut().zip(&slot.counts) {
                    *sum += u64::from(*count);
                }
            }
        }
        let total: u64 = merged.iter().sum();
        if total == 0 {
            return None;
        }
        let at = |q: f64| {
            // Nearest rank: the smallest value with at least q of the values at or below it.
            let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (bucket, count) in merged.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    let (low, width) = bounds_of(bucket);
                    return (low as f64 + (width - 1) as f64 / 2.0) / 1000.0;
                }
            }
            MAX_MICROS as f64 / 1000.0
        };
        Some(Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        })
    }
}
