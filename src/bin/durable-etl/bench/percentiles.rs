//! Nearest-rank percentiles of a sample, the one summary every latency figure of the bench uses.
//!
//! Invariant: a percentile is always a value of the sample (nearest rank, no interpolation), and
//! an empty sample gives all zeros with `samples` 0.

use serde::Serialize;

/// Percentiles of a latency sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Percentiles {
    /// Median.
    pub(crate) p50: f64,
    /// 95th percentile.
    pub(crate) p95: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Largest.
    pub(crate) max: f64,
    /// Values in the sample.
    pub(crate) samples: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `sample` (empty: all zero).
    pub(crate) fn of(mut sample: Vec<f64>) -> Percentiles {
        if sample.is_empty() {
            return Percentiles::default();
        }
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * sample.len() as f64).ceil() as usize;
            sample[rank.clamp(1, sample.len()) - 1]
        };
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
            samples: sample.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sample: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = Percentiles::of(sample);
        assert_eq!(
            (p.p50, p.p95, p.p99, p.p999, p.max),
            (500.0, 950.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }
}
