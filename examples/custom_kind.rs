//! A job kind of your own, and the runtime contract it relies on: offers that expire.
//!
//! An application keeps `example_offers`; each open offer has a deadline, and a deferred job of
//! kind [`ExpireOffer`] expires the offer when the deadline comes. The example uses only the
//! library's public API (`Job`, `Perform`, `Apply`, `Jobs`): no SQL against its tables. It
//! shows, and checks:
//!
//! 1. **One transaction.** The offer and its expiry job are written in the caller's own
//!    transaction: a rollback removes both, a commit keeps both.
//! 2. **Recheck under the fence.** The job is deferred (`run_at` = the deadline). When it runs,
//!    its effects recheck the offer *inside the fenced transaction* (the one that also records
//!    the job's success) and expire it only if it is still open under the schedule the job was
//!    made for. An offer accepted meanwhile, or whose deadline was replaced by a new one (with a
//!    new job), is left alone: the stale job succeeds without changing anything.
//! 3. **Effects once.** The effects commit with the job's success or not at all, so each job's
//!    effects are recorded exactly once (`example_offer_events`); scheduling the same expiry
//!    twice (same idempotency key) finds the existing job instead of adding one.
//!
//! Run it against a PostgreSQL server (it creates its own database on `DATABASE_URL`'s server
//! and drops it at the end):
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example custom_kind
//! ```
//!
//! It exits 0 when every check holds and 1 when one does not.

use chrono::{DateTime, Utc};
use durable_etl::{
    db, Apply, Code, DatabaseConfig, EnqueueOptions, Job, JobContext, JobError, JobState, Jobs,
    Perform, Registry, Secret, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::time::Duration;
use support::check;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

#[path = "support/mod.rs"]
mod support;

/// The principal every job of the example belongs to.
const OWNER: &str = "example-shop";

/// The longest the example waits for its jobs to end.
const DEADLINE: Duration = Duration::from_secs(60);

/// The application's own tables: the offers, and what each expiry job's effects did.
const DOMAIN_SQL: &str = "
CREATE TABLE example_offers (
    id               uuid        PRIMARY KEY,
    status           text        NOT NULL CHECK (status IN ('open', 'accepted', 'expired')),
    expires_at       timestamptz NOT NULL,
    schedule_version integer     NOT NULL,
    expired_by_job   uuid
);
CREATE TABLE example_offer_events (
    job_id   uuid    NOT NULL,
    offer_id uuid    NOT NULL,
    expired  boolean NOT NULL
)";

/// Opens offer `$1`, due to expire `$2` milliseconds from now, under schedule version 1.
///
/// Locks: inserts one row.
const OPEN_OFFER_SQL: &str = "
INSERT INTO example_offers (id, status, expires_at, schedule_version)
VALUES ($1, 'open', now() + $2 * interval '1 millisecond', 1)
RETURNING expires_at, schedule_version";

/// Moves offer `$1`'s deadline to `$2` milliseconds from now under a new schedule version.
///
/// Locks: the offer's row (`FOR UPDATE` strength), until the caller's transaction ends.
const RESCHEDULE_SQL: &str = "
UPDATE example_offers
   SET expires_at = now() + $2 * interval '1 millisecond', schedule_version = schedule_version + 1
 WHERE id = $1 AND status = 'open'
RETURNING expires_at, schedule_version";

/// The recheck and the transition, in one statement: offer `$1` expires (recording job `$3`)
/// only if it is still open under schedule version `$2`; either way the job's event is recorded.
///
/// Locks: the offer's row (`FOR UPDATE` strength) until the job's fenced transaction ends. Under
/// READ COMMITTED the predicate is re-evaluated on the newest committed row once the lock is
/// granted, so an acceptance or a reschedule that committed first always wins.
const EXPIRE_SQL: &str = "
WITH expired AS (
    UPDATE example_offers
       SET status = 'expired', expired_by_job = $3
     WHERE id = $1 AND status = 'open' AND schedule_version = $2
 RETURNING id
)
INSERT INTO example_offer_events (job_id, offer_id, expired)
SELECT $3, $1, EXISTS (SELECT 1 FROM expired)";

/// An offer's status and the job that expired it, if any.
///
/// Locks: none.
const OFFER_SQL: &str = "SELECT status, expired_by_job FROM example_offers WHERE id = $1";

/// The events job `$1`'s effects recorded: how many, and how many expired an offer.
///
/// Locks: none.
const EVENTS_SQL: &str =
    "SELECT count(*), count(*) FILTER (WHERE expired) FROM example_offer_events WHERE job_id = $1";

/// The job kind this example adds: expire one offer, if still open under one schedule.
#[derive(Debug, Serialize, Deserialize)]
struct ExpireOffer {
    /// The offer.
    offer_id: Uuid,
    /// The schedule version the job was made for.
    version: i32,
}

impl Job for ExpireOffer {
    const KIND: &'static str = "example.offer_expire";
}

/// The handler of [`ExpireOffer`]: nothing to compute; the effects do the rest.
struct Expirer;

impl Perform for Expirer {
    type Job = ExpireOffer;
    type Effects = ExpireOffer;

    /// Runs with no connection held.
    async fn compute(&self, job: ExpireOffer, _ctx: &JobContext) -> Result<ExpireOffer, JobError> {
        Ok(job)
    }
}

impl Apply for ExpireOffer {
    /// Runs inside the fenced transaction: the recheck, the transition, the event and the job's
    /// success commit together, or none of them does.
    async fn apply(self, tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        tx.execute(EXPIRE_SQL, &[&self.offer_id, &self.version, &job.id])
            .await?;
        Ok(())
    }
}

/// Why the example stopped early.
#[derive(Debug)]
enum Failure {
    /// The library failed; only its stable code is shown.
    Library(Code),
    /// A database statement of the example failed.
    Database,
    /// A check did not hold.
    Check(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Library(code) => write!(f, "durable-etl failed [{code}]"),
            Failure::Database => f.write_str("a statement of the example failed"),
            Failure::Check(what) => write!(f, "this did not hold: {what}"),
        }
    }
}

impl From<durable_etl::Error> for Failure {
    fn from(e: durable_etl::Error) -> Failure {
        Failure::Library(e.code())
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(_: tokio_postgres::Error) -> Failure {
        Failure::Database
    }
}

/// Enqueues the expiry of `offer_id` under schedule `version`, due at `due`, on `client` (the
/// caller's transaction), under an idempotency key of that schedule: the job's id, and whether
/// it existed already.
async fn enqueue_expiry(
    jobs: &Jobs,
    client: &impl GenericClient,
    (offer_id, version): (Uuid, i32),
    due: DateTime<Utc>,
) -> Result<(Uuid, bool), Failure> {
    let key = format!("expire-{offer_id}-v{version}");
    let options = EnqueueOptions {
        run_at: Some(due),
        idempotency_key: Some(&key),
        ..EnqueueOptions::default()
    };
    let job = ExpireOffer { offer_id, version };
    let queued = jobs.enqueue(client, &job, options).await?;
    Ok((queued.id, queued.replayed))
}

/// Opens an offer expiring in `ttl_ms` and enqueues its expiry, both on `tx`.
async fn open_offer(jobs: &Jobs, tx: &Transaction<'_>, ttl_ms: f64) -> Result<Offer, Failure> {
    let id = Uuid::new_v4();
    let row = tx.query_one(OPEN_OFFER_SQL, &[&id, &ttl_ms]).await?;
    let (job, _) = enqueue_expiry(jobs, tx, (id, row.get(1)), row.get(0)).await?;
    Ok(Offer { id, job })
}

/// An offer and its (first) expiry job.
#[derive(Debug, Clone, Copy)]
struct Offer {
    /// The offer's id.
    id: Uuid,
    /// Its expiry job.
    job: Uuid,
}

/// Runs the example on a database of its own (dropped at the end); exits 0 only if every check
/// held.
#[tokio::main]
async fn main() -> ExitCode {
    support::on_fresh_database(|config| async move { run(&config).await }).await
}

/// Runs the example on the database of `config`; returns the checks that failed.
async fn run(config: &DatabaseConfig) -> Result<Vec<String>, Failure> {
    let mut failures = Vec::new();
    durable_etl::migrate(config).await?;
    let mut client = db::connect(config, "example").await?;
    client.batch_execute(DOMAIN_SQL).await?;
    let secret = Secret::new(Uuid::new_v4().simple().to_string())
        .ok_or_else(|| Failure::Check("a long enough secret".into()))?;
    let jobs = Jobs::new(secret, OWNER);

    // 1. One transaction: rolled back, neither the offer nor its job exists.
    let tx = client.transaction().await?;
    let gone = open_offer(&jobs, &tx, 300.0).await?;
    tx.rollback().await?;
    let offer_rows = client.query(OFFER_SQL, &[&gone.id]).await?.len();
    check(
        &mut failures,
        "a rolled-back transaction leaves neither the offer nor its job",
        offer_rows == 0 && jobs.status(&client, gone.job).await?.is_none(),
    );

    // Committed: the offer and its expiry job exist together. `lapses` is left alone.
    let tx = client.transaction().await?;
    let lapses = open_offer(&jobs, &tx, 300.0).await?;
    tx.commit().await?;
    // `accepted` is accepted before its deadline.
    let tx = client.transaction().await?;
    let accepted = open_offer(&jobs, &tx, 300.0).await?;
    tx.commit().await?;
    client
        .execute(
            "UPDATE example_offers SET status = 'accepted' WHERE id = $1",
            &[&accepted.id],
        )
        .await?;
    // `extended` gets a new deadline and a new job before its first one is due.
    let tx = client.transaction().await?;
    let extended = open_offer(&jobs, &tx, 300.0).await?;
    tx.commit().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_one(RESCHEDULE_SQL, &[&extended.id, &600.0])
        .await?;
    let (second_job, _) = enqueue_expiry(&jobs, &tx, (extended.id, row.get(1)), row.get(0)).await?;
    tx.commit().await?;

    // 3. Scheduling the same expiry again finds the job already there.
    let due = jobs.status(&client, lapses.job).await?.map(|s| s.run_at);
    let due = due
        .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        .ok_or_else(|| Failure::Check("the lapsing offer's job is due".into()))?;
    let again = enqueue_expiry(&jobs, &client, (lapses.id, 1), due).await?;
    check(
        &mut failures,
        "enqueueing the same schedule twice keeps one job",
        again == (lapses.job, true),
    );

    // 2. A replica runs the deferred jobs once they are due.
    let pool = durable_etl::connect_pool(config, "worker").await?;
    let worker_config = WorkerConfig {
        poll_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(Expirer);
    let replica = Worker::start(pool, config, worker_config, registry)
        .await?
        .spawn();
    let all = [lapses.job, accepted.job, extended.job, second_job];
    let waited = tokio::time::Instant::now();
    let mut ended = Vec::new();
    while ended.len() < all.len() {
        ended.clear();
        for job in all {
            match jobs.status(&client, job).await? {
                Some(status) if !status.is_active() => ended.push(status),
                _ => {}
            }
        }
        if waited.elapsed() > DEADLINE {
            return Err(Failure::Check(format!(
                "the jobs ended within {DEADLINE:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.stop().await?;
    let early = ended.iter().filter(|s| {
        let at = |t: &str| t.parse::<DateTime<Utc>>().ok();
        s.started_at.as_deref().and_then(at) < at(&s.run_at)
    });
    check(
        &mut failures,
        "no job started before it was due",
        early.count() == 0,
    );

    let offer = |id: Uuid| {
        let client = &client;
        async move {
            let row = client.query_one(OFFER_SQL, &[&id]).await?;
            Ok::<(String, Option<Uuid>), Failure>((row.get(0), row.get(1)))
        }
    };
    check(
        &mut failures,
        "an offer left open expires, by its job",
        offer(lapses.id).await? == ("expired".to_owned(), Some(lapses.job)),
    );
    check(
        &mut failures,
        "an offer accepted before its deadline stays accepted",
        offer(accepted.id).await? == ("accepted".to_owned(), None),
    );
    check(
        &mut failures,
        "a rescheduled offer expires by its new job, not the replaced one",
        offer(extended.id).await? == ("expired".to_owned(), Some(second_job)),
    );

    // Every job succeeded, and its effects were recorded exactly once.
    for (what, job, expired) in [
        ("the lapsed offer's job", lapses.job, 1),
        ("the accepted offer's job", accepted.job, 0),
        ("the replaced schedule's job", extended.job, 0),
        ("the new schedule's job", second_job, 1),
    ] {
        let status = jobs.status(&client, job).await?.map(|s| s.status);
        let row = client.query_one(EVENTS_SQL, &[&job]).await?;
        let events: (i64, i64) = (row.get(0), row.get(1));
        check(
            &mut failures,
            &format!("{what} succeeded, its effects recorded once (expired: {expired})"),
            status == Some(JobState::Succeeded) && events == (1, expired),
        );
    }
    Ok(failures)
}
