//! `bench depth-target`'s pacing and figures (#26): instead of following the clock, the
//! producers keep the backlog of due jobs at `depth` for the duration, topping it up by bulk
//! enqueues of up to `batch` jobs (the public multi-system harness's depth-target producer, whose
//! bulk is 128 rows per insert).
//!
//! Each producer (see `producers`) loops: count the due jobs over the shape's queues (the
//! saturated mode's bounded count, `saturate::due_jobs`); reserve room for
//! `min(batch, depth − due − reserved)` jobs, where `reserved` counts the jobs every producer has
//! reserved and not yet seen acknowledged; send them in one statement; when there is no room,
//! wait [`DEPTH_TICK`] and count again.
//!
//! Invariants this module keeps:
//! - The backlog stays below `depth + producers × batch`: a reservation counts every job reserved
//!   and not yet acknowledged, and a count whose snapshot predates another producer's commit can
//!   miss at most that producer's one statement. The count stops at that bound, so below it it
//!   is exact.
//! - The depth held is what the counts saw once the producers had `depth` jobs acknowledged (the
//!   first fill is not the steady state), never made up: without a sample it is all zeros, and
//!   a miss.
//! - A median held below [`MISSED_BELOW`] × `depth` is a miss, said as loudly as a missed rate
//!   (`depth_missed`, and [`DepthFigures::warning`] in the text, on stderr and in the report).
//! - The throughput counts the completions within the window (database clock), not the drain of
//!   the backlog left when the producers stop.

use super::config::MISSED_BELOW;
use super::saturate::due_jobs;
use durable_etl::error::Error;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How long a producer waits before counting again when the backlog is full.
const DEPTH_TICK: Duration = Duration::from_millis(5);

/// What the producers of a depth target share: the target, where to count, and the jobs
/// reserved, numbered and acknowledged so far.
#[derive(Debug)]
pub(super) struct TopUp {
    /// Due jobs to keep.
    depth: usize,
    /// The most jobs one statement enqueues (at least 1).
    batch: usize,
    /// The queues the jobs go to, each counted up to `limit`.
    queues: Vec<String>,
    /// The jobs' kind.
    kind: &'static str,
    /// `depth + producers × batch` for each queue: the most a count needs to see.
    limits: Vec<i64>,
    /// Jobs reserved by a producer and not yet acknowledged.
    reserved: AtomicUsize,
    /// The number of the next job.
    numbered: AtomicUsize,
    /// Jobs acknowledged so far.
    acked: AtomicUsize,
}

impl TopUp {
    /// Keeps `depth` due jobs of `kind` over `queues`, topped up `batch` jobs at a time by
    /// `producers` producers.
    pub(super) fn new(
        (depth, batch, producers): (usize, usize, usize),
        queues: Vec<String>,
        kind: &'static str,
    ) -> TopUp {
        let batch = batch.max(1);
        let limit = depth.saturating_add(producers.max(1).saturating_mul(batch));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        TopUp {
            depth,
            batch,
            limits: vec![limit; queues.len()],
            queues,
            kind,
            reserved: AtomicUsize::new(0),
            numbered: AtomicUsize::new(0),
            acked: AtomicUsize::new(0),
        }
    }

    /// Counts the due jobs on `client` (recording the count in `depths` once the first fill is
    /// acknowledged) until there is room, and reserves it: the first job's number and how many
    /// to send. `None` once `stop` has passed.
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn next(
        &self,
        client: &tokio_postgres::Client,
        stop: Option<Instant>,
        depths: &mut Vec<usize>,
    ) -> Result<Option<(usize, usize)>, Error> {
        loop {
            if stop.is_some_and(|stop| Instant::now() >= stop) {
                return Ok(None);
            }
            let due: usize = due_jobs(client, &self.queues, self.kind, &self.limits)
                .await?
                .into_iter()
                .sum();
            if self.acked.load(Ordering::Acquire) >= self.depth {
                depths.push(due);
            }
            let room = |reserved| self.reserve(due, reserved);
            if let Ok(before) =
                self.reserved
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, room)
            {
                let n = room(before).map_or(0, |after| after - before);
                return Ok(Some((self.numbered.fetch_add(n, Ordering::Relaxed), n)));
            }
            tokio::time::sleep(DEPTH_TICK).await;
        }
    }

    /// What is reserved after `reserved` jobs were, with `due` jobs due: `reserved` plus the room
    /// left below the depth, at most one batch; `None` when there is no room.
    fn reserve(&self, due: usize, reserved: usize) -> Option<usize> {
        let room = self.depth.saturating_sub(due.saturating_add(reserved));
        (room > 0).then_some(reserved + room.min(self.batch))
    }

    /// Records that `n` reserved jobs were acknowledged.
    pub(super) fn acknowledged(&self, n: usize) {
        self.acked.fetch_add(n, Ordering::AcqRel);
        self.reserved.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The backlog of due jobs the counts saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Held {
    /// The fewest due jobs a count saw.
    pub(crate) min: usize,
    /// The median count (nearest rank).
    pub(crate) median: usize,
    /// The most due jobs a count saw.
    pub(crate) max: usize,
    /// Counts taken.
    pub(crate) samples: usize,
}

impl Held {
    /// The summary of the counts `depths` (empty: all zero).
    fn of(mut depths: Vec<usize>) -> Held {
        depths.sort_unstable();
        let at = |rank: usize| depths.get(rank).copied().unwrap_or(0);
        Held {
            min: at(0),
            median: at(depths.len().div_ceil(2).saturating_sub(1)),
            max: depths.last().copied().unwrap_or(0),
            samples: depths.len(),
        }
    }
}

/// What a depth target held and achieved.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DepthFigures {
    /// Due jobs asked for (`--depth`).
    pub(crate) depth: usize,
    /// Due jobs the counts saw.
    pub(crate) depth_held: Held,
    /// Whether the median held is below [`MISSED_BELOW`] × `depth`.
    pub(crate) depth_missed: bool,
    /// Producer tasks (`--producers`).
    pub(crate) producers: usize,
    /// The most jobs per statement (`--batch`).
    pub(crate) batch: usize,
    /// Jobs enqueued (acknowledged) before the duration was over.
    pub(crate) offered: usize,
    /// Statements that enqueued them.
    pub(crate) statements: usize,
    /// Seconds the producers kept the backlog (`--duration`).
    pub(crate) window_s: f64,
    /// Jobs that finished within the window (database clock).
    pub(crate) completed_in_window: u64,
    /// `completed_in_window / window_s`: the throughput achieved at this depth.
    pub(crate) window_jobs_per_s: f64,
}

impl DepthFigures {
    /// The figures of `offered` jobs in `statements` statements, kept against `(depth, batch,
    /// producers)` for `window_s` seconds, with the counts `depths`; the window's completions
    /// come later ([`DepthFigures::with_completed`]).
    pub(super) fn new(
        (depth, batch, producers): (usize, usize, usize),
        (offered, statements): (usize, usize),
        window_s: f64,
        depths: Vec<usize>,
    ) -> DepthFigures {
        let held = Held::of(depths);
        DepthFigures {
            depth,
            depth_held: held,
            depth_missed: held.samples == 0 || (held.median as f64) < MISSED_BELOW * depth as f64,
            producers,
            batch,
            offered,
            statements,
            window_s,
            completed_in_window: 0,
            window_jobs_per_s: 0.0,
        }
    }

    /// These figures with `completed` jobs finished within the window.
    pub(crate) fn with_completed(self, completed: u64) -> DepthFigures {
        DepthFigures {
            completed_in_window: completed,
            window_jobs_per_s: if self.window_s > 0.0 {
                completed as f64 / self.window_s
            } else {
                0.0
            },
            ..self
        }
    }

    /// The loud line of a run that did not hold its depth, if it did not.
    pub(crate) fn warning(&self) -> Option<String> {
        let h = &self.depth_held;
        self.depth_missed.then(|| {
            format!(
                "WARNING: held a median of {} of {} due jobs asked (min {}, max {}, {} counts): \
                 the figures describe a shallower backlog than the asked one",
                h.median, self.depth, h.min, h.max, h.samples
            )
        })
    }

    /// The figures as aligned lines of the text report, the warning first.
    pub(crate) fn to_text(&self) -> String {
        let h = &self.depth_held;
        let mut out = self.warning().map(|w| format!("{w}\n")).unwrap_or_default();
        out.push_str(&format!(
            "depth held           min {}  median {}  max {} of {} due jobs asked ({} counts)\n\
             offered              {} jobs in {} statements ({} producer(s), batch {})\n\
             window throughput    {:.0} jobs/s ({} jobs finished within {:.3} s)\n",
            h.min,
            h.median,
            h.max,
            self.depth,
            h.samples,
            self.offered,
            self.statements,
            self.producers,
            self.batch,
            self.window_jobs_per_s,
            self.completed_in_window,
            self.window_s,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_held_is_summarised_by_nearest_rank() {
        assert_eq!(
            Held::of(vec![7, 1, 5, 3]),
            Held {
                min: 1,
                median: 3,
                max: 7,
                samples: 4
            }
        );
        assert_eq!(Held::of(Vec::new()), Held::default());
    }

    #[test]
    fn a_shallow_or_unsampled_backlog_is_a_loud_miss() {
        let kept = DepthFigures::new((100, 10, 2), (500, 50), 2.0, vec![99, 100, 104]);
        assert!(!kept.depth_missed && kept.warning().is_none());
        let kept = kept.with_completed(300);
        assert_eq!(kept.window_jobs_per_s, 150.0);
        assert!(kept
            .to_text()
            .starts_with("depth held           min 99  median 100"));
        let shallow = DepthFigures::new((100, 10, 2), (500, 50), 2.0, vec![10, 20, 100]);
        assert!(shallow.depth_missed);
        assert!(shallow
            .to_text()
            .starts_with("WARNING: held a median of 20 of 100 due jobs asked"));
        let unsampled = DepthFigures::new((100, 10, 2), (0, 0), 2.0, Vec::new());
        assert!(unsampled.depth_missed && unsampled.warning().is_some());
    }

    #[test]
    fn reservations_leave_room_for_what_is_due_and_in_flight() {
        let top_up = TopUp::new((10, 4, 2), vec!["default".to_owned()], "noop");
        assert_eq!(top_up.limits, vec![18]);
        // 3 due and 4 reserved leave room for 3; 0 due and none reserved, for one batch of 4;
        // 6 due and 4 reserved, for none.
        assert_eq!(top_up.reserve(3, 4), Some(7));
        assert_eq!(top_up.reserve(0, 0), Some(4));
        assert_eq!(top_up.reserve(6, 4), None);
        top_up.reserved.store(4, Ordering::Relaxed);
        top_up.acknowledged(4);
        assert_eq!(top_up.reserved.load(Ordering::Relaxed), 0);
        assert_eq!(top_up.acked.load(Ordering::Relaxed), 4);
    }
}
