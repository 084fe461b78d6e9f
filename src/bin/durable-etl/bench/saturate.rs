//! The `saturated` mode's load, the watch for aging writes, and the wait for every job's end.
//!
//! - **Saturation**: for the whole window, every queue that takes jobs keeps at least `backlog ×
//!   its weight` jobs that are due with a deadline already reached (`sort_at <= now()`), topped
//!   up every
//!   [`TOP_UP_TICK`] with the shape's priority mix; so the replicas never run out of work, and a
//!   less urgent job keeps meeting more urgent ones enqueued after it.
//! - **Aging writes**: a priority scheme that ages jobs rewrites pending rows. Without a trigger,
//!   a rewrite shows in a row's `xmin`: a pending row that was never claimed (`attempts = 0`) and
//!   whose `xmin` is none of the bench's inserting transactions was last written by another
//!   statement. Claims (which leave `pending`), retries and releases (which charge or have
//!   charged an attempt) do not count; anything else does.
//!
//! Invariants this module keeps:
//! - Its reads are bounded: the backlog count ([`due_jobs`], which `depth` shares) stops at
//!   `backlog` rows per queue (an ordered probe of the claim index), and the aging sample runs at most once per [`AGING_SAMPLE`].
//! - It inserts only through `load::insert_noops`, so every job it adds is shaped and recorded
//!   like the burn-down's.

use super::load::{insert_noops, Writers};
use super::shape::Shape;
use durable_etl::error::Error;
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

/// How often the backlog is topped up.
const TOP_UP_TICK: Duration = Duration::from_millis(50);

/// How often the pending rows are sampled for aging writes.
const AGING_SAMPLE: Duration = Duration::from_secs(1);

/// The most jobs one top-up statement inserts.
const TOP_UP_CHUNK: usize = 2_000;

/// The pending rows ever seen rewritten by a statement other than their enqueue.
#[derive(Debug, Default)]
pub(super) struct AgingWatch {
    /// The bench's inserting transactions.
    writers: Writers,
    /// The rewritten rows seen.
    aged: HashSet<uuid::Uuid>,
    /// When the last sample ran.
    last: Option<Instant>,
}

impl AgingWatch {
    /// A watch that knows `writers` as the enqueues so far.
    pub(super) fn new(writers: Writers) -> AgingWatch {
        AgingWatch {
            writers,
            ..AgingWatch::default()
        }
    }

    /// Records more inserting transactions.
    pub(super) fn extend(&mut self, writers: impl IntoIterator<Item = String>) {
        self.writers.extend(writers);
    }

    /// Aging writes seen so far.
    pub(super) fn count(&self) -> u64 {
        self.aged.len() as u64
    }

    /// Samples the pending rows if [`AGING_SAMPLE`] has passed since the last sample.
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn sample(&mut self, client: &tokio_postgres::Client) -> Result<(), Error> {
        if self.last.is_some_and(|at| at.elapsed() < AGING_SAMPLE) {
            return Ok(());
        }
        self.last = Some(Instant::now());
        let writers: Vec<&str> = self.writers.iter().map(String::as_str).collect();
        let rows = client
            .query(
                "SELECT id FROM etl_job_records
                  WHERE status = 'pending' AND attempts = 0 AND xmin::text <> ALL ($1::text[])",
                &[&writers],
            )
            .await?;
        self.aged
            .extend(rows.iter().map(|r| r.get::<_, uuid::Uuid>(0)));
        Ok(())
    }
}

/// Keeps every queue of `shape` that takes jobs (the first only, with a hot queue) at
/// `backlog × its weight` or more due jobs for `duration` (so weighted queues served at their
/// weights' ratio run out at the same time, and the heavier one never runs dry first), numbering new jobs from `first`, and samples
/// `aging` meanwhile when it is given. Returns the window, `(from, to)` in Unix seconds
/// (database clock), and the fewest due jobs each fed queue had at a top-up after the first
/// (0: it ran dry, so the window was not saturated throughout).
///
/// # Errors
/// Database errors.
pub(super) async fn saturate(
    client: &tokio_postgres::Client,
    shape: &Shape,
    (backlog, duration): (usize, Duration),
    first: usize,
    mut aging: Option<&mut AgingWatch>,
) -> Result<((f64, f64), Vec<u64>), Error> {
    let names = shape.names();
    let fed: Vec<String> = if shape.hot_queue {
        names.iter().take(1).cloned().collect()
    } else {
        names.clone()
    };
    let targets: Vec<usize> = (0..fed.len())
        .map(|q| backlog.saturating_mul(shape.weight(q) as usize))
        .collect();
    let limits: Vec<i64> = targets
        .iter()
        .map(|t| i64::try_from(*t).unwrap_or(i64::MAX))
        .collect();
    let from: f64 = client
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await?
        .get(0);
    let end = Instant::now() + duration;
    let mut next = first;
    let mut fewest: Vec<Option<u64>> = vec![None; fed.len()];
    let mut ticks = 0u64;
    while Instant::now() < end {
        let counts = due_jobs(client, &fed, durable_etl::job::handler::NOOP_KIND, &limits).await?;
        let mut queues = Vec::new();
        for (((name, &due), target), low) in fed.iter().zip(&counts).zip(&targets).zip(&mut fewest)
        {
            if ticks > 0 {
                *low = Some(low.map_or(due as u64, |l| l.min(due as u64)));
            }
            queues.extend(std::iter::repeat_n(
                name.clone(),
                target.saturating_sub(due),
            ));
        }
        for chunk in queues.chunks(TOP_UP_CHUNK) {
            let priorities: Vec<i16> = (next..next + chunk.len())
                .map(|i| shape.priority_of(i))
                .collect();
            let keys = shape.keys_of(next, chunk.len());
            let inserted = insert_noops(
                client,
                next,
                &shape.payload(),
                &(chunk.to_vec(), priorities, keys),
            )
            .await?;
            if let Some(aging) = aging.as_deref_mut() {
                aging.extend(inserted.xmin);
            }
            next += chunk.len();
        }
        if let Some(aging) = aging.as_deref_mut() {
            aging.sample(client).await?;
        }
        ticks += 1;
        tokio::time::sleep(TOP_UP_TICK).await;
    }
    let fewest = fewest.into_iter().map(|f| f.unwrap_or(0)).collect();
    Ok(((from, from + duration.as_secs_f64()), fewest))
}

/// The due jobs of `kind` (pending, deadline reached: `sort_at <= now()`) in each of `queues`,
/// counting at most the matching entry of `limits` in each (an ordered probe of the claim index
/// that stops there, so a deep backlog costs no more than the limit).
///
/// # Errors
/// Database errors.
pub(super) async fn due_jobs(
    client: &tokio_postgres::Client,
    queues: &[String],
    kind: &str,
    limits: &[i64],
) -> Result<Vec<usize>, Error> {
    let rows = client
        .query(
            "SELECT (SELECT count(*) FROM (
                        SELECT 1 FROM etl_job_records j
                         WHERE j.status = 'pending' AND j.queue = q AND j.kind = $2
                           AND j.sort_at <= now()
                         LIMIT u.n) s)
               FROM unnest($1::text[], $3::int8[]) WITH ORDINALITY AS u(q, n, o) ORDER BY o",
            &[&queues, &kind, &limits],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| usize::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        .collect())
}

/// How often the bench looks whether the jobs have ended.
const DONE_POLL: Duration = Duration::from_millis(20);

/// Waits until no job is pending or running, looking every [`DONE_POLL`] through the partial
/// indexes (cheap), for at most `limit`, and samples `aging` meanwhile when it is given.
///
/// # Errors
/// [`Error::Io`] when the jobs have not ended within `limit`; database errors.
pub(super) async fn until_done(
    client: &tokio_postgres::Client,
    mut aging: Option<&mut AgingWatch>,
    limit: Duration,
) -> Result<(), Error> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(aging) = aging.as_deref_mut() {
            aging.sample(client).await?;
        }
        let busy: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM etl_job_records WHERE status = 'pending')
                     OR EXISTS (SELECT 1 FROM etl_job_records WHERE status = 'running')",
                &[],
            )
            .await?
            .get(0);
        if !busy {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Io(None));
        }
        tokio::time::sleep(DONE_POLL).await;
    }
}
