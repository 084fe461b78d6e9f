//! How a bench run spreads its `noop` jobs over queues and priorities, and how its replicas serve
//! and cap those queues: the flags `--queues`, `--hot-queue`, `--weights`, `--priority-mix`,
//! `--cap`, `--keys`, `--key-cap` and `--job-ms`.
//!
//! Invariants this module keeps:
//! - The default shape (one queue, priority 0, weight 1, uncapped, no pause) is the bench as it
//!   was before these flags: every job in [`DEFAULT_QUEUE`], and the replicas are started without
//!   `--queues`, so a baseline run measures exactly what earlier runs measured.
//! - Job `i`'s queue and priority are functions of `i` alone: with `N` queues job `i` goes to
//!   queue `i mod N` (so the queues' counts differ by at most one), with weights each queue gets
//!   its weight's share of every `sum of the weights` jobs (so queues drained at their weights'
//!   ratio run out together), with a hot queue every job goes to the first, and the priority mix
//!   repeats every `sum of its percentages` jobs. With `--keys N`, job `i`'s concurrency key is
//!   `k{z}`, `z` drawn from a Zipf distribution of exponent 1 over the `N` keys by a hash of `i`
//!   ([`zipf_index`]): `k0`, the hot key, carries `1 / H(N)` of the jobs (13.4 % for 1,000).
//! - Every weight, priority and cap is checked against the library's own ranges when the flags
//!   are parsed, before any database is created.

use durable_etl::queue::{CAP_RANGE, DEFAULT_QUEUE, PRIORITY_RANGE, WEIGHT_RANGE};
use serde::Serialize;

/// The most queues a bench spreads its jobs over.
pub(crate) const QUEUES_MAX: usize = 1000;

/// The bench's queues and priorities (see the module's invariants).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Shape {
    /// Queues the jobs are spread over (1: [`DEFAULT_QUEUE`] only).
    pub(crate) queues: usize,
    /// Every job goes to the first queue; the others stay empty but are served.
    pub(crate) hot_queue: bool,
    /// Each queue's weight in the replicas' `--queues` (empty: every queue weight 1).
    pub(crate) weights: Vec<u32>,
    /// `(percent, priority)` pairs of the jobs' priorities (empty: every job priority 0).
    pub(crate) priority_mix: Vec<(u32, i16)>,
    /// The cap set on every queue before the replicas start (`None`: uncapped).
    pub(crate) cap: Option<i32>,
    /// How long each `noop` job pauses in its compute phase, in milliseconds (0: none).
    pub(crate) job_ms: u64,
    /// Every `noop` job then fails permanently (its payload's `fail`): a burn-down of failing
    /// jobs, each leaving its diagnosis and its dead letter.
    pub(crate) fail: bool,
    /// Concurrency keys the jobs are spread over, Zipf-distributed (0: none).
    pub(crate) keys: usize,
    /// The key cap set on every queue before the replicas start (`None`: none).
    pub(crate) key_cap: Option<i32>,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            queues: 1,
            hot_queue: false,
            weights: Vec::new(),
            priority_mix: Vec::new(),
            cap: None,
            job_ms: 0,
            fail: false,
            keys: 0,
            key_cap: None,
        }
    }
}

impl Shape {
    /// Whether this is the default shape (see the module's invariants).
    pub(crate) fn is_default(&self) -> bool {
        *self == Shape::default()
    }

    /// The queues' names: [`DEFAULT_QUEUE`] alone for one unweighted queue, else `q0`, `q1`, ….
    pub(crate) fn names(&self) -> Vec<String> {
        if self.queues == 1 && self.weights.is_empty() {
            return vec![DEFAULT_QUEUE.to_owned()];
        }
        (0..self.queues).map(|i| format!("q{i}")).collect()
    }

    /// Queue `q`'s weight.
    pub(crate) fn weight(&self, q: usize) -> u32 {
        self.weights.get(q).copied().unwrap_or(1)
    }

    /// The replicas' `--queues` value (every queue, with its weight), or `None` for the default
    /// shape's single queue, which replicas serve without the flag.
    pub(crate) fn served(&self) -> Option<String> {
        let names = self.names();
        if names.len() == 1 && names[0] == DEFAULT_QUEUE {
            return None;
        }
        let served: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(q, name)| format!("{name}:{}", self.weight(q)))
            .collect();
        Some(served.join(","))
    }

    /// The index of job `i`'s queue among [`Shape::names`].
    pub(crate) fn queue_of(&self, i: usize) -> usize {
        if self.hot_queue {
            return 0;
        }
        let total: usize = self.weights.iter().map(|w| *w as usize).sum();
        if total == 0 {
            return i % self.queues.max(1);
        }
        let mut at = i % total;
        for (q, w) in self.weights.iter().enumerate() {
            if at < *w as usize {
                return q;
            }
            at -= *w as usize;
        }
        0
    }

    /// Job `i`'s priority.
    pub(crate) fn priority_of(&self, i: usize) -> i16 {
        let total: u32 = self.priority_mix.iter().map(|m| m.0).sum();
        if total == 0 {
            return 0;
        }
        let mut at = u32::try_from(i % total as usize).unwrap_or(0);
        for (percent, priority) in &self.priority_mix {
            if at < *percent {
                return *priority;
            }
            at -= percent;
        }
        0
    }

    /// The shape in words, for the report's first line (empty for the default shape).
    pub(crate) fn describe(&self) -> String {
        if self.is_default() {
            return String::new();
        }
        let mut text = format!(
            ", queues {}{}",
            self.served().unwrap_or_else(|| DEFAULT_QUEUE.to_owned()),
            if self.hot_queue { " (hot: q0)" } else { "" }
        );
        if !self.priority_mix.is_empty() {
            let mix: Vec<String> = self
                .priority_mix
                .iter()
                .map(|(pct, p)| format!("{pct}%:p{p}"))
                .collect();
            text.push_str(&format!(", priorities {}", mix.join(",")));
        }
        if let Some(cap) = self.cap {
            text.push_str(&format!(", cap {cap}"));
        }
        if self.keys > 0 {
            text.push_str(&format!(", {} Zipf keys", self.keys));
        }
        if let Some(cap) = self.key_cap {
            text.push_str(&format!(", key cap {cap}"));
        }
        if self.job_ms > 0 {
            text.push_str(&format!(", jobs of {} ms", self.job_ms));
        }
        if self.fail {
            text.push_str(", every job failing");
        }
        text
    }

    /// The `noop` payload of every job: `{}`, with a pause of [`Shape::job_ms`] if any, and
    /// asking the job to fail if [`Shape::fail`].
    pub(crate) fn payload(&self) -> serde_json::Value {
        let mut payload = serde_json::Map::new();
        if self.job_ms > 0 {
            payload.insert("pause_ms".into(), self.job_ms.into());
        }
        if self.fail {
            payload.insert("fail".into(), true.into());
        }
        serde_json::Value::Object(payload)
    }

    /// The queues, priorities and concurrency keys of jobs `first..first + n`, as the insert
    /// takes them.
    pub(crate) fn columns(&self, first: usize, n: usize) -> Columns {
        let names = self.names();
        let (queues, priorities) = (first..first + n)
            .map(|i| (names[self.queue_of(i)].clone(), self.priority_of(i)))
            .unzip();
        (queues, priorities, self.keys_of(first, n))
    }

    /// The concurrency keys of jobs `first..first + n` (all `None` without `--keys`).
    pub(crate) fn keys_of(&self, first: usize, n: usize) -> Vec<Option<String>> {
        (first..first + n)
            .map(|i| (self.keys > 0).then(|| format!("k{}", zipf_index(self.keys, i))))
            .collect()
    }
}

/// The columns of an insert of jobs: their queues, priorities and concurrency keys.
pub(crate) type Columns = (Vec<String>, Vec<i16>, Vec<Option<String>>);

/// The most concurrency keys `--keys` may name.
pub(crate) const KEYS_MAX: usize = 100_000;

/// Job `i`'s key among `n`, by a Zipf distribution of exponent 1 (key `z` with probability
/// `1 / ((z + 1) H(n))`): a hash of `i` (SplitMix64) picks a point of the cumulative sums.
pub(crate) fn zipf_index(n: usize, i: usize) -> usize {
    let mut x = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let harmonic: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
    let mut left = (x >> 11) as f64 / (1u64 << 53) as f64 * harmonic;
    for z in 0..n {
        left -= 1.0 / (z + 1) as f64;
        if left < 0.0 {
            return z;
        }
    }
    n.saturating_sub(1)
}

/// Parses `--keys`: 2 to [`KEYS_MAX`] keys.
///
/// # Errors
/// A fixed message naming the rule broken.
pub(crate) fn parse_keys(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|n| (2..=KEYS_MAX).contains(n))
        .ok_or_else(|| format!("the keys must be a number from 2 to {KEYS_MAX}"))
}

/// The weights `--weights` names, one per queue (a type of its own, so clap reads the flag as
/// one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Weights(pub(crate) Vec<u32>);

/// The `(percent, priority)` pairs `--priority-mix` names (a type of its own, as [`Weights`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PriorityMix(pub(crate) Vec<(u32, i16)>);

/// Parses `--weights`: comma-separated weights, one per queue, at least two, each in
/// [`WEIGHT_RANGE`].
///
/// # Errors
/// A fixed message naming the rule broken.
pub(crate) fn parse_weights(text: &str) -> Result<Weights, String> {
    let weights = text
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<u32>()
                .ok()
                .filter(|w| WEIGHT_RANGE.contains(w))
        })
        .collect::<Option<Vec<u32>>>()
        .ok_or("each weight must be a whole number from 1 to 1000")?;
    if !(2..=QUEUES_MAX).contains(&weights.len()) {
        return Err("--weights needs one weight per queue, for 2 to 1000 queues".to_owned());
    }
    Ok(Weights(weights))
}

/// Parses `--priority-mix`: comma-separated `percent:priority` pairs (`90:0,10:9`), each percent
/// at least 1, each priority in [`PRIORITY_RANGE`], the percents adding up to 100.
///
/// # Errors
/// A fixed message naming the rule broken.
pub(crate) fn parse_priority_mix(text: &str) -> Result<PriorityMix, String> {
    let mix = text
        .split(',')
        .map(|pair| {
            let (percent, priority) = pair.trim().split_once(':')?;
            let percent = percent.trim().parse::<u32>().ok().filter(|p| *p > 0)?;
            let priority = priority
                .trim()
                .parse::<i16>()
                .ok()
                .filter(|p| PRIORITY_RANGE.contains(p))?;
            Some((percent, priority))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("expected percent:priority pairs such as 90:0,10:9, priorities 0 to 9")?;
    if mix.iter().map(|m| m.0).sum::<u32>() != 100 {
        return Err("the priority mix's percents must add up to 100".to_owned());
    }
    Ok(PriorityMix(mix))
}

/// Parses `--cap`: a number in [`CAP_RANGE`].
///
/// # Errors
/// A fixed message naming the range.
pub(crate) fn parse_cap(text: &str) -> Result<i32, String> {
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|c| CAP_RANGE.contains(c))
        .ok_or_else(|| "a cap must be a number from 1 to 10000".to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn zipf_keys_give_the_hot_key_its_share_and_every_job_the_same_key_each_time() {
        let shape = super::Shape {
            keys: 1000,
            ..super::Shape::default()
        };
        let hot = (0..20_000)
            .filter(|&i| super::zipf_index(1000, i) == 0)
            .count();
        // 1 / H(1000) = 13.4 % of 20,000 jobs: 2,679.
        assert!((2_400..2_950).contains(&hot), "{hot}");
        assert_eq!(shape.keys_of(7, 2), shape.keys_of(7, 2));
        assert!(shape.keys_of(0, 500).iter().all(Option::is_some));
        let rare = (0..20_000)
            .filter(|&i| super::zipf_index(1000, i) >= 500)
            .count();
        assert!(rare < 2_000, "the tail half carries about 9 %: {rare}");
        assert!(super::Shape::default()
            .keys_of(0, 3)
            .iter()
            .all(Option::is_none));
        assert_eq!(super::parse_keys("1000"), Ok(1000));
        assert!(super::parse_keys("1").is_err() && super::parse_keys("x").is_err());
    }

    use super::*;

    #[test]
    fn the_default_shape_is_the_bench_before_queues() {
        let shape = Shape::default();
        assert!(shape.is_default());
        assert_eq!(shape.names(), vec![DEFAULT_QUEUE.to_owned()]);
        assert_eq!(shape.served(), None);
        assert_eq!(
            shape.columns(0, 3),
            (vec!["default".into(); 3], vec![0; 3], vec![None; 3])
        );
        assert_eq!(shape.payload(), serde_json::json!({}));
    }

    #[test]
    fn jobs_spread_equally_over_the_queues_or_all_into_the_hot_one() {
        let spread = Shape {
            queues: 100,
            ..Shape::default()
        };
        let (queues, _, _) = spread.columns(0, 1000);
        for q in spread.names() {
            assert_eq!(queues.iter().filter(|x| **x == q).count(), 10, "{q}");
        }
        assert_eq!(spread.served().unwrap().split(',').count(), 100);
        assert!(spread.served().unwrap().starts_with("q0:1,q1:1,"));
        let hot = Shape {
            hot_queue: true,
            ..spread
        };
        let (queues, _, _) = hot.columns(7, 500);
        assert!(queues.iter().all(|q| q == "q0"));
        // Every queue is still served, the 99 empty ones included.
        assert_eq!(hot.served().unwrap().split(',').count(), 100);
    }

    #[test]
    fn weights_name_one_queue_each_and_reach_the_replicas() {
        let weights = parse_weights("3,1").unwrap().0;
        let shape = Shape {
            queues: weights.len(),
            weights,
            ..Shape::default()
        };
        assert_eq!(shape.served().as_deref(), Some("q0:3,q1:1"));
        // The jobs are spread by weight: 3 of every 4 into q0.
        let (queues, _, _) = shape.columns(0, 400);
        assert_eq!(queues.iter().filter(|q| *q == "q0").count(), 300);
        for bad in ["3", "3,0", "3,x", "1001,1", ""] {
            assert!(parse_weights(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_priority_mix_repeats_its_percentages_exactly() {
        let shape = Shape {
            priority_mix: parse_priority_mix("90:0,10:9").unwrap().0,
            ..Shape::default()
        };
        let (_, priorities, _) = shape.columns(0, 1000);
        assert_eq!(priorities.iter().filter(|p| **p == 9).count(), 100);
        assert_eq!(priorities.iter().filter(|p| **p == 0).count(), 900);
        for bad in ["90:0", "90:0,10:10", "90:0,0:9,10:9", "a:b", "100"] {
            assert!(parse_priority_mix(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cap("64"), Ok(64));
        assert!(parse_cap("0").is_err() && parse_cap("10001").is_err());
    }
}
