//! `bench dead-letters`: what replaying dead letters and listing them cost, in one run, every
//! count read from the database.
//!
//! 1. **Listing** (`letter_pages`): a history of `history` ended jobs, one in ten failed, then
//!    pages of the letters' listing timed with no filter and with an owner, a queue and a code
//!    filter, at the first page and deep into the letters.
//! 2. **Letters**: `letters` `noop` jobs enqueued through the library for [`RETAINED_OWNER`], by a
//!    handle that retains the kind's payloads sealed, and `letters` more for
//!    [`RESUBMITTED_OWNER`] with idempotency keys (so each keeps its request fingerprint), each
//!    with a payload of its own; then all of them ended `failed` with their letters by one
//!    statement of the bench's, [`FAIL_SQL`], the statements the fenced failure runs (its
//!    outcome, its letter), not by running a handler that fails: the letters are what a failure
//!    leaves, made in a second rather than a run.
//! 3. **Replays**, no replica running: the retained letters by one call of
//!    [`DeadLetters::replay_matching`] (what the HTTP API's bulk replay calls: transactions of
//!    200), on one connection; then the resubmitted letters one by one by
//!    [`DeadLetters::replay`] with their bodies sent again (fingerprint-checked), from
//!    `connections` connections taking every `connections`-th letter each. Each is timed from
//!    its first call to its last answer (this process's clock).
//! 4. **Run**: the replicas start and run every job the replays made; the bench waits until no
//!    job is live, then reads how many of the replayed jobs succeeded, and over how long.
//!
//! Invariants this module keeps:
//! - Jobs are enqueued and letters replayed only through the library's public API; the bench's
//!   own statements make the history and end the jobs (set-up, untimed) and read figures.
//! - Every count is the database's: letters replayed, distinct jobs they name, jobs of each
//!   owner beyond its letters (a duplicate would show there), and those jobs' outcomes.
//! - Every wait is bounded ([`WAIT_LIMIT`]); the replicas are stopped whatever happened.
//!
//! [`DeadLetters::replay_matching`]: durable_etl::dead_letters::DeadLetters::replay_matching
//! [`DeadLetters::replay`]: durable_etl::dead_letters::DeadLetters::replay

use super::config::{BenchConfig, Mode, WAIT_LIMIT};
use super::letter_pages::{self, History, ListingFigures};
use super::load::bench_owner;
use super::replicas::Replicas;
use super::saturate::until_done;
use durable_etl::config::DatabaseConfig;
use durable_etl::db;
use durable_etl::dead_letters::{LetterFilter, PayloadKey, Retention};
use durable_etl::error::Error;
use durable_etl::job::handler::NOOP_KIND;
use durable_etl::{EnqueueOptions, Job, Jobs};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;

/// The owner of the letters replayed from their retained payloads.
const RETAINED_OWNER: &str = "bench-retained";

/// The owner of the letters replayed with their bodies sent again.
const RESUBMITTED_OWNER: &str = "bench-resubmitted";

/// The id of the key the retained payloads are sealed under.
const KEY_ID: &str = "bench-k1";

/// Who the replays say asked for them.
const REPLAYED_BY: &str = "bench";

/// Jobs per call of the library's batch enqueue while making the letters.
const ENQUEUE_BATCH: usize = 1_000;

/// The session role of the connections that replay letters one by one.
const REPLAY_ROLE: &str = "bench-replay";

/// Ends every live job of owners `$1` `failed` (`attempts_exhausted`, its attempts used up) with
/// its letter: the statements of the fenced failure (`durable_etl::sql`'s outcome and letter), on
/// jobs no replica claimed.
///
/// Locks: deletes the owners' live rows (none is claimed: no replica runs yet); inserts their
/// outcomes and letters (the letters' foreign keys take `FOR KEY SHARE` on the intake rows).
const FAIL_SQL: &str = "
WITH ended AS (
    DELETE FROM etl_job_records j WHERE j.owner_key = ANY($1::bytea[])
    RETURNING j.id, j.owner_key, j.max_attempts, j.run_at, j.started_at, j.lease_claim_id
), outcome AS (
    INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at, lease_claim_id,
                                  failure_code, started_at, finished_at)
    SELECT id, owner_key, 'failed', max_attempts, run_at, lease_claim_id, 'attempts_exhausted',
           started_at, statement_timestamp()
      FROM ended
    RETURNING job_id, owner_key, failure_code, attempts, finished_at
)
INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts, failed_at)
SELECT o.job_id, o.owner_key, i.queue, i.kind, o.failure_code, o.attempts, o.finished_at
  FROM outcome o JOIN etl_job_intake i ON i.id = o.job_id";

/// Owner `$1`'s letters: how many, how many were replayed, how many distinct jobs they name,
/// how many of those succeeded, and the owner's jobs beyond its letters (the replays' jobs).
///
/// Locks: none (a read).
const MADE_SQL: &str = "
SELECT count(*), count(l.replayed_job_id), count(DISTINCT l.replayed_job_id),
       count(*) FILTER (WHERE o.status = 'succeeded'),
       (SELECT count(*) FROM etl_job_intake i WHERE i.owner_key = $1::bytea) - count(*)
  FROM etl_dead_letters l
  LEFT JOIN etl_job_outcomes o ON o.job_id = l.replayed_job_id
 WHERE l.owner_key = $1::bytea";

/// The outcomes of the jobs replayed from the letters of owners `$1`: succeeded, other, and the
/// seconds from the first start to the last end (database clock).
///
/// Locks: none (a read).
const RUN_SQL: &str = "
SELECT count(*) FILTER (WHERE o.status = 'succeeded'),
       count(*) FILTER (WHERE o.status <> 'succeeded'),
       coalesce(extract(epoch FROM max(o.finished_at) - min(o.started_at))::float8, 0)
  FROM etl_dead_letters l JOIN etl_job_outcomes o ON o.job_id = l.replayed_job_id
 WHERE l.owner_key = ANY($1::bytea[])";

/// The payload of a letter's job: the built-in `noop` kind, which ignores it, numbered so every
/// job has a payload (and a fingerprint) of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LetterJob {
    /// The job's number.
    n: u64,
}

impl Job for LetterJob {
    const KIND: &'static str = NOOP_KIND;
    const MAX_ATTEMPTS: i32 = 5;
}

/// One replay variant's figures.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct ReplayFigures {
    /// Letters made for it.
    pub(crate) letters: u64,
    /// Jobs the replay calls said they made.
    pub(crate) made: u64,
    /// Connections the replays ran on.
    pub(crate) connections: usize,
    /// From the first call to the last answer, in seconds.
    pub(crate) seconds: f64,
    /// `made / seconds`.
    pub(crate) jobs_per_s: f64,
    /// Letters marked replayed (database).
    pub(crate) replayed: u64,
    /// Distinct jobs the letters name.
    pub(crate) distinct_jobs: u64,
    /// The owner's jobs beyond its letters: the jobs the replays made (a duplicate would count).
    pub(crate) owner_jobs_made: i64,
    /// Of the jobs the letters name, those that ended `succeeded`.
    pub(crate) succeeded: u64,
}

/// The replayed jobs' run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct RunFigures {
    /// Replica processes.
    pub(crate) replicas: usize,
    /// Replayed jobs that ended `succeeded`.
    pub(crate) succeeded: u64,
    /// Replayed jobs that ended otherwise (should be 0).
    pub(crate) not_succeeded: u64,
    /// From the first start to the last end, in seconds (database clock).
    pub(crate) seconds: f64,
    /// `succeeded / seconds`.
    pub(crate) jobs_per_s: f64,
    /// From the replicas' start to no job live, in seconds (this process's clock, the replicas'
    /// start-up included).
    pub(crate) wall_s: f64,
}

/// The figures of `bench dead-letters`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DeadLetterFigures {
    /// How the letters were made: always `sql` (see the module doc).
    pub(crate) failed_by: &'static str,
    /// The history the listings page through.
    pub(crate) history: History,
    /// The letters replayed from their retained payloads, in bulk.
    pub(crate) retained: ReplayFigures,
    /// What the bulk replay said it left: letters without a retained payload, and unreadable.
    pub(crate) retained_left: (u64, u64),
    /// The letters replayed one by one with their bodies.
    pub(crate) resubmitted: ReplayFigures,
    /// The replayed jobs' run.
    pub(crate) run: RunFigures,
    /// The listings' page times.
    pub(crate) listing: Vec<ListingFigures>,
}

/// What a run asks for, from its [`Mode::DeadLetters`].
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Letters per variant.
    letters: usize,
    /// Ended jobs in the history.
    history: usize,
    /// Pages timed per listing and depth.
    pages: usize,
    /// Letters per page.
    page_size: usize,
    /// Connections of the one-by-one replays.
    connections: usize,
}

/// Migrates the database of `db_config` and runs `bench dead-letters` on it (see the module
/// doc); `client` is the bench's session in it.
///
/// # Errors
/// [`Error::Io`] when a replica cannot be started or the jobs do not end within [`WAIT_LIMIT`];
/// [`Error::Internal`] for a config of another mode or a replay task that panicked; database
/// errors.
pub(super) async fn measure(
    db_config: &DatabaseConfig,
    mut client: tokio_postgres::Client,
    config: &BenchConfig,
) -> Result<DeadLetterFigures, Error> {
    durable_etl::schema::migrate_session(&mut client, db_config).await?;
    let Mode::DeadLetters {
        letters,
        history,
        pages,
        page_size,
        connections,
    } = config.mode
    else {
        return Err(Error::Internal);
    };
    let plan = Plan {
        letters,
        history,
        pages,
        page_size,
        connections: connections.max(1),
    };
    let (secret, _) = bench_owner()?;
    let history = letter_pages::fill(&client, &secret, plan.history).await?;
    let listing = letter_pages::time_pages(&client, &secret, plan.pages, plan.page_size).await?;

    let key = PayloadKey::derive(&secret, KEY_ID).ok_or(Error::Internal)?;
    let retaining =
        Jobs::new(secret.clone(), RETAINED_OWNER).retaining(Retention::new(key).kind(NOOP_KIND));
    let keyed = Jobs::new(secret, RESUBMITTED_OWNER);
    let ids = make_letters(&client, &retaining, &keyed, plan.letters).await?;

    let started = Instant::now();
    let bulk = retaining
        .dead_letters()
        .replay_matching(&mut client, &LetterFilter::default(), REPLAYED_BY)
        .await?;
    let retained_s = started.elapsed().as_secs_f64();
    let (resubmitted_made, resubmitted_s) =
        resubmit(db_config, &keyed, ids, plan.connections).await?;

    let owners = vec![retaining.owner_key().to_vec(), keyed.owner_key().to_vec()];
    let run = run(db_config, &client, config, &owners).await?;
    let retained = made(&client, &retaining, (bulk.made, retained_s, 1)).await?;
    let resubmitted = made(
        &client,
        &keyed,
        (resubmitted_made, resubmitted_s, plan.connections),
    )
    .await?;
    Ok(DeadLetterFigures {
        failed_by: "sql",
        history,
        retained,
        retained_left: (bulk.not_retained, bulk.unreadable),
        resubmitted,
        run,
        listing,
    })
}

/// Enqueues `letters` jobs through `retaining` (their payloads retained) and as many through
/// `keyed` with idempotency keys, then ends them all `failed` with their letters ([`FAIL_SQL`]);
/// returns the ids of `keyed`'s jobs (its letters), in their jobs' numbers' order.
async fn make_letters(
    client: &tokio_postgres::Client,
    retaining: &Jobs,
    keyed: &Jobs,
    letters: usize,
) -> Result<Vec<Uuid>, Error> {
    let total = letters as u64;
    let mut ids = Vec::with_capacity(letters);
    let mut first = 0;
    while first < total {
        let last = (first + ENQUEUE_BATCH as u64).min(total);
        let jobs: Vec<LetterJob> = (first..last).map(|n| LetterJob { n }).collect();
        let keys: Vec<String> = (first..last).map(|n| format!("bench-letter-{n}")).collect();
        let plain = jobs.iter().map(|job| (job, EnqueueOptions::default()));
        retaining.enqueue_many_with(client, plain).await?;
        let with_keys = jobs.iter().zip(&keys).map(|(job, key)| {
            let options = EnqueueOptions {
                idempotency_key: Some(key),
                ..EnqueueOptions::default()
            };
            (job, options)
        });
        let enqueued = keyed.enqueue_many_with(client, with_keys).await?;
        ids.extend(enqueued.iter().map(|e| e.id));
        first = last;
    }
    let owners = vec![retaining.owner_key().to_vec(), keyed.owner_key().to_vec()];
    client.execute(FAIL_SQL, &[&owners]).await?;
    client
        .batch_execute("ANALYZE etl_dead_letters, etl_retained_payloads, etl_job_intake")
        .await?;
    Ok(ids)
}

/// Replays `keyed`'s letters `ids` one by one with their bodies (letter `n`'s is the payload of
/// job `n`, as [`make_letters`] enqueued them), from `connections` connections of their own,
/// opened before the clock starts; returns how many jobs the calls made and the seconds from the
/// first call to the last answer.
async fn resubmit(
    db_config: &DatabaseConfig,
    keyed: &Jobs,
    ids: Vec<Uuid>,
    connections: usize,
) -> Result<(u64, f64), Error> {
    let mut shares: Vec<Vec<(Uuid, serde_json::Value)>> = vec![Vec::new(); connections];
    for (n, id) in ids.into_iter().enumerate() {
        let body = serde_json::to_value(LetterJob { n: n as u64 }).map_err(|_| Error::Internal)?;
        shares[n % connections].push((id, body));
    }
    let mut sessions = Vec::with_capacity(connections);
    for _ in 0..connections {
        sessions.push(db::connect(db_config, REPLAY_ROLE).await?);
    }
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(connections);
    for (mut session, share) in sessions.into_iter().zip(shares) {
        let letters = keyed.dead_letters();
        tasks.push(tokio::spawn(async move {
            let mut made = 0;
            for (id, body) in &share {
                let replayed = letters
                    .replay(&mut session, *id, REPLAYED_BY, Some(body))
                    .await?;
                made += u64::from(replayed.made);
            }
            Ok::<u64, Error>(made)
        }));
    }
    let mut made = 0;
    for task in tasks {
        made += task.await.map_err(|_| Error::Internal)??;
    }
    Ok((made, started.elapsed().as_secs_f64()))
}

/// Starts the replicas, waits until no job is live, stops them, and reads the run of the jobs
/// replayed from the letters of `owners`.
async fn run(
    db_config: &DatabaseConfig,
    client: &tokio_postgres::Client,
    config: &BenchConfig,
    owners: &[Vec<u8>],
) -> Result<RunFigures, Error> {
    let started = Instant::now();
    let mut replicas = Replicas::start(db_config, config).await?;
    let waited = until_done(client, None, WAIT_LIMIT).await;
    let wall_s = started.elapsed().as_secs_f64();
    replicas.stop().await;
    // Removes the files of handler starts the replicas wrote, if the run records them.
    drop(replicas.handler_starts());
    waited?;
    let row = client.query_one(RUN_SQL, &[&owners]).await?;
    let (succeeded, other, seconds): (i64, i64, f64) = (row.get(0), row.get(1), row.get(2));
    let succeeded = u64::try_from(succeeded).unwrap_or(0);
    Ok(RunFigures {
        replicas: config.replicas,
        succeeded,
        not_succeeded: u64::try_from(other).unwrap_or(0),
        seconds,
        jobs_per_s: rate(succeeded, seconds),
        wall_s,
    })
}

/// The figures of the replays of `jobs`' owner's letters, which the calls on `connections`
/// connections said made `made` jobs in `seconds`.
async fn made(
    client: &tokio_postgres::Client,
    jobs: &Jobs,
    (made, seconds, connections): (u64, f64, usize),
) -> Result<ReplayFigures, Error> {
    let row = client
        .query_one(MADE_SQL, &[&&jobs.owner_key()[..]])
        .await?;
    let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    Ok(ReplayFigures {
        letters: count(0),
        made,
        connections,
        seconds,
        jobs_per_s: rate(made, seconds),
        replayed: count(1),
        distinct_jobs: count(2),
        owner_jobs_made: row.get(4),
        succeeded: count(3),
    })
}

/// `n / seconds`, 0 for an empty span.
fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

impl DeadLetterFigures {
    /// The figures as aligned lines (a 21-character name, then the value).
    pub(crate) fn to_text(&self) -> String {
        let h = &self.history;
        let mut out = format!(
            "history              {} ended jobs, {} failed (letters over {} owners, {} queues, \
             {} codes), filled and analyzed in {:.1} s\n\
             letters made         noop jobs enqueued through the library, ended failed by \
             {} (the failure's own statements)\n",
            h.ended,
            h.failed,
            letter_pages::OWNERS,
            letter_pages::QUEUES.len(),
            letter_pages::CODES.len(),
            h.fill_s,
            self.failed_by,
        );
        for (name, how, r) in [
            (
                "replay retained",
                "replay_matching, sealed payloads",
                &self.retained,
            ),
            (
                "replay resubmitted",
                "replay with the body, fingerprint-checked",
                &self.resubmitted,
            ),
        ] {
            out.push_str(&format!(
                "{name:<21}{} of {} letters made jobs in {:.3} s: {:.0} jobs/s ({how}, {} \
                 connection(s)); {} replayed, {} distinct jobs, {} jobs made, {} succeeded\n",
                r.made,
                r.letters,
                r.seconds,
                r.jobs_per_s,
                r.connections,
                r.replayed,
                r.distinct_jobs,
                r.owner_jobs_made,
                r.succeeded,
            ));
        }
        let run = &self.run;
        out.push_str(&format!(
            "run to success       {} succeeded, {} not, in {:.3} s (first start to last end): \
             {:.0} jobs/s; {:.3} s from the start of {} replica(s) to no job live\n",
            run.succeeded, run.not_succeeded, run.seconds, run.jobs_per_s, run.wall_s, run.replicas,
        ));
        for l in &self.listing {
            out.push_str(&format!(
                "{:<21}first page p50 {:.3}  p99 {:.3}  max {:.3} ms; deep p50 {:.3}  p99 {:.3}  \
                 max {:.3} ms ({} pages of {} from letter {} of {}; {}{})\n",
                format!("list, filter {}", l.filter),
                l.first_page_ms.p50,
                l.first_page_ms.p99,
                l.first_page_ms.max,
                l.deep_page_ms.p50,
                l.deep_page_ms.p99,
                l.deep_page_ms.max,
                l.deep_page_ms.samples,
                l.page_size,
                l.deep_from,
                l.letters,
                l.index,
                if l.sorts_or_scans {
                    ", sorts or scans"
                } else {
                    ""
                },
            ));
        }
        out
    }
}
