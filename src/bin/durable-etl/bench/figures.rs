//! The figures of #25's targets, read after a run from the ended jobs and the replicas' counters:
//! completions per queue over a window, discovery claims, waits by priority and how far any job
//! was overtaken by one with a later deadline, and, for a capped queue, how many ran at once and
//! how soon a freed permit started the next job.
//!
//! Invariants this module keeps:
//! - Every figure comes from the database's own timestamps and columns (`etl_jobs`), the handler
//!   starts the replicas recorded, or the replicas' metrics; none from what the bench asked for.
//! - The per-queue counts of the window add up to the window's succeeded jobs, and every queue of
//!   the shape is listed, an empty one with 0.
//! - Pure functions ([`overtaken_ms`], [`max_running`], [`permit_to_start_ms`]) do the arithmetic,
//!   so their definitions are tested without a database.

use super::percentiles::Percentiles;
use super::shape::Shape;
use durable_etl::error::Error;
use serde::Serialize;
use std::collections::HashMap;

/// The replicas' poll interval: the bench starts them with `work`'s default.
const POLL_INTERVAL_S: f64 = 1.0;

/// One queue's completions.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueCount {
    /// The queue.
    pub(crate) queue: String,
    /// Its weight in the replicas' `--queues`.
    pub(crate) weight: u32,
    /// Its jobs that succeeded within the window.
    pub(crate) in_window: u64,
    /// Its jobs that succeeded in the whole run.
    pub(crate) succeeded: u64,
    /// Saturated only: the fewest due jobs it had at a top-up (0: it ran dry in the window).
    pub(crate) fewest_due: Option<u64>,
}

/// The waits of one priority's jobs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PriorityWait {
    /// The priority.
    pub(crate) priority: i16,
    /// Due time → claim (database clock), in milliseconds.
    pub(crate) wait_ms: Percentiles,
}

impl QueueFigures {
    /// The figures as aligned lines, percentiles written by `p`.
    pub(crate) fn to_text(&self, p: impl Fn(&Percentiles) -> String) -> String {
        let mut out = format!(
            "window               {:.0} jobs/s over {:.3} s\n",
            self.window_jobs_per_s, self.window_s
        );
        let busy: Vec<String> = self
            .per_queue
            .iter()
            .filter(|q| q.succeeded > 0)
            .take(8)
            .map(|q| match q.fewest_due {
                Some(low) => format!(
                    "{}:{} {} (fewest due {low})",
                    q.queue, q.weight, q.in_window
                ),
                None => format!("{}:{} {}", q.queue, q.weight, q.in_window),
            })
            .collect();
        let idle = self.per_queue.iter().filter(|q| q.succeeded == 0).count();
        out.push_str(&format!(
            "per queue (window)   {}{} ({} queues without jobs)\n",
            busy.join("  "),
            if self.per_queue.len() - idle > 8 {
                "  ..."
            } else {
                ""
            },
            idle
        ));
        out.push_str(&format!(
            "discovery claims     {} ({:.2} per replica per poll interval)\n\
             live-row updates     {:.3} per job\n",
            self.discovery_claims,
            self.discovery_claims_per_replica_per_poll,
            self.live_row_updates_per_job
        ));
        for wait in &self.priorities {
            out.push_str(&format!(
                "wait, priority {}     {}\n",
                wait.priority,
                p(&wait.wait_ms)
            ));
        }
        if let (Some(bound), Some(overtaken)) = (self.priority_bound_ms, self.overtaken_max_ms) {
            out.push_str(&format!(
                "priorities           least urgent bound {bound:.0} ms; passed by a later deadline at most {overtaken:.3} ms; aging writes {}\n",
                self.aging_writes.unwrap_or(0)
            ));
        }
        if let Some(cap) = &self.cap {
            out.push_str(&format!(
                "{:<21}at most {} running; permit->start {}{}\n",
                format!("cap {}", cap.cap),
                cap.max_running,
                p(&cap.permit_to_start_ms),
                cap.cap_bound_jobs_per_s
                    .map_or(String::new(), |b| format!("; cap / job time {b:.0} jobs/s"))
            ));
        }
        out
    }
}

/// What a capped queue did.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CapFigures {
    /// The cap of every queue.
    pub(crate) cap: i32,
    /// The most jobs of one queue between their handler's start (recorded by its replica, after
    /// the claim that took the permit committed) and the start of the statement that completed
    /// them (before the commit that freed it), at once: each such span lies inside its permit's
    /// holding, so this never exceeds the cap while the cap holds. (The claim's own timestamp is
    /// its statement's start, before its snapshot: spans from it overlap by up to a claim's
    /// planning and lock time, so they would not prove anything.)
    pub(crate) max_running: usize,
    /// The `k`-th handler start of a queue after the `(k - cap)`-th completion of that queue
    /// (the completion's `finished_at`, before its commit, so an upper bound), in milliseconds:
    /// while the queue has due jobs, how soon a freed permit starts the next job.
    pub(crate) permit_to_start_ms: Percentiles,
    /// `cap ÷ job time` in jobs/s, summed over the queues with jobs (absent without `--job-ms`).
    pub(crate) cap_bound_jobs_per_s: Option<f64>,
}

/// The queue figures of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueFigures {
    /// Seconds the window spans (database clock): in burn-down, first claim → the last
    /// completion of the queue that ran out first (every queue had work throughout); in
    /// `saturated`, the saturated span.
    pub(crate) window_s: f64,
    /// Jobs that succeeded within the window, per second.
    pub(crate) window_jobs_per_s: f64,
    /// Each queue's completions, in the shape's order.
    pub(crate) per_queue: Vec<QueueCount>,
    /// Claim statements that asked every queue that may have work: every claim not made to keep
    /// draining a backlog (`durable_etl_claims_total` less its `drain` trigger).
    pub(crate) discovery_claims: u64,
    /// The same per replica per poll interval of the replicas' lifetime.
    pub(crate) discovery_claims_per_replica_per_poll: f64,
    /// Waits by priority (present with `--priority-mix`).
    pub(crate) priorities: Vec<PriorityWait>,
    /// The documented bound of the least urgent priority: `priority × PRIORITY_STEP`, in ms.
    pub(crate) priority_bound_ms: Option<f64>,
    /// The longest any job was claimed after a job with a later virtual deadline (`sort_at`)
    /// had been claimed, in ms: 0 when the claim order holds, up to a claim's duration across
    /// concurrent claims (present with `--priority-mix`).
    pub(crate) overtaken_max_ms: Option<f64>,
    /// Pending, never-claimed rows seen rewritten by a statement other than their enqueue
    /// (sampled once a second; see `aging`): aging writes. Present with `--priority-mix`.
    pub(crate) aging_writes: Option<u64>,
    /// Updates of live rows (`pg_stat_user_tables.n_tup_upd`) per succeeded job: the claim's one,
    /// plus heartbeat renewals and retries.
    pub(crate) live_row_updates_per_job: f64,
    /// Present with `--cap`.
    pub(crate) cap: Option<CapFigures>,
}

/// One ended job, as the figures read it (seconds since the epoch, database clock).
#[derive(Debug, Clone)]
pub(crate) struct Ended {
    /// Its id.
    pub(crate) id: String,
    /// The index of its queue in the shape's names (`usize::MAX`: another queue).
    pub(crate) queue: usize,
    /// Its priority.
    pub(crate) priority: i16,
    /// Its virtual deadline, `run_at + priority × PRIORITY_STEP`.
    pub(crate) sort_at: f64,
    /// Its due time.
    pub(crate) run_at: f64,
    /// Its (last) claim's start.
    pub(crate) started_at: f64,
    /// The start of the statement that completed it.
    pub(crate) finished_at: f64,
}

/// The succeeded jobs of the run.
///
/// # Errors
/// Database errors.
pub(crate) async fn ended(
    client: &tokio_postgres::Client,
    shape: &Shape,
) -> Result<Vec<Ended>, Error> {
    let names = shape.names();
    let step = durable_etl::queue::PRIORITY_STEP.as_secs_f64();
    let rows = client
        .query(
            "SELECT id::text, queue, priority, extract(epoch FROM run_at)::float8,
                    extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8
               FROM etl_jobs WHERE status = 'succeeded'",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let queue: String = r.get(1);
            let priority: i16 = r.get(2);
            let run_at: f64 = r.get(3);
            Ended {
                id: r.get(0),
                queue: names.iter().position(|n| *n == queue).unwrap_or(usize::MAX),
                priority,
                sort_at: run_at + f64::from(priority) * step,
                run_at,
                started_at: r.get(4),
                finished_at: r.get(5),
            }
        })
        .collect())
}

/// What the figures need besides the ended jobs.
pub(crate) struct Inputs<'a> {
    /// The run's shape.
    pub(crate) shape: &'a Shape,
    /// The window, `(from, to)` in seconds since the epoch (database clock).
    pub(crate) window: (f64, f64),
    /// Saturated only: the fewest due jobs each fed queue had at a top-up, in the shape's order.
    pub(crate) fewest_due: Option<&'a [u64]>,
    /// Replica processes.
    pub(crate) replicas: usize,
    /// Seconds from the replicas' start to their scrape.
    pub(crate) lifetime_s: f64,
    /// Claims the replicas made, and those made to keep draining a backlog.
    pub(crate) claims: (u64, u64),
    /// Aging writes seen, when watched.
    pub(crate) aging_writes: Option<u64>,
    /// Updates of live rows during the run.
    pub(crate) live_row_updates: u64,
    /// Handler starts the replicas recorded (Unix seconds by job id).
    pub(crate) starts: &'a HashMap<String, f64>,
}

/// The queue figures of `jobs`.
pub(crate) fn figures(jobs: &[Ended], inputs: &Inputs<'_>) -> QueueFigures {
    let shape = inputs.shape;
    let (from, to) = inputs.window;
    let in_window = |j: &&Ended| j.finished_at >= from && j.finished_at <= to;
    let per_queue: Vec<QueueCount> = shape
        .names()
        .into_iter()
        .enumerate()
        .map(|(q, queue)| QueueCount {
            queue,
            weight: shape.weight(q),
            in_window: jobs
                .iter()
                .filter(|j| j.queue == q)
                .filter(in_window)
                .count() as u64,
            succeeded: jobs.iter().filter(|j| j.queue == q).count() as u64,
            fewest_due: inputs.fewest_due.and_then(|f| f.get(q).copied()),
        })
        .collect();
    let window_s = (to - from).max(0.0);
    let window_jobs = jobs.iter().filter(in_window).count() as f64;
    let discovery_claims = inputs.claims.0.saturating_sub(inputs.claims.1);
    let polls = (inputs.lifetime_s / POLL_INTERVAL_S).max(1.0);
    let mut priorities: Vec<i16> = shape.priority_mix.iter().map(|m| m.1).collect();
    priorities.sort_unstable();
    priorities.dedup();
    let least_urgent = priorities.last().copied();
    let succeeded = jobs.len().max(1) as f64;
    QueueFigures {
        window_s,
        window_jobs_per_s: if window_s > 0.0 {
            window_jobs / window_s
        } else {
            0.0
        },
        per_queue,
        discovery_claims,
        discovery_claims_per_replica_per_poll: discovery_claims as f64
            / inputs.replicas.max(1) as f64
            / polls,
        priorities: priorities
            .iter()
            .map(|p| PriorityWait {
                priority: *p,
                wait_ms: Percentiles::of(
                    jobs.iter()
                        .filter(|j| j.priority == *p)
                        .map(|j| (j.started_at - j.run_at) * 1000.0)
                        .collect(),
                ),
            })
            .collect(),
        priority_bound_ms: least_urgent
            .map(|p| f64::from(p) * durable_etl::queue::PRIORITY_STEP.as_secs_f64() * 1000.0),
        overtaken_max_ms: least_urgent.map(|_| overtaken_ms(jobs).into_iter().fold(0.0, f64::max)),
        aging_writes: inputs.aging_writes,
        live_row_updates_per_job: inputs.live_row_updates as f64 / succeeded,
        cap: shape.cap.map(|cap| cap_figures(jobs, inputs, cap)),
    }
}

/// What the queues of a capped run did.
fn cap_figures(jobs: &[Ended], inputs: &Inputs<'_>, cap: i32) -> CapFigures {
    let queues = inputs.shape.names().len();
    let cap_n = usize::try_from(cap).unwrap_or(1);
    let mut latencies = Vec::new();
    let mut most = 0;
    let mut busy_queues = 0;
    for q in 0..queues {
        let of_queue: Vec<&Ended> = jobs.iter().filter(|j| j.queue == q).collect();
        if of_queue.is_empty() {
            continue;
        }
        busy_queues += 1;
        let spans: Vec<(f64, f64)> = of_queue
            .iter()
            .filter_map(|j| Some((*inputs.starts.get(&j.id)?, j.finished_at)))
            .collect();
        most = most.max(max_running(&spans));
        let starts: Vec<f64> = of_queue
            .iter()
            .filter_map(|j| inputs.starts.get(&j.id).copied())
            .collect();
        let frees: Vec<f64> = of_queue.iter().map(|j| j.finished_at).collect();
        latencies.extend(permit_to_start_ms(starts, frees, cap_n));
    }
    let job_s = inputs.shape.job_ms as f64 / 1000.0;
    CapFigures {
        cap,
        max_running: most,
        permit_to_start_ms: Percentiles::of(latencies),
        cap_bound_jobs_per_s: (job_s > 0.0).then(|| f64::from(cap) / job_s * busy_queues as f64),
    }
}

/// The end of burn-down's window: the last completion, or with several queues taking jobs the
/// first moment one of them had no more (its last completion), so that the per-queue counts
/// cover only a time when every queue had work.
pub(crate) fn while_all_busy(jobs: &[Ended], shape: &Shape) -> f64 {
    let fed = if shape.hot_queue {
        1
    } else {
        shape.names().len()
    };
    let mut last = vec![0.0f64; fed];
    for j in jobs {
        if let Some(l) = last.get_mut(j.queue) {
            *l = l.max(j.finished_at);
        }
    }
    last.into_iter().fold(f64::INFINITY, f64::min)
}

/// For each job, how long it was claimed after the first claim, made while it was due, of a job
/// with a later virtual deadline (0 when none was), in milliseconds: the documented order lets a
/// job be passed only by jobs with earlier deadlines, so this is 0 but for concurrent claims'
/// jitter. (A job claimed before this one was due passed nothing.)
pub(crate) fn overtaken_ms(jobs: &[Ended]) -> Vec<f64> {
    /// An order-keeping key of a non-negative time.
    fn key(t: f64) -> u64 {
        t.max(0.0).to_bits()
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|a, b| jobs[*b].sort_at.total_cmp(&jobs[*a].sort_at));
    let mut out = vec![0.0; jobs.len()];
    // The claims of the jobs with strictly later deadlines seen so far.
    let mut later = std::collections::BTreeMap::<u64, f64>::new();
    let mut i = 0;
    while i < order.len() {
        // Jobs of equal deadlines do not overtake each other.
        let deadline = jobs[order[i]].sort_at;
        let mut end = i;
        while end < order.len() && jobs[order[end]].sort_at == deadline {
            let j = &jobs[order[end]];
            if let Some((_, first)) = later.range(key(j.run_at)..).next() {
                out[order[end]] = ((j.started_at - first) * 1000.0).max(0.0);
            }
            end += 1;
        }
        for k in &order[i..end] {
            later.insert(key(jobs[*k].started_at), jobs[*k].started_at);
        }
        i = end;
    }
    out
}

/// The most of `spans` (`[start, end)`) that overlap at one instant.
pub(crate) fn max_running(spans: &[(f64, f64)]) -> usize {
    let mut events: Vec<(f64, i32)> = spans
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    // At equal times an end comes before a start: the spans are half-open.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// With at most `cap` running, the `k`-th start (sorted, `k ≥ cap`, 0-based) needs the
/// `(k - cap)`-th freed permit (sorted completions): the time from that completion to that start,
/// in milliseconds, for every such `k`.
pub(crate) fn permit_to_start_ms(
    mut starts: Vec<f64>,
    mut frees: Vec<f64>,
    cap: usize,
) -> Vec<f64> {
    starts.sort_by(f64::total_cmp);
    frees.sort_by(f64::total_cmp);
    starts
        .iter()
        .enumerate()
        .skip(cap)
        .filter_map(|(k, s)| frees.get(k - cap).map(|f| (s - f) * 1000.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job of priority `priority` due at `run_at`, claimed at `started_at`.
    fn job(priority: i16, run_at: f64, started_at: f64) -> Ended {
        Ended {
            id: String::new(),
            queue: 0,
            priority,
            sort_at: run_at + f64::from(priority) * 10.0,
            run_at,
            started_at,
            finished_at: started_at + 0.001,
        }
    }

    #[test]
    fn a_job_is_overtaken_only_by_later_deadlines_claimed_before_it() {
        // Priority 9 due at 0 (deadline 90) goes before priority 0 due at 95 and after one due
        // at 50: not overtaken. The second priority-9 job is claimed 2 s after a priority-0 job
        // with a later deadline: overtaken by 2,000 ms.
        let jobs = vec![
            job(0, 50.0, 51.0),
            job(9, 0.0, 60.0),
            job(0, 95.0, 96.0),
            job(9, 1.0, 98.0),
        ];
        assert_eq!(overtaken_ms(&jobs), vec![0.0, 0.0, 0.0, 2000.0]);
        // A priority-0 job due only after a priority-9 job of a later deadline was claimed was
        // passed by nothing; the priority-9 job passed nothing either.
        let jobs = vec![job(9, 10.0, 20.0), job(0, 30.0, 30.5)];
        assert_eq!(overtaken_ms(&jobs), vec![0.0, 0.0]);
    }

    #[test]
    fn running_spans_are_half_open_and_permits_pair_in_order() {
        assert_eq!(max_running(&[(0.0, 1.0), (1.0, 2.0), (0.5, 1.5)]), 2);
        assert_eq!(max_running(&[]), 0);
        // Cap 1: each start after the first waits for the completion before it.
        let latency = permit_to_start_ms(vec![0.0, 1.002, 2.001], vec![1.0, 2.0, 3.0], 1);
        assert_eq!(latency.len(), 2);
        assert!((latency[0] - 2.0).abs() < 1e-6 && (latency[1] - 1.0).abs() < 1e-6);
    }
}
