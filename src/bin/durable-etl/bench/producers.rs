//! `bench offered-load`'s and `bench depth-target`'s producers: N tasks, each on its own
//! connection, that offer the load open-loop by the clock ([`Pace::Clock`]) or keep a backlog
//! ([`Pace::Depth`], see `depth`), and the figures that say whether they offered what was asked.
//!
//! The clock's schedule: the `jobs` jobs are cut into statements of `batch` jobs, and statement
//! `k` is due at `start + k × batch / rate` (so statements go out at `rate / batch` per second).
//! The producers share one counter: each takes the next statement's index, waits until it is due
//! and sends it, on its own connection, in one autocommit statement, through the library's
//! public enqueue as any user would (`load::enqueue_noops`: `Jobs::enqueue_many_with`; or
//! `enqueue_many` for ETL loads).
//!
//! The producers' sessions are opened first ([`connect`], role
//! [`PRODUCER_ROLE`](super::server_cpu::PRODUCER_ROLE), so that the server CPU sampler counts
//! their backends as `producers`), then the schedule starts ([`offer`]).
//!
//! Invariants this module keeps:
//! - Open loop: a late producer never moves the schedule. A statement taken after its due time
//!   is sent at once, and its lag (send time − due time) is recorded; the next statement keeps
//!   its own due time.
//! - `--duration` bounds the run: no statement is sent once the duration is over, however much
//!   of the schedule is left; the figures say how many jobs were offered of how many scheduled.
//! - The achieved rate is never flattered: it is offered jobs ÷ the span from the schedule's
//!   start to the last acknowledgement, or to the end of the last offered job's slot
//!   (`offered / rate`) when that is later (a producer that keeps the schedule is credited with
//!   the asked rate, never more). Below [`MISSED_BELOW`] × the asked rate the run says so
//!   (`rate_missed`, and [`OfferedFigures::warning`] in the text, on stderr and in the report).

use super::config::{BenchHandler, MISSED_BELOW};
use super::depth::{DepthFigures, TopUp};
use super::load::{bench_owner, enqueue_noops, insert_loads, NoopJob, BENCH_PRINCIPAL};
use super::percentiles::Percentiles;
use super::server_cpu::PRODUCER_ROLE;
use super::shape::Shape;
use durable_etl::config::DatabaseConfig;
use durable_etl::db;
use durable_etl::digest::Secret;
use durable_etl::error::Error;
use durable_etl::Jobs;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// How the producers pace their statements.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pace {
    /// Open loop by the clock: `jobs` jobs (rate × duration) at `rate` per second.
    Clock {
        /// Jobs in the schedule.
        jobs: usize,
        /// Jobs per second asked.
        rate: f64,
    },
    /// Closed loop on the backlog: keep `depth` due jobs (see `depth`).
    Depth {
        /// Due jobs to keep.
        depth: usize,
    },
}

/// What the producers are asked to offer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// How they pace their statements.
    pub(super) pace: Pace,
    /// When the producers stop, counted from the schedule's start.
    pub(super) duration: Duration,
    /// Producer tasks, each on its own connection (at least 1).
    pub(super) producers: usize,
    /// Jobs per statement (at least 1).
    pub(super) batch: usize,
}

/// What the producers offered, beside what they were asked to.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OfferedFigures {
    /// Jobs per second asked (`--rate`).
    pub(crate) asked_rate: f64,
    /// Jobs per second offered: `offered / span_s`.
    pub(crate) achieved_rate: f64,
    /// Whether `achieved_rate` is below [`MISSED_BELOW`] × `asked_rate`.
    pub(crate) rate_missed: bool,
    /// Producer tasks (`--producers`).
    pub(crate) producers: usize,
    /// Jobs per statement (`--batch`).
    pub(crate) batch: usize,
    /// Jobs in the schedule (rate × duration).
    pub(crate) scheduled: usize,
    /// Jobs actually offered (acknowledged) before the duration was over.
    pub(crate) offered: usize,
    /// Seconds the offered jobs took (see the module doc).
    pub(crate) span_s: f64,
    /// How late each statement was sent versus its due time, in milliseconds.
    pub(crate) lag_ms: Percentiles,
}

impl OfferedFigures {
    /// The loud line of a run that missed its rate, if it did.
    pub(crate) fn warning(&self) -> Option<String> {
        self.rate_missed.then(|| {
            format!(
                "WARNING: offered {:.0} of {:.0} jobs/s asked ({:.1} %): the figures describe \
                 the offered rate, not the asked one",
                self.achieved_rate,
                self.asked_rate,
                100.0 * self.achieved_rate / self.asked_rate
            )
        })
    }

    /// The figures as aligned lines of the text report, the warning first.
    pub(crate) fn to_text(&self) -> String {
        let mut out = self.warning().map(|w| format!("{w}\n")).unwrap_or_default();
        out.push_str(&format!(
            "offered              {} of {} jobs: {:.0} of {:.0} jobs/s asked over {:.3} s \
             ({} producer(s), batch {})\n\
             enqueue lag          p50 {:.3}  p99 {:.3}  max {:.3} ms ({} statements)\n",
            self.offered,
            self.scheduled,
            self.achieved_rate,
            self.asked_rate,
            self.span_s,
            self.producers,
            self.batch,
            self.lag_ms.p50,
            self.lag_ms.p99,
            self.lag_ms.max,
            self.lag_ms.samples,
        ));
        out
    }
}

/// The offered jobs and the figures of their offer.
pub(super) struct Offered {
    /// Each offered job's commit-acknowledgement time (Unix seconds), by id.
    pub(super) acks: HashMap<String, f64>,
    /// Each offered job's number in the schedule (from 0), by id: what its key was made of
    /// (see `keys`).
    pub(super) numbers: HashMap<String, usize>,
    /// By the clock: what was offered, beside what was asked.
    pub(super) rate: Option<OfferedFigures>,
    /// To a depth: what was held, beside what was asked (the window's completions not yet
    /// counted).
    pub(super) depth: Option<DepthFigures>,
}

/// How the producers take their next statement, and what they share for it.
#[derive(Clone)]
enum Pacing {
    /// Off the clock's schedule of `jobs` jobs at `rate`.
    Clock {
        /// Jobs in the schedule.
        jobs: usize,
        /// Jobs per second asked.
        rate: f64,
        /// The index of the next statement to send.
        next: Arc<AtomicUsize>,
    },
    /// Topping the backlog up to its depth.
    Depth(Arc<TopUp>),
}

/// What one producer shares with the others.
#[derive(Clone)]
struct Shared {
    /// The schedule.
    plan: Plan,
    /// What the jobs are.
    handler: BenchHandler,
    /// The jobs' queues and priorities.
    shape: Arc<Shape>,
    /// The ETL loads' secret and owner.
    owner: Arc<(Secret, [u8; 32])>,
    /// The `noop` jobs' handle (the same secret and owner) and job.
    noop: Arc<(Jobs, NoopJob)>,
    /// How they take their next statement.
    pacing: Pacing,
    /// The schedule's start.
    start: Instant,
}

/// What one producer sent.
#[derive(Default)]
struct Sent {
    /// Each job's id, number and commit-acknowledgement time (Unix seconds).
    acks: Vec<(uuid::Uuid, usize, f64)>,
    /// By the clock: each statement's lag, in milliseconds.
    lags_ms: Vec<f64>,
    /// To a depth: each count of the due jobs after the first fill.
    depths: Vec<usize>,
    /// Statements sent.
    statements: usize,
    /// When its last statement was acknowledged.
    last_ack: Option<Instant>,
}

/// Opens `producers` (at least 1) sessions on `db_config`'s database for [`offer`], with the
/// producers' role ([`PRODUCER_ROLE`]).
///
/// # Errors
/// A connection error.
pub(super) async fn connect(
    db_config: &DatabaseConfig,
    producers: usize,
) -> Result<Vec<tokio_postgres::Client>, Error> {
    let mut clients = Vec::with_capacity(producers.max(1));
    for _ in 0..producers.max(1) {
        clients.push(db::connect(db_config, PRODUCER_ROLE).await?);
    }
    Ok(clients)
}

/// Offers `plan`'s jobs, spread over `shape`'s queues and priorities, from one task per session
/// of `clients` (see [`connect`] and the module doc).
///
/// # Errors
/// A statement error of any producer; [`Error::Internal`] if a producer task panicked.
pub(super) async fn offer(
    clients: Vec<tokio_postgres::Client>,
    handler: BenchHandler,
    plan: Plan,
    shape: &Shape,
) -> Result<Offered, Error> {
    let pacing = match plan.pace {
        Pace::Clock { jobs, rate } => Pacing::Clock {
            jobs,
            rate,
            next: Arc::new(AtomicUsize::new(0)),
        },
        Pace::Depth { depth } => {
            let (queues, kind) = match handler {
                BenchHandler::Noop => (shape.names(), durable_etl::job::handler::NOOP_KIND),
                BenchHandler::Etl => (
                    vec![durable_etl::queue::DEFAULT_QUEUE.to_owned()],
                    durable_etl::kinds::etl::KIND,
                ),
            };
            let top_up = TopUp::new((depth, plan.batch, plan.producers), queues, kind);
            Pacing::Depth(Arc::new(top_up))
        }
    };
    let owner = bench_owner()?;
    let jobs = Jobs::new(owner.0.clone(), BENCH_PRINCIPAL);
    let shared = Shared {
        plan,
        handler,
        shape: Arc::new(shape.clone()),
        owner: Arc::new(owner),
        noop: Arc::new((jobs, NoopJob::of(shape))),
        pacing,
        start: Instant::now(),
    };
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(produce(client, shared.clone())))
        .collect();
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.push(task.await.map_err(|_| Error::Internal)??);
    }
    Ok(tally(&plan, shared.start, sent))
}

/// Takes statements off the shared schedule, or tops the backlog up, until it is done or the
/// duration is over, sending each on `client` once it is due (at once if it is late).
async fn produce(client: tokio_postgres::Client, shared: Shared) -> Result<Sent, Error> {
    // A duration past what the clock can count never stops the producers early.
    let stop = shared.start.checked_add(shared.plan.duration);
    let mut sent = Sent::default();
    loop {
        let (first, n) = match &shared.pacing {
            Pacing::Clock { jobs, rate, next } => {
                let batch = shared.plan.batch.max(1);
                let schedule = (*jobs, *rate, batch);
                match clock_next(next, shared.start, schedule, stop).await {
                    Some((first, n, lag_ms)) => {
                        sent.lags_ms.push(lag_ms);
                        (first, n)
                    }
                    None => break,
                }
            }
            Pacing::Depth(top_up) => match top_up.next(&client, stop, &mut sent.depths).await? {
                Some(next) => next,
                None => break,
            },
        };
        let ids = match shared.handler {
            BenchHandler::Noop => {
                let columns = shared.shape.columns(first, n);
                let (jobs, job) = &*shared.noop;
                enqueue_noops(&client, jobs, job, &columns).await?
            }
            BenchHandler::Etl => {
                let (secret, owner) = &*shared.owner;
                insert_loads(&client, secret, owner, first, n).await?
            }
        };
        if let Pacing::Depth(top_up) = &shared.pacing {
            top_up.acknowledged(n);
        }
        sent.statements += 1;
        sent.last_ack = Some(Instant::now());
        let ack = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let numbered = ids.into_iter().zip(first..);
        sent.acks
            .extend(numbered.map(|(id, number)| (id, number, ack)));
    }
    Ok(sent)
}

/// The next statement (its index taken off `next`) of the clock's schedule of `jobs` jobs at
/// `rate` from `start`, `batch` per statement, once it is due: its first job, its size and its
/// lag in milliseconds; `None` once the schedule is done or `stop` has passed.
async fn clock_next(
    next: &AtomicUsize,
    start: Instant,
    (jobs, rate, batch): (usize, f64, usize),
    stop: Option<Instant>,
) -> Option<(usize, usize, f64)> {
    let k = next.fetch_add(1, Ordering::Relaxed);
    let first = k.saturating_mul(batch);
    if first >= jobs {
        return None;
    }
    // A due time the clock cannot count is past any duration: the schedule ends there.
    let due = Duration::try_from_secs_f64(first as f64 / rate)
        .ok()
        .and_then(|after| start.checked_add(after))?;
    tokio::time::sleep_until(due).await;
    let now = Instant::now();
    if stop.is_some_and(|stop| now >= stop) {
        return None;
    }
    let lag_ms = now.saturating_duration_since(due).as_secs_f64() * 1000.0;
    Some((first, batch.min(jobs - first), lag_ms))
}

/// The producers' `sent` jobs and their figures against `plan`, for a schedule (or a window)
/// that began at `start`.
fn tally(plan: &Plan, start: Instant, sent: Vec<Sent>) -> Offered {
    let last_ack = sent.iter().filter_map(|s| s.last_ack).max();
    let statements = sent.iter().map(|s| s.statements).sum();
    let (mut lags, mut depths) = (Vec::new(), Vec::new());
    let (mut acks, mut numbers) = (HashMap::new(), HashMap::new());
    for s in sent {
        lags.extend(s.lags_ms);
        depths.extend(s.depths);
        for (id, number, ack) in s.acks {
            let id = id.to_string();
            numbers.insert(id.clone(), number);
            acks.insert(id, ack);
        }
    }
    let span = last_ack.map_or(0.0, |at| at.saturating_duration_since(start).as_secs_f64());
    let (rate, depth) = match plan.pace {
        Pace::Clock { jobs, rate } => (
            Some(figures(plan, (jobs, rate), acks.len(), span, lags)),
            None,
        ),
        Pace::Depth { depth } => (
            None,
            Some(DepthFigures::new(
                (depth, plan.batch, plan.producers),
                (acks.len(), statements),
                plan.duration.as_secs_f64(),
                depths,
            )),
        ),
    };
    Offered {
        acks,
        numbers,
        rate,
        depth,
    }
}

/// The figures of `offered` jobs of `plan`'s schedule of `jobs` jobs at `rate`, the last
/// acknowledged `span_s` seconds after the schedule's start, sent with statement lags `lags_ms`.
fn figures(
    plan: &Plan,
    (jobs, rate): (usize, f64),
    offered: usize,
    span_s: f64,
    lags_ms: Vec<f64>,
) -> OfferedFigures {
    let span_s = if offered == 0 {
        0.0
    } else {
        span_s.max(offered as f64 / rate)
    };
    let achieved_rate = if span_s > 0.0 {
        offered as f64 / span_s
    } else {
        0.0
    };
    OfferedFigures {
        asked_rate: rate,
        achieved_rate,
        rate_missed: achieved_rate < MISSED_BELOW * rate,
        producers: plan.producers,
        batch: plan.batch,
        scheduled: jobs,
        offered,
        span_s,
        lag_ms: Percentiles::of(lags_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1,000 jobs/s for 2 s, by 2 producers in statements of 10.
    const PLAN: Plan = Plan {
        pace: Pace::Clock {
            jobs: 2_000,
            rate: 1_000.0,
        },
        duration: Duration::from_secs(2),
        producers: 2,
        batch: 10,
    };

    /// `PLAN`'s schedule.
    const SCHEDULE: (usize, f64) = (2_000, 1_000.0);

    #[test]
    fn a_kept_schedule_is_credited_with_the_asked_rate_and_no_more() {
        // Every job acknowledged before the end of its slot: the span is the schedule's.
        let f = figures(&PLAN, SCHEDULE, 2_000, 1.99, vec![0.5, 1.0]);
        assert_eq!((f.span_s, f.achieved_rate), (2.0, 1_000.0));
        assert!(!f.rate_missed && f.warning().is_none());
        assert!(!f.to_text().contains("WARNING"), "{}", f.to_text());
        assert_eq!(f.lag_ms.samples, 2);
    }

    #[test]
    fn a_missed_rate_is_flagged_and_said_loudly() {
        // A quarter of the schedule, cut off when the duration was over.
        let f = figures(&PLAN, SCHEDULE, 500, 2.0, vec![900.0]);
        assert_eq!(f.achieved_rate, 250.0);
        assert!(f.rate_missed);
        let text = f.to_text();
        assert!(
            text.starts_with("WARNING: offered 250 of 1000 jobs/s asked (25.0 %)"),
            "{text}"
        );
        assert!(
            text.contains("offered              500 of 2000 jobs"),
            "{text}"
        );
        // Below the threshold (97.5 %) is a miss; above it (98.5 %), not.
        assert!(figures(&PLAN, SCHEDULE, 1_950, 2.0, Vec::new()).rate_missed);
        assert!(!figures(&PLAN, SCHEDULE, 1_970, 2.0, Vec::new()).rate_missed);
    }

    #[test]
    fn nothing_offered_is_a_missed_rate_of_zero() {
        let f = figures(&PLAN, SCHEDULE, 0, 0.0, Vec::new());
        assert_eq!((f.achieved_rate, f.span_s), (0.0, 0.0));
        assert!(f.rate_missed);
    }
}
