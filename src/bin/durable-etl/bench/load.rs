//! What the bench does to the queue: fills it, holds and times recoveries, and inserts jobs the
//! way every mode does.
//!
//! Two ways in for `noop` jobs: the producers of the offered load and the depth target enqueue
//! through the library's public API ([`enqueue_noops`]: [`Jobs::enqueue_many_with`] with a
//! typed [`NoopJob`]), since what they offer is the load being measured; the set-up before a
//! window (the burn-down's and saturated run's `fill`, a recovery trial's job) and the saturated
//! run's top-ups insert with the bench's own statement ([`insert_noops`]), which also returns the
//! inserting transaction's `xmin` that the aging watch needs (see `saturate`) and numbers each
//! job for the per-key figures (see `keys`). ETL loads always go through the library's enqueue
//! ([`insert_loads`]).

use super::config::{BenchHandler, INSERT_CHUNK, RECORDS_PER_ETL_JOB, WAIT_LIMIT};
use super::replicas::Replicas;
use super::shape::{Columns, Shape};
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::db;
use durable_etl::digest::Secret;
use durable_etl::error::Error;
use durable_etl::intake::IntakeLimits;
use durable_etl::kinds::etl::enqueue::{enqueue_many, NewJob};
use durable_etl::kinds::etl::request;
use durable_etl::{EnqueueOptions, Job, Jobs};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;
use tokio_postgres::types::Type;

/// The principal the bench's jobs are enqueued for (through the library's API).
pub(super) const BENCH_PRINCIPAL: &str = "bench";

/// A throw-away secret and owner ([`BENCH_PRINCIPAL`]) for the bench's ETL jobs and its
/// producers' `noop` jobs.
pub(super) fn bench_owner() -> Result<(Secret, [u8; 32]), Error> {
    let secret = Secret::new(uuid::Uuid::new_v4().simple().to_string().into_bytes())
        .ok_or(ConfigError::Secret)?;
    let owner = secret.digest(
        durable_etl::digest::DigestKind::Principal,
        BENCH_PRINCIPAL.as_bytes(),
    );
    Ok((secret, owner))
}

/// The transaction ids (32-bit, as `xmin::text` shows them) of the bench's inserting statements:
/// a live row whose `xmin` is none of these was last written by another statement.
pub(super) type Writers = std::collections::HashSet<String>;

/// Inserts `jobs` due jobs in chunks (one statement each), before any replica runs, numbered
/// from `first` and spread over `shape`'s queues and priorities (`noop` jobs; ETL loads keep the
/// default queue); returns the inserting transactions' ids. Set-up only, before the measured
/// window (and its server CPU sampler) begins: so `noop` jobs keep the bench's own statement
/// ([`insert_noops`]), for the `xmin` the aging watch needs, rather than the public API the
/// producers use.
pub(super) async fn fill(
    client: &tokio_postgres::Client,
    handler: BenchHandler,
    (first, jobs): (usize, usize),
    shape: &Shape,
) -> Result<Writers, Error> {
    let (secret, owner) = bench_owner()?;
    let mut writers = Writers::new();
    let mut done = 0;
    while done < jobs {
        let n = INSERT_CHUNK.min(jobs - done);
        match handler {
            BenchHandler::Noop => {
                let columns = shape.columns(first + done, n);
                let inserted =
                    insert_noops(client, first + done, &shape.payload(), &columns).await?;
                writers.extend(inserted.xmin);
            }
            BenchHandler::Etl => {
                insert_loads(client, &secret, &owner, first + done, n).await?;
            }
        };
        done += n;
    }
    Ok(writers)
}

/// The built-in `noop` kind as a typed [`Job`], as a library user would enqueue it: its payload
/// is `{}`, with `"pause_ms": n` for jobs that pause and `"fail": true` for jobs that fail (see
/// [`durable_etl::job::handler::Noop`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct NoopJob {
    /// How long the job's compute phase pauses, in milliseconds (none when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) pause_ms: Option<u64>,
    /// Whether the job fails after its pause (absent: it does not).
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub(super) fail: bool,
}

impl Job for NoopJob {
    const KIND: &'static str = durable_etl::job::handler::NOOP_KIND;
    const MAX_ATTEMPTS: i32 = 5;
}

impl NoopJob {
    /// The job of every `noop` job of `shape`: a pause of [`Shape::job_ms`], if any (the payload
    /// [`Shape::payload`] describes).
    pub(super) fn of(shape: &Shape) -> NoopJob {
        NoopJob {
            pause_ms: (shape.job_ms > 0).then_some(shape.job_ms),
            fail: shape.fail,
        }
    }
}

/// Enqueues due `noop` jobs `job`, one per entry of `(queues, priorities, keys)`, through the
/// library's public API ([`Jobs::enqueue_many_with`], for `jobs`' owner, without idempotency
/// keys): one statement and one round trip per [`durable_etl::jobs::enqueue::CHUNK`] jobs, as for any
/// library user. Returns the jobs' ids, in order.
pub(super) async fn enqueue_noops(
    client: &tokio_postgres::Client,
    jobs: &Jobs,
    job: &NoopJob,
    (queues, priorities, keys): &Columns,
) -> Result<Vec<uuid::Uuid>, Error> {
    let batch = queues
        .iter()
        .zip(priorities)
        .zip(keys)
        .map(|((queue, &priority), key)| {
            let options = EnqueueOptions {
                queue: Some(queue),
                priority: Some(priority),
                concurrency_key: key.as_deref(),
                ..EnqueueOptions::default()
            };
            (job, options)
        });
    let enqueued = jobs.enqueue_many_with(client, batch).await?;
    Ok(enqueued.into_iter().map(|e| e.id).collect())
}

/// What one insert of `noop` jobs wrote.
pub(super) struct Inserted {
    /// The jobs' ids.
    pub(super) ids: Vec<uuid::Uuid>,
    /// The inserting transaction's id (`xmin` of its rows), if it inserted any.
    pub(super) xmin: Option<String>,
}

/// Inserts due `noop` jobs numbered from `first`, one per entry of `(queues, priorities, keys)`,
/// with `payload` (`{}`, or a pause), in one statement; each live row's virtual deadline is
/// `durable_etl_sort_at(run_at, priority)`, as the library's enqueue sets it, and its
/// concurrency key is the entry's (or none).
pub(super) async fn insert_noops(
    client: &tokio_postgres::Client,
    first: usize,
    payload: &serde_json::Value,
    (queues, priorities, keys): &Columns,
) -> Result<Inserted, Error> {
    let first = i64::try_from(first).unwrap_or(i64::MAX);
    // One round trip: the statement is parsed, bound and run at once (`query_typed`), as the
    // library's enqueue sends its own.
    let rows = client
        .query_typed(
            "WITH input AS (
                 SELECT $1::int8 + u.o - 1 AS g, u.queue, u.priority, u.concurrency_key,
                        gen_random_uuid() AS id
                   FROM unnest($4::text[], $5::int2[], $6::text[])
                        WITH ORDINALITY AS u(queue, priority, concurrency_key, o)
             ), intake AS (
                 INSERT INTO etl_job_intake
                        (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                         max_attempts, run_at, queue, priority)
                 SELECT id, sha256('bench'::bytea), sha256(g::text::bytea),
                        sha256(g::text::bytea), $2, 5, now(), queue, priority
                   FROM input
                 RETURNING id, owner_key, kind, max_attempts, run_at, queue, priority
             )
             INSERT INTO etl_job_records
                    (id, owner_key, kind, request_payload, max_attempts, run_at, queue, priority,
                     sort_at, concurrency_key)
             SELECT i.id, i.owner_key, i.kind, $3::jsonb, i.max_attempts, i.run_at, i.queue,
                    i.priority, durable_etl_sort_at(i.run_at, i.priority), n.concurrency_key
               FROM intake i
               JOIN input n ON n.id = i.id
             RETURNING id, xmin::text",
            &[
                (&first, Type::INT8),
                (&durable_etl::job::handler::NOOP_KIND, Type::TEXT),
                (payload, Type::JSONB),
                (queues, Type::TEXT_ARRAY),
                (priorities, Type::INT2_ARRAY),
                (keys, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    Ok(Inserted {
        ids: rows.iter().map(|r| r.get(0)).collect(),
        xmin: rows.first().map(|r| r.get(1)),
    })
}

/// Enqueues `n` ETL loads numbered from `first` through the library's enqueue, in one statement.
pub(super) async fn insert_loads(
    client: &tokio_postgres::Client,
    secret: &Secret,
    owner: &[u8; 32],
    first: usize,
    n: usize,
) -> Result<Vec<uuid::Uuid>, Error> {
    let requests = (first..first + n)
        .map(|job| {
            let records: Vec<serde_json::Value> = (0..RECORDS_PER_ETL_JOB)
                .map(|k| serde_json::json!({"id": format!("{job}-{k}"), "value": k}))
                .collect();
            let body = serde_json::json!({"dataset": "bench", "key": "id", "records": records});
            request::parse(&body, IntakeLimits::default())
                .map(|r| (job.to_string(), r))
                .map_err(Error::from)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let jobs: Vec<NewJob<'_>> = requests
        .iter()
        .map(|(key, request)| NewJob {
            idempotency_key: key,
            request,
            max_attempts: durable_etl::kinds::etl::enqueue::MAX_ATTEMPTS_DEFAULT,
            retain: None,
        })
        .collect();
    let enqueued = enqueue_many(client, secret, owner, &jobs).await?;
    Ok(enqueued.iter().map(|e| e.id).collect())
}

/// How long the job of a compute-phase recovery trial computes: long enough to be killed in
/// the middle of it, short enough for the replica that recovers it to finish it soon.
const COMPUTE_TRIAL_PAUSE_MS: u64 = 3000;

/// The numbers of the compute-phase trials' jobs start here, far from any burn-down's.
const COMPUTE_TRIAL_FIRST: usize = 1 << 40;

/// The times of a recovery bench, in milliseconds: SIGKILL of the replica running the job → a
/// live replica's claim of it (database clock), for a job caught in each phase.
pub(super) struct RecoveryTimes {
    /// The job was inside its effects (its load waiting for a row another session holds).
    pub(super) effects: Vec<f64>,
    /// The job was computing (a `noop` job pausing in its compute phase, no connection held).
    pub(super) compute: Vec<f64>,
}

/// Times `trials` recoveries of each phase. Effects phase: an ETL job is enqueued whose first
/// row another session holds, so its load waits inside its effects; the replica running it is
/// SIGKILLed; and the time until a live replica claims it again is read from the database
/// clock. Compute phase: the same for a `noop` job pausing [`COMPUTE_TRIAL_PAUSE_MS`] in its
/// compute phase. The killed replica is restarted only after that (its own restart would
/// release the job at once).
pub(super) async fn recoveries(
    db_config: &DatabaseConfig,
    client: &tokio_postgres::Client,
    replicas: &mut Replicas,
    trials: usize,
) -> Result<RecoveryTimes, Error> {
    let (secret, owner) = bench_owner()?;
    let mut times = RecoveryTimes {
        effects: Vec::with_capacity(trials),
        compute: Vec::with_capacity(trials),
    };
    for trial in 0..trials {
        // The job and its first target row are committed with the job deferred; then another
        // session locks that row, and only then does the job become due: its load must wait.
        let holder = db::connect(db_config, "bench").await?;
        holder.batch_execute("BEGIN").await?;
        let job = insert_loads(&holder, &secret, &owner, trial, 1).await?;
        let key = format!("{trial}-0");
        holder
            .execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES ($1::bytea, 'bench', $2, '{}', $3)",
                &[&owner.as_slice(), &key, &job.first()],
            )
            .await?;
        holder
            .execute(
                "UPDATE etl_job_records SET run_at = now() + interval '1 hour', sort_at = now() + interval '1 hour'
                  WHERE id = $1",
                &[&job.first()],
            )
            .await?;
        holder.batch_execute("COMMIT; BEGIN").await?;
        holder
            .execute(
                "SELECT 1 FROM etl_target_rows WHERE owner_key = $1 AND record_key = $2 FOR UPDATE",
                &[&owner.as_slice(), &key],
            )
            .await?;
        client
            .execute(
                "UPDATE etl_job_records SET run_at = now(), sort_at = now() WHERE id = $1",
                &[&job.first()],
            )
            .await?;
        times
            .effects
            .push(kill_and_time(client, replicas, job.first()).await?);
        drop(holder);
        let pause = serde_json::json!({ "pause_ms": COMPUTE_TRIAL_PAUSE_MS });
        let columns = Shape::default().columns(0, 1);
        let job = insert_noops(client, COMPUTE_TRIAL_FIRST + trial, &pause, &columns)
            .await?
            .ids;
        times
            .compute
            .push(kill_and_time(client, replicas, job.first()).await?);
    }
    Ok(times)
}

/// Wakes the replicas for `job` (due now), waits until one runs it, SIGKILLs that one, waits until
/// another claims the job, restarts the killed one, and returns the time from the kill to the
/// claim in milliseconds (database clock).
async fn kill_and_time(
    client: &tokio_postgres::Client,
    replicas: &mut Replicas,
    job: Option<&uuid::Uuid>,
) -> Result<f64, Error> {
    client
        .batch_execute("SELECT pg_notify('durable_etl_jobs', '')")
        .await?;
    let (running, _) = until_running(client, job, None).await?;
    let victim = running
        .strip_prefix("bench-")
        .and_then(|i| i.parse::<usize>().ok())
        .unwrap_or(0);
    let killed_at: f64 = client
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await?
        .get(0);
    replicas.kill(victim).await;
    let (_, reclaimed_at) = until_running(client, job, Some(&running)).await?;
    replicas.restart(victim).await?;
    Ok((reclaimed_at - killed_at) * 1000.0)
}

/// Waits (bounded) until `job` is running under an owner other than `not_owner`; returns that
/// owner and the claim's start (Unix seconds, database clock).
async fn until_running(
    client: &tokio_postgres::Client,
    job: Option<&uuid::Uuid>,
    not_owner: Option<&str>,
) -> Result<(String, f64), Error> {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let row = client
            .query_opt(
                "SELECT lease_owner_id, extract(epoch FROM started_at)::float8
                   FROM etl_job_records
                  WHERE id = $1 AND status = 'running' AND lease_owner_id IS DISTINCT FROM $2",
                &[&job, &not_owner],
            )
            .await?;
        if let Some(row) = row {
            return Ok((row.get(0), row.get(1)));
        }
        if Instant::now() > deadline {
            return Err(Error::Io(None));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
