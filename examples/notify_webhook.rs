//! A notification kind that delivers to an outside system: the other half of the runtime
//! contract, where the effect is not a PostgreSQL write.
//!
//! The outside system here is a stub HTTP server on a local port that, like a payment or mail
//! API, deduplicates requests by their `Idempotency-Key` and refuses a request whose fencing
//! token is lower than the highest it has seen for the same job. The handler posts the
//! notification in its compute phase (no connection held), with the key
//! `<job id>:<fencing token>`; the first request finds the system busy (`503`), so the job fails
//! transiently and its retry delivers. Its effects then mark the notification sent in the
//! application's own table, inside the fenced transaction that records the job's success.
//!
//! What the retries guarantee, and what they do not:
//! - **Inside PostgreSQL, exactly once**: the `sent` mark commits with the job's success, under
//!   the claim's fence, or not at all.
//! - **Outside, at least once**: a replica can die after the outside system accepted the request
//!   and before that commit; the job then runs again under a new claim, with a higher fencing
//!   token, and delivers again. durable-etl does not promise exactly-once delivery to an outside
//!   system. The key lets the outside system drop a repeat of one attempt's request (its own
//!   client retrying); the token lets it refuse an attempt that stalled past its lease after a
//!   newer one ran. Deduplicating the notification itself across attempts is the outside
//!   system's business (key it by the job id alone, if it may), and so are its own retries.
//!
//! Run it against a PostgreSQL server (it creates its own database on `DATABASE_URL`'s server
//! and drops it at the end): `cargo run --example notify_webhook`. It exits 0 when every check
//! holds.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use durable_etl::{
    db, Apply, Code, DatabaseConfig, EnqueueOptions, Job, JobContext, JobError, JobState, Jobs,
    Perform, Registry, Secret, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::check;
use tokio_postgres::Transaction;
use uuid::Uuid;

#[path = "support/mod.rs"]
mod support;

/// The job: notify a user.
#[derive(Debug, Serialize, Deserialize)]
struct Notify {
    /// The application's notification row.
    notification_id: i64,
    /// What to say.
    text: String,
}

impl Job for Notify {
    const KIND: &'static str = "example.notify";
    const MAX_ATTEMPTS: i32 = 4;
}

/// What the stub outside system has seen.
#[derive(Debug, Default)]
struct Outside {
    /// Every request's status, in order: `(job id, fencing token, status)`.
    requests: Vec<(Uuid, i64, u16)>,
    /// Accepted deliveries by idempotency key.
    delivered: HashMap<String, String>,
    /// The highest fencing token seen per job.
    highest: HashMap<Uuid, i64>,
    /// Requests still to refuse as busy.
    busy: u32,
}

/// The stub's one endpoint: `POST /notifications` with `Idempotency-Key: <job id>:<token>`.
async fn receive(
    State(outside): State<Arc<Mutex<Outside>>>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Some((job, token)) = key
        .split_once(':')
        .and_then(|(j, t)| Some((j.parse::<Uuid>().ok()?, t.parse::<i64>().ok()?)))
    else {
        return StatusCode::BAD_REQUEST;
    };
    let mut o = outside
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let status = if o.highest.get(&job).is_some_and(|&h| token < h) {
        StatusCode::CONFLICT
    } else if o.busy > 0 {
        o.busy -= 1;
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        o.delivered.entry(key).or_insert(body);
        StatusCode::OK
    };
    let highest = o.highest.entry(job).or_insert(token);
    *highest = (*highest).max(token);
    o.requests.push((job, token, status.as_u16()));
    status
}

/// Delivers notifications to the outside system at `url`.
struct Notifier {
    /// The HTTP client.
    http: reqwest::Client,
    /// The outside system's endpoint.
    url: String,
}

impl Perform for Notifier {
    type Job = Notify;
    type Effects = MarkSent;

    /// Posts the notification, holding no connection; a refusal that may pass is transient.
    async fn compute(&self, job: Notify, ctx: &JobContext) -> Result<MarkSent, JobError> {
        let key = format!("{}:{}", ctx.id, ctx.fencing_token);
        let sent = self
            .http
            .post(&self.url)
            .header("Idempotency-Key", key)
            .body(job.text)
            .send()
            .await
            .map_err(JobError::transient)?;
        match sent.status().as_u16() {
            200..=299 => Ok(MarkSent(job.notification_id)),
            // A newer attempt delivered: this claim is stale, so its fenced commit would match
            // nothing anyway; say so without retrying.
            409 => Err(JobError::permanent(Code::HandlerFailed)),
            status => Err(JobError::transient(format!(
                "outside system answered {status}"
            ))),
        }
    }
}

/// Marks notification `.0` sent, inside the fenced transaction.
struct MarkSent(i64);

impl Apply for MarkSent {
    async fn apply(self, tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        tx.execute(
            "UPDATE notifications SET sent_by_job = $2 WHERE id = $1",
            &[&self.0, &job.id],
        )
        .await?;
        Ok(())
    }
}

/// Runs the example on the database of `config`; returns the checks that failed.
async fn run(config: &DatabaseConfig) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let outside = Arc::new(Mutex::new(Outside {
        busy: 1,
        ..Outside::default()
    }));
    let app = axum::Router::new()
        .route("/notifications", axum::routing::post(receive))
        .with_state(Arc::clone(&outside));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/notifications", listener.local_addr()?);
    let stub = tokio::spawn(async move { axum::serve(listener, app).await });

    durable_etl::migrate(config).await?;
    let mut client = db::connect(config, "example").await?;
    client
        .batch_execute("CREATE TABLE notifications (id int8 PRIMARY KEY, sent_by_job uuid)")
        .await?;
    let jobs = Jobs::new(
        Secret::new(Uuid::new_v4().to_string()).ok_or("secret")?,
        "app",
    );
    let tx = client.transaction().await?;
    tx.execute("INSERT INTO notifications VALUES (1, NULL)", &[])
        .await?;
    let notify = Notify {
        notification_id: 1,
        text: "your order shipped".into(),
    };
    let job = jobs
        .enqueue(&tx, &notify, EnqueueOptions::default())
        .await?;
    tx.commit().await?;

    let worker_config = WorkerConfig {
        retry_min_delay: Duration::from_millis(50),
        retry_max_delay: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let notifier = Notifier {
        http: reqwest::Client::new(),
        url: url.clone(),
    };
    let pool = durable_etl::connect_pool(config, "worker").await?;
    let registry = Registry::new().perform(notifier);
    let replica = Worker::start(pool, config, worker_config, registry)
        .await?
        .spawn();
    let ended = loop {
        let status = jobs.status(&client, job.id).await?.ok_or("no such job")?;
        if !status.is_active() {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    replica.stop().await?;

    let mut failures = Vec::new();
    check(
        &mut failures,
        "the job succeeded on its second attempt, after the outside system was busy",
        ended.status == JobState::Succeeded && ended.attempts == 2,
    );
    let sent: Option<Uuid> = client
        .query_one("SELECT sent_by_job FROM notifications WHERE id = 1", &[])
        .await?
        .get(0);
    check(
        &mut failures,
        "the notification is marked sent by the job, in its fenced transaction",
        sent == Some(job.id),
    );
    // A stale attempt (a lower fencing token than the one that delivered) is refused outside.
    let stale = reqwest::Client::new()
        .post(&url)
        .header("Idempotency-Key", format!("{}:0", job.id))
        .body("stale")
        .send()
        .await?
        .status();
    let o = outside
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let statuses: Vec<u16> = o.requests.iter().map(|r| r.2).collect();
    check(
        &mut failures,
        "the outside system saw busy, delivered, then refused the stale token",
        statuses == [503, 200, 409] && stale == reqwest::StatusCode::CONFLICT,
    );
    let tokens: Vec<i64> = o.requests.iter().take(2).map(|r| r.1).collect();
    check(
        &mut failures,
        "each attempt carried a higher fencing token",
        tokens.len() == 2 && tokens[0] < tokens[1],
    );
    check(
        &mut failures,
        "exactly one delivery was accepted",
        o.delivered.len() == 1,
    );
    drop(o);
    stub.abort();
    Ok(failures)
}

/// Runs the example on a database of its own (dropped at the end); exits 0 only if every check
/// held.
#[tokio::main]
async fn main() -> ExitCode {
    support::on_fresh_database(|config| async move { run(&config).await }).await
}
