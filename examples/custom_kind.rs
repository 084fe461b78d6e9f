//! A job kind of your own, and the runtime contract it relies on: offers that expire.
//!
//! An application keeps `example_offers`; each open offer has a deadline, and a deferred job of
//! kind [`KIND`] expires the offer when the deadline comes. The example shows, and checks:
//!
//! 1. **One transaction.** The offer and its expiry job are written in the caller's own
//!    transaction: a rollback removes both, a commit keeps both.
//! 2. **Recheck under the fence.** The job is deferred (`run_at` = the deadline). When it runs,
//!    its effects recheck the offer *inside the fenced transaction* (the one that also writes the
//!    job's `succeeded` outcome with its ledger) and expire it only if it is still open under the schedule the
//!    job was made for. An offer accepted meanwhile, or whose deadline was replaced by a new one
//!    (with a new job), is left alone: the stale job succeeds without changing anything.
//! 3. **Idempotent through the ledger.** The effects commit with the job's outcome and its
//!    response ledger or not at all, and once it exists the job has no live row left to run
//!    again; scheduling
//!    the same expiry twice (same idempotency key) finds the existing job instead of adding one.
//!
//! Run it against a PostgreSQL server (it creates its own database on `DATABASE_URL`'s server
//! and drops it at the end):
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example custom_kind
//! ```
//!
//! It exits 0 when every check holds and 1 when one does not.
//!
//! The library has no enqueue function for kinds other than its own ETL job, so the example
//! inserts its jobs itself, as the library's enqueue does: an intake row in `etl_job_intake` and
//! a live row with the payload in `etl_job_records`, with the columns the schema requires (the
//! owner, idempotency key and request are stored only as keyed digests). It reads jobs through
//! the `etl_jobs` view.

use chrono::{DateTime, Utc};
use durable_etl::digest::DigestKind;
use durable_etl::{
    db, jobs, migrate_up, shutdown, Code, DatabaseConfig, Effects, Handler, JobContext, JobError,
    JobState, LedgerEntry, Registry, Secret, Worker, WorkerConfig,
};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

/// The job kind this example adds.
const KIND: &str = "example.offer_expire";

/// The principal every job of the example belongs to.
const OWNER: &[u8] = b"example-shop";

/// The longest the example waits for its jobs to end.
const DEADLINE: Duration = Duration::from_secs(60);

/// The application's own table.
const DOMAIN_SQL: &str = "
CREATE TABLE example_offers (
    id               uuid        PRIMARY KEY,
    status           text        NOT NULL CHECK (status IN ('open', 'accepted', 'expired')),
    expires_at       timestamptz NOT NULL,
    schedule_version integer     NOT NULL,
    expired_by_job   uuid
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

/// Inserts one job of kind `$5` due at `$7` with at most `$8` attempts (its intake row and its
/// live row), unless the owner `$2` has a job with the same idempotency key digest `$3` already
/// (then it inserts nothing and returns no row). `$4` is the request's digest, `$6` the payload.
///
/// Locks: inserts two rows; a concurrent insert of the same owner and key waits for the other
/// transaction. The enqueue trigger notifies only for a job due now, so a deferred job is found
/// by the replicas' poll.
const ENQUEUE_SQL: &str = "
WITH accepted AS (
    INSERT INTO etl_job_intake
           (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts, run_at)
    VALUES ($1, $2, $3, $4, $5, $8, $7)
        ON CONFLICT (owner_key, idempotency_key_digest) DO NOTHING
    RETURNING id, owner_key, kind, max_attempts, run_at
)
INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
SELECT id, owner_key, kind, $6, max_attempts, run_at FROM accepted
RETURNING id";

/// The recheck and the transition, in one statement: offer `$1` expires (recording job `$3`)
/// only if it is still open under schedule version `$2`.
///
/// Locks: the offer's row (`FOR UPDATE` strength) until the job's fenced transaction ends. Under
/// READ COMMITTED the predicate is re-evaluated on the newest committed row once the lock is
/// granted, so an acceptance or a reschedule that committed first always wins.
const EXPIRE_SQL: &str = "
UPDATE example_offers
   SET status = 'expired', expired_by_job = $3
 WHERE id = $1 AND status = 'open' AND schedule_version = $2";

/// An offer's status and the job that expired it, if any.
///
/// Locks: none.
const OFFER_SQL: &str = "SELECT status, expired_by_job FROM example_offers WHERE id = $1";

/// How many offers have an id in `$1`, and how many jobs have an id in `$1` or are (live) for an
/// offer whose id is in `$2` (as text).
///
/// Locks: none.
const EXISTS_SQL: &str = "
SELECT (SELECT count(*) FROM example_offers WHERE id = ANY($1)),
       (SELECT count(*) FROM etl_job_intake i LEFT JOIN etl_job_records j ON j.id = i.id
         WHERE i.id = ANY($1) OR j.request_payload->>'offer_id' = ANY($2))";

/// Jobs of the example not yet ended, and jobs that started before they were due.
///
/// Locks: none.
const PROGRESS_SQL: &str = "
SELECT count(*) FILTER (WHERE status IN ('pending', 'running')),
       count(*) FILTER (WHERE started_at < run_at)
  FROM etl_jobs
 WHERE kind = $1";

/// The handler of [`KIND`]: reads which offer and schedule the job is for; the effects do the
/// rest.
struct ExpireOffer;

/// What one expiry job will do inside its fenced transaction.
struct Expiry {
    /// The offer.
    offer_id: Uuid,
    /// The schedule version the job was made for.
    version: i32,
    /// The job's own id, recorded on the offer it expires.
    job_id: Uuid,
}

impl Handler for ExpireOffer {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// Runs with no connection held: only parses the payload.
    fn prepare<'a>(
        &'a self,
        job: &'a JobContext,
        payload: Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            let offer_id = payload["offer_id"]
                .as_str()
                .and_then(|s| s.parse::<Uuid>().ok());
            let version = payload["version"]
                .as_i64()
                .and_then(|v| i32::try_from(v).ok());
            match (offer_id, version) {
                (Some(offer_id), Some(version)) => Ok(Box::new(Expiry {
                    offer_id,
                    version,
                    job_id: job.id,
                }) as Box<dyn Effects>),
                // A payload no attempt can use: fail the job at once, never retry it.
                _ => Err(JobError::permanent(Code::InvalidPayload)),
            }
        })
    }
}

impl Effects for Expiry {
    /// Runs inside the fenced transaction: the recheck, the transition and the job's `succeeded`
    /// outcome with its ledger commit together, or none of them does.
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<LedgerEntry>, JobError>> {
        Box::pin(async move {
            let changed = tx
                .execute(EXPIRE_SQL, &[&self.offer_id, &self.version, &self.job_id])
                .await?;
            let (rows_updated, rows_unchanged) = if changed == 1 { (1, 0) } else { (0, 1) };
            Ok(Some(LedgerEntry {
                rows_updated,
                rows_unchanged,
                ..LedgerEntry::default()
            }))
        })
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

/// What the example's scheduling needs: the secret for the digests and the owner's digest.
struct Scheduler {
    /// The key of the digests.
    secret: Secret,
    /// The owner's digest.
    owner: [u8; 32],
}

impl Scheduler {
    /// Enqueues the expiry of `offer_id` under schedule `version`, due at `due`, on `client` (the
    /// caller's transaction). `None` when that schedule was enqueued already (same idempotency
    /// key): the existing job stands.
    async fn enqueue_expiry(
        &self,
        client: &impl GenericClient,
        offer_id: Uuid,
        version: i32,
        due: DateTime<Utc>,
    ) -> Result<Option<Uuid>, Failure> {
        let key = format!("expire-{offer_id}-v{version}");
        let payload = json!({ "offer_id": offer_id.to_string(), "version": version });
        let key_digest = self
            .secret
            .digest(DigestKind::IdempotencyKey, key.as_bytes());
        let request = self
            .secret
            .digest(DigestKind::Request, payload.to_string().as_bytes());
        let row = client
            .query_opt(
                ENQUEUE_SQL,
                &[
                    &Uuid::now_v7(),
                    &&self.owner[..],
                    &&key_digest[..],
                    &&request[..],
                    &KIND,
                    &payload,
                    &due,
                    &durable_etl::etl::enqueue::MAX_ATTEMPTS_DEFAULT,
                ],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Opens an offer expiring in `ttl_ms` and enqueues its expiry, both on `tx`.
    async fn open_offer(&self, tx: &Transaction<'_>, ttl_ms: f64) -> Result<Offer, Failure> {
        let id = Uuid::new_v4();
        let row = tx.query_one(OPEN_OFFER_SQL, &[&id, &ttl_ms]).await?;
        let job = self
            .enqueue_expiry(tx, id, row.get(1), row.get(0))
            .await?
            .ok_or_else(|| Failure::Check("a new offer's expiry was enqueued".into()))?;
        Ok(Offer { id, job })
    }
}

/// An offer and its (first) expiry job.
#[derive(Debug, Clone, Copy)]
struct Offer {
    /// The offer's id.
    id: Uuid,
    /// Its expiry job.
    job: Uuid,
}

/// Records one check: prints it, and remembers a failure.
fn check(failures: &mut Vec<String>, what: &str, holds: bool) {
    println!("{} {what}", if holds { "ok  " } else { "FAIL" });
    if !holds {
        failures.push(what.to_owned());
    }
}

/// Creates the example's database, runs the example on it, drops it, and exits 0 only if every
/// check held.
#[tokio::main]
async fn main() -> ExitCode {
    let base = DatabaseConfig {
        url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned()),
        ..DatabaseConfig::default()
    };
    let name = format!(
        "durable_etl_example_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let outcome = match db::recreate_database(&base, &name).await {
        Ok(config) => {
            println!("example database: {name} (dropped at the end)");
            let outcome = run(&config).await;
            if db::drop_database(&base, &name).await.is_err() {
                eprintln!("could not drop {name}");
            }
            outcome
        }
        Err(e) => Err(Failure::from(e)),
    };
    match outcome {
        Ok(failures) if failures.is_empty() => {
            println!("every check holds");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            eprintln!(
                "{} check(s) failed: {}",
                failures.len(),
                failures.join("; ")
            );
            ExitCode::FAILURE
        }
        Err(failure) => {
            eprintln!("the example stopped: {failure}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the example on the database of `config`; returns the checks that failed.
async fn run(config: &DatabaseConfig) -> Result<Vec<String>, Failure> {
    let mut failures = Vec::new();
    let mut client = db::connect(config, "example").await?;
    migrate_up(&mut client).await?;
    client.batch_execute(DOMAIN_SQL).await?;
    let secret = Secret::new(Uuid::new_v4().simple().to_string().into_bytes())
        .ok_or_else(|| Failure::Check("a long enough secret".into()))?;
    let owner = secret.digest(DigestKind::Principal, OWNER);
    let scheduler = Scheduler { secret, owner };

    // 1. One transaction: rolled back, neither the offer nor its job exists.
    let tx = client.transaction().await?;
    let gone = scheduler.open_offer(&tx, 300.0).await?;
    tx.rollback().await?;
    let row = client
        .query_one(
            EXISTS_SQL,
            &[&vec![gone.id, gone.job], &vec![gone.id.to_string()]],
        )
        .await?;
    check(
        &mut failures,
        "a rolled-back transaction leaves neither the offer nor its job",
        (row.get::<_, i64>(0), row.get::<_, i64>(1)) == (0, 0),
    );

    // Committed: the offer and its expiry job exist together. `lapses` is left alone.
    let tx = client.transaction().await?;
    let lapses = scheduler.open_offer(&tx, 300.0).await?;
    tx.commit().await?;
    // `accepted` is accepted before its deadline.
    let tx = client.transaction().await?;
    let accepted = scheduler.open_offer(&tx, 300.0).await?;
    tx.commit().await?;
    client
        .execute(
            "UPDATE example_offers SET status = 'accepted' WHERE id = $1",
            &[&accepted.id],
        )
        .await?;
    // `extended` gets a new deadline and a new job before its first one is due.
    let tx = client.transaction().await?;
    let extended = scheduler.open_offer(&tx, 300.0).await?;
    tx.commit().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_one(RESCHEDULE_SQL, &[&extended.id, &600.0])
        .await?;
    let second_job = scheduler
        .enqueue_expiry(&tx, extended.id, row.get(1), row.get(0))
        .await?
        .ok_or_else(|| Failure::Check("the new schedule's job was enqueued".into()))?;
    tx.commit().await?;

    // 3. Scheduling the same expiry again finds the job already there.
    let again = scheduler
        .enqueue_expiry(&client, lapses.id, 1, Utc::now())
        .await?;
    check(
        &mut failures,
        "enqueueing the same schedule twice keeps one job",
        again.is_none(),
    );

    // 2. A replica runs the deferred jobs once they are due.
    let pool = durable_etl::connect_pool(config, "worker").await?;
    let worker_config = WorkerConfig {
        poll_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().register(ExpireOffer);
    let worker = Worker::start(pool, config, worker_config, registry).await?;
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(worker.run(until));
    let waited = tokio::time::Instant::now();
    let early = loop {
        let row = client.query_one(PROGRESS_SQL, &[&KIND]).await?;
        if row.get::<_, i64>(0) == 0 {
            break row.get::<_, i64>(1);
        }
        if waited.elapsed() > DEADLINE {
            return Err(Failure::Check(format!(
                "the jobs ended within {DEADLINE:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.request(shutdown::Stage::Draining);
    replica
        .await
        .map_err(|_| Failure::Check("the replica stopped without a panic".into()))??;
    check(
        &mut failures,
        "no job started before it was due",
        early == 0,
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

    // Every job succeeded, and its ledger summary says what its effects did.
    for (what, job, updated) in [
        ("the lapsed offer's job", lapses.job, 1),
        ("the accepted offer's job", accepted.job, 0),
        ("the replaced schedule's job", extended.job, 0),
        ("the new schedule's job", second_job, 1),
    ] {
        let status = jobs::status(&client, &scheduler.owner, job).await?;
        let ledger = status
            .as_ref()
            .and_then(|s| s.result.as_ref())
            .map(|r| (r.rows_updated, r.rows_unchanged));
        check(
            &mut failures,
            &format!(
                "{what} succeeded with ledger (updated, unchanged) = ({updated}, {})",
                1 - updated
            ),
            status.as_ref().map(|s| s.status) == Some(JobState::Succeeded)
                && ledger == Some((updated, 1 - updated)),
        );
    }
    let ledger_rows: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_jobs WHERE kind = $1 AND data_checksum IS NOT NULL",
            &[&KIND],
        )
        .await?
        .get(0);
    check(
        &mut failures,
        "one ledger per job: no effects committed twice",
        ledger_rows == 4,
    );
    Ok(failures)
}
