//! Per-queue gauges, sampled at scrape time: each queue's jobs by state (and of its due jobs,
//! those no live replica serves), its oldest due job's age, its cap and the permits held, its
//! key cap and the key permits held, and whether it is paused.
//!
//! Invariants this module keeps:
//! - At most [`QUEUES_SHOWN`] queues are labelled per scrape (the deepest first, then by name),
//!   so the number of series is bounded whatever the number of queues; the unlabelled totals of
//!   the parent module still count every job.
//! - A queue's name is the only label: a name the deployment chose (a kind's default or an
//!   enqueue's, `[a-z][a-z0-9_.]*`), never an id, a principal or a request value
//!   (docs/privacy.md says not to put one in a queue's name).
//! - One statement per scrape (and per read of the operators' queue routes, which take the same
//!   sample, of one queue or of at most [`QUEUES_SHOWN`] plus one), over the live table (active jobs only, never the history) and the
//!   settings and permits of the configured queues.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tokio_postgres::GenericClient;

/// The most queues one scrape labels.
pub const QUEUES_SHOWN: i64 = 100;

/// How recently a replica must have reported (its reporter runs once per heartbeat interval)
/// for the queues and kinds it named to count as served: the per-queue sample's interval.
pub const SERVED_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Each queue with live jobs or settings (only queue `$2` when it is not NULL): its jobs by
/// state, and of its due jobs those whose queue and kind no replica that reported within
/// [`SERVED_WITHIN`] serves (`unserved`: they wait for a replica that runs them), its oldest due
/// job's age (seconds, database clock; 0 when none is due), its cap (NULL: none) and the permits
/// held, its key cap (NULL: none) and the key permits held, and whether it is paused; the `$1`
/// with the most live jobs, then by name. Sent unnamed (`query_typed`), so it is planned with its parameters: a NULL `$2` folds
/// away, and a name becomes an equality on the claim index's leading column and on
/// `etl_queues`' primary key.
///
/// Locks: none (a read of the live table, one pass, with a hashed lookup of the served (queue,
/// kind) pairs; of `etl_replicas`, a row per replica; and of `etl_queues`, `etl_queue_permits`
/// and `etl_key_permits`, by queue).
pub(super) const QUEUES_SAMPLE_SQL: &str = "
WITH served AS (
    SELECT DISTINCT q.queue, k.kind
      FROM etl_replicas r
     CROSS JOIN unnest(r.queues) AS q(queue)
     CROSS JOIN unnest(r.kinds) AS k(kind)
     WHERE r.reported_at > now() - interval '60 seconds'
), live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS due,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now()
                              AND (queue, kind) NOT IN (SELECT queue, kind FROM served))
               AS unserved,
           count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS deferred,
           count(*) FILTER (WHERE status = 'running') AS running,
           min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest
      FROM etl_job_records
     WHERE $2::text IS NULL OR queue = $2
     GROUP BY queue
), settings AS (
    SELECT queue, cap, key_cap, paused FROM etl_queues WHERE $2::text IS NULL OR queue = $2
), every AS (
    SELECT coalesce(l.queue, s.queue) AS queue, coalesce(l.due, 0) AS due,
           coalesce(l.unserved, 0) AS unserved, s.key_cap,
           (SELECT count(*) FROM etl_key_permits k WHERE k.queue = s.queue) AS key_held,
           coalesce(l.deferred, 0) AS deferred, coalesce(l.running, 0) AS running,
           coalesce(extract(epoch FROM now() - l.oldest)::float8, 0) AS oldest_due_seconds,
           s.cap, coalesce(s.paused, false) AS paused,
           (SELECT count(*) FROM etl_queue_permits p
             WHERE p.queue = s.queue AND p.claim_id IS NOT NULL) AS held
      FROM live l
      FULL JOIN settings s ON s.queue = l.queue
)
SELECT queue, due, deferred, running, oldest_due_seconds, cap, coalesce(held, 0), paused,
       unserved, key_cap, coalesce(key_held, 0)
  FROM every
 ORDER BY due + deferred + running DESC, queue
 LIMIT $1";

/// One queue's sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueDepth {
    /// The queue.
    pub queue: String,
    /// Pending jobs due now.
    pub due: i64,
    /// Pending jobs not due yet.
    pub deferred: i64,
    /// Running jobs.
    pub running: i64,
    /// Age of its oldest due job, in seconds (0 when none is due).
    pub oldest_due_seconds: f64,
    /// Its cap, if it has one.
    pub cap: Option<i32>,
    /// Permits held by running claims.
    pub permits_held: i64,
    /// Whether it is paused.
    pub paused: bool,
    /// Of its due jobs, those whose queue and kind no live replica serves.
    pub unserved: i64,
    /// Its key cap, if it has one.
    pub key_cap: Option<i32>,
    /// Key permits held by running claims.
    pub key_permits_held: i64,
}

/// Samples the [`QUEUES_SHOWN`] deepest queues.
///
/// # Errors
/// The database error of the query.
pub async fn sample_queues(
    client: &impl GenericClient,
) -> Result<Vec<QueueDepth>, tokio_postgres::Error> {
    sample_some_queues(client, QUEUES_SHOWN, None).await
}

/// Samples the `limit` deepest queues, or only queue `name` when given (none when it has neither
/// live jobs nor settings).
///
/// # Errors
/// The database error of the query.
pub async fn sample_some_queues(
    client: &impl GenericClient,
    limit: i64,
    name: Option<&str>,
) -> Result<Vec<QueueDepth>, tokio_postgres::Error> {
    use tokio_postgres::types::Type;
    let rows = client
        .query_typed(
            QUEUES_SAMPLE_SQL,
            &[(&limit, Type::INT8), (&name, Type::TEXT)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| QueueDepth {
            queue: r.get(0),
            due: r.get(1),
            deferred: r.get(2),
            running: r.get(3),
            oldest_due_seconds: r.get(4),
            cap: r.get(5),
            permits_held: r.get(6),
            paused: r.get(7),
            unserved: r.get(8),
            key_cap: r.get(9),
            key_permits_held: r.get(10),
        })
        .collect())
}

/// The queues an operator's listing shows, the [`QUEUES_SHOWN`] deepest, and whether more have
/// live jobs or settings (one more is sampled to tell).
///
/// # Errors
/// The database error of the query.
pub async fn listed_queues(
    client: &impl GenericClient,
) -> Result<(Vec<QueueDepth>, bool), tokio_postgres::Error> {
    let mut queues = sample_some_queues(client, QUEUES_SHOWN + 1, None).await?;
    let shown = usize::try_from(QUEUES_SHOWN).unwrap_or(usize::MAX);
    let more = queues.len() > shown;
    queues.truncate(shown);
    Ok((queues, more))
}

/// The per-queue families of one scrape.
#[derive(Debug)]
pub(super) struct PerQueue(pub(super) Vec<QueueDepth>);

/// A gauge family labelled by queue: its name, its help, and each queue's value (`None`: no
/// sample for that queue).
type Family<'a> = (&'static str, &'static str, Vec<(&'a str, Option<f64>)>);

impl Collector for PerQueue {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let of = |f: fn(&QueueDepth) -> Option<f64>| -> Vec<(&str, Option<f64>)> {
            self.0.iter().map(|q| (q.queue.as_str(), f(q))).collect()
        };
        #[allow(clippy::cast_precision_loss)]
        let families: [Family<'_>; 10] = [
            (
                "durable_etl_queue_due",
                "Due pending jobs of the queue.",
                of(|q| Some(q.due as f64)),
            ),
            (
                "durable_etl_queue_deferred",
                "Pending jobs of the queue not due yet.",
                of(|q| Some(q.deferred as f64)),
            ),
            (
                "durable_etl_queue_running",
                "Running jobs of the queue.",
                of(|q| Some(q.running as f64)),
            ),
            (
                "durable_etl_queue_oldest_due_by_queue_seconds",
                "Age of the queue's oldest due job (database clock).",
                of(|q| Some(q.oldest_due_seconds)),
            ),
            (
                "durable_etl_queue_cap",
                "The queue's cap on running jobs (capped queues only).",
                of(|q| q.cap.map(f64::from)),
            ),
            (
                "durable_etl_queue_permits_held",
                "Permits of the queue's cap held by running claims (capped queues only).",
                of(|q| q.cap.map(|_| q.permits_held as f64)),
            ),
            (
                "durable_etl_queue_unserved",
                "Due jobs of the queue that no live replica serves (none runs their kind for this queue).",
                of(|q| Some(q.unserved as f64)),
            ),
            (
                "durable_etl_queue_key_cap",
                "The queue's cap on running jobs of one concurrency key (key-capped queues only).",
                of(|q| q.key_cap.map(f64::from)),
            ),
            (
                "durable_etl_queue_key_permits_held",
                "Key permits of the queue held by running claims (key-capped queues only).",
                of(|q| q.key_cap.map(|_| q.key_permits_held as f64)),
            ),
            (
                "durable_etl_queue_paused",
                "1 if the queue is paused.",
                of(|q| Some(f64::from(u8::from(q.paused)))),
            ),
        ];
        for (name, help, samples) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (queue, value) in samples {
                if let Some(value) = value {
                    let labels = [("queue", queue)];
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{QUEUES_SAMPLE_SQL, SERVED_WITHIN};

    #[test]
    fn the_served_window_is_the_one_the_sample_reads() {
        let interval = format!("interval '{} seconds'", SERVED_WITHIN.as_secs());
        assert!(QUEUES_SAMPLE_SQL.contains(&interval));
    }
}
