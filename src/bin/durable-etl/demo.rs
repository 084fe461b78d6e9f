//! `durable-etl demo`: the whole product in one command on a local database.
//!
//! Invariants this module keeps:
//! - The demo works in its own database (created fresh on the configured server), never in the
//!   configured one, and leaves it behind for inspection. It drops (to recreate) only a database
//!   it created and no session uses: never another's, nor another demo's that still runs.
//! - Its keys' digests use `DURABLE_ETL_SECRET` when set (never printed), else a random secret;
//!   with `--serve` it says how to make keys of one's own for its server, with that secret.
//! - Everything it shows comes from the real API and the real database: jobs are submitted over
//!   HTTP to a real listening server and run by two real worker replicas.
//! - It ends: every job reaches a terminal state (bounded wait), then it stops the replicas,
//!   prints the final table (nothing is printed or logged after it), stops the server and exits 0.
//!   With `--serve`, the server and both replicas go on after the table (a job submitted then
//!   runs too), which is then followed by the console's address, the demo's key and an operator
//!   key (for the operator view), until a shutdown signal; then the replicas stop, then the
//!   server.

use durable_etl::config::{ApiConfig, DatabaseConfig, WorkerConfig};
use durable_etl::db;
use durable_etl::digest::Secret;
use durable_etl::error::Error;
use durable_etl::job::handler::Registry;
use durable_etl::kinds::etl::load::EtlLoad;
use durable_etl::schema;
use durable_etl::service::api_keys::{self, Role};
use durable_etl::service::{self, AppState};
use durable_etl::shutdown::{self, Shutdown, Stage};
use durable_etl::worker::Worker;
use serde_json::{json, Value};
use std::time::Duration;

/// The one line printed when no PostgreSQL server answers.
pub(crate) const NO_SERVER: &str = "durable-etl demo needs PostgreSQL: start the local server (apt-get install postgresql; pg_ctlcluster 15 main start) or set DATABASE_URL=postgres://USER@HOST:PORT/DB";

/// How long the demo waits for its jobs to end.
const DEADLINE: Duration = Duration::from_secs(60);

/// One sample job: a label, its request, and whether the demo cancels it.
struct Sample {
    /// What the job shows.
    label: &'static str,
    /// The request body.
    body: Value,
    /// Cancel it right after submitting.
    cancel: bool,
}

/// The sample jobs.
fn samples() -> Vec<Sample> {
    let orders = |ids: &[&str]| -> Value {
        json!({
            "dataset": "orders", "key": "order_id",
            "records": ids.iter().enumerate().map(|(i, id)| json!({"id": id, "amount": format!("{}.50", i + 10), "placed": "2026-11-29T10:00:00+01:00"})).collect::<Vec<_>>(),
            "transform": {"rename": {"id": "order_id"}, "cast": {"amount": "decimal", "placed": "timestamp"},
                          "required": ["order_id"], "defaults": {"channel": "web"}}
        })
    };
    let in_3s = (chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339();
    let in_1h = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut deferred = orders(&["D-1"]);
    deferred["run_at"] = json!(in_3s);
    let mut cancelled = orders(&["X-1"]);
    cancelled["run_at"] = json!(in_1h);
    vec![
        Sample {
            label: "load 3 orders",
            body: orders(&["A-1", "A-2", "A-3"]),
            cancel: false,
        },
        Sample {
            label: "load 2 orders",
            body: orders(&["B-1", "B-2"]),
            cancel: false,
        },
        Sample {
            label: "deferred 3 s",
            body: deferred,
            cancel: false,
        },
        Sample {
            label: "cancelled",
            body: cancelled,
            cancel: true,
        },
        Sample {
            label: "bad record (fails)",
            body: json!({"dataset": "orders", "key": "order_id",
                         "records": [{"order_id": "C-1", "amount": "12"}, {"order_id": "C-2", "amount": "twelve"}],
                         "transform": {"cast": {"amount": "decimal"}}}),
            cancel: false,
        },
        Sample {
            label: "locked row (retries)",
            body: json!({"dataset": "orders", "key": "order_id", "records": [{"order_id": "L-1", "amount": "1"}]}),
            cancel: false,
        },
    ]
}

/// Runs the demo against the server of `base`, in database `name`, its keys' digests keyed by
/// `secret` (`DURABLE_ETL_SECRET`; a random one when unset).
///
/// # Errors
/// [`Error::Config`] for a secret under 16 bytes; [`Error::DatabaseTaken`] when `name` is a
/// database the demo did not create or one in use; [`Error::Unavailable`] when no server answers
/// (after printing [`NO_SERVER`]); other errors of the run.
pub(crate) async fn run(
    base: &DatabaseConfig,
    name: &str,
    secret: Option<&str>,
    serve: Option<Shutdown>,
) -> Result<(), Error> {
    let given = secret.is_some();
    let secret_text = match secret {
        Some(text) => text.to_owned(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let secret = Secret::new(secret_text.clone().into_bytes())
        .ok_or(durable_etl::config::ConfigError::Secret)?;
    let created = match db::recreate_database(base, name, "demo", "demo").await {
        Ok(created) => created,
        Err(e) => {
            if matches!(e, Error::Unavailable(_)) {
                println!("{NO_SERVER}");
            }
            return Err(e);
        }
    };
    let config = DatabaseConfig {
        lock_timeout: Duration::from_millis(300),
        ..created.config
    };
    let mut session = created.session;
    println!("demo database: {name} (left in place afterwards)");
    schema::migrate_session(&mut session, &config).await?;
    println!("schema migrated to version {}", schema::latest_version());

    let key = api_keys::create(&session, &secret, "demo-owner").await?.key;
    let operator_key = api_keys::create_as(&session, &secret, "demo-operator", Role::Operator)
        .await?
        .key;
    let pool = db::connect_pool(&config, "api").await?;
    let app = service::app(AppState::new(pool, secret, ApiConfig::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|_| durable_etl::config::ConfigError::Listen)?;
    let addr = listener
        .local_addr()
        .map_err(|_| durable_etl::config::ConfigError::Listen)?;
    // The API outlives the replicas: the final table is read through it after they stopped.
    let (api_trigger, mut api_stop) = shutdown::manual();
    let (trigger, stop) = shutdown::manual();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { api_stop.reached(Stage::Draining).await })
            .await
    });
    let mut replicas = Vec::new();
    for i in 1..=2 {
        let worker_config = WorkerConfig {
            owner_id: format!("demo-replica-{i}"),
            slots: 4,
            poll_interval: Duration::from_millis(500),
            retry_min_delay: Duration::from_millis(400),
            retry_max_delay: Duration::from_secs(2),
            ..WorkerConfig::default()
        };
        let pool = db::connect_pool(&config, "worker").await?;
        let worker = Worker::start(
            pool,
            &config,
            worker_config,
            Registry::new().perform(EtlLoad::default()),
        )
        .await?;
        replicas.push(tokio::spawn(worker.run(stop.clone())));
    }
    println!("API on http://{addr}, two worker replicas running");

    let base = format!("http://{addr}");
    let progress = drive(&base, &key, &session).await;
    if serve.is_none() {
        // The replicas log their shutdown: stop them before the summary, so it is printed last.
        trigger.request(Stage::Draining);
        for replica in replicas.drain(..) {
            let _ = replica.await;
        }
    }
    let outcome = match progress {
        Ok(jobs) => summary(&base, &key, &jobs, &session).await,
        Err(e) => Err(e),
    };
    if let (Ok(()), Some(mut until)) = (&outcome, serve) {
        println!("\nconsole: {base}/console (sign in with the demo's API key: {key})");
        println!(
            "operator view: {base}/console/operator (sign in with the operator key: {operator_key})"
        );
        println!("the two replicas keep running: jobs submitted now run too");
        println!(
            "{}",
            own_keys(name, (!given).then_some(secret_text.as_str()))
        );
        println!("serving until Ctrl-C");
        until.reached(Stage::Draining).await;
    }
    // With --serve, the replicas stop only now, before the server that the console uses.
    trigger.request(Stage::Draining);
    for replica in replicas {
        let _ = replica.await;
    }
    api_trigger.request(Stage::Draining);
    let _ = server.await;
    outcome
}

/// The line that says how to make API keys of one's own that the demo's server accepts: with
/// the secret the demo generated (`generated`, printed), or with the `DURABLE_ETL_SECRET` the
/// user set (never printed).
fn own_keys(name: &str, generated: Option<&str>) -> String {
    let secret = match generated {
        Some(secret) => format!("DURABLE_ETL_SECRET={secret}"),
        None => "the same DURABLE_ETL_SECRET".to_owned(),
    };
    format!(
        "keys of your own: durable-etl api-keys create --owner NAME, with DATABASE_URL naming the database {name} and {secret}"
    )
}

/// Submits the samples and shows progress until every job has ended; returns the jobs (label,
/// id) for the summary.
async fn drive(
    base: &str,
    key: &str,
    session: &tokio_postgres::Client,
) -> Result<Vec<(&'static str, String)>, Error> {
    let http = reqwest::Client::new();
    let mut jobs: Vec<(&'static str, String)> = Vec::new();
    for (i, sample) in samples().into_iter().enumerate() {
        if sample.label.starts_with("locked") {
            // Another session holds the row this job loads, so its first attempt times out.
            hold_lock(session).await?;
        }
        let response = http
            .post(format!("{base}/v1/etl-jobs"))
            .bearer_auth(key)
            .header("Idempotency-Key", format!("demo-{i}"))
            .json(&sample.body)
            .send()
            .await
            .map_err(Error::io)?;
        let status: Value = response.json().await.map_err(Error::io)?;
        let id = status["id"].as_str().unwrap_or_default().to_owned();
        if sample.cancel {
            let _ = http
                .delete(format!("{base}/v1/etl-jobs/{id}"))
                .bearer_auth(key)
                .send()
                .await;
        }
        jobs.push((sample.label, id));
    }
    println!("submitted {} jobs", jobs.len());
    let started = tokio::time::Instant::now();
    let mut last = String::new();
    let mut released = false;
    loop {
        let counts = session
            .query_one(
                "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'running'),
                        count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'),
                        count(*) FILTER (WHERE status = 'cancelled'), coalesce(max(attempts) FILTER (WHERE status = 'pending'), 0)
                   FROM etl_jobs",
                &[],
            )
            .await?;
        let c: Vec<i64> = (0..5).map(|i| counts.get(i)).collect();
        let line = format!(
            "  pending {:>2}  running {:>2}  succeeded {:>2}  failed {:>2}  cancelled {:>2}",
            c[0], c[1], c[2], c[3], c[4]
        );
        if line != last {
            println!("{line}");
            last = line;
        }
        // Once the locked job has failed an attempt, let go of the lock so it can recover.
        if !released && counts.get::<_, i32>(5) >= 1 {
            session.batch_execute("ROLLBACK").await?;
            released = true;
            println!("  (released the row lock: the retrying job can now succeed)");
        }
        if c[0] + c[1] == 0 || started.elapsed() > DEADLINE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if !released {
        session.batch_execute("ROLLBACK").await?;
    }
    Ok(jobs)
}

/// Opens a transaction on `session` that inserts (uncommitted) the demo owner's target row
/// `L-1`, so a load of that row waits for it and times out until the transaction ends.
async fn hold_lock(session: &tokio_postgres::Client) -> Result<(), Error> {
    session
        .batch_execute(
            "BEGIN;
             INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             SELECT owner_key, 'orders', 'L-1', '{}', id FROM etl_job_intake ORDER BY id LIMIT 1",
        )
        .await?;
    Ok(())
}

/// Prints every job's final state and the enqueue→start latency.
async fn summary(
    base: &str,
    key: &str,
    jobs: &[(&'static str, String)],
    session: &tokio_postgres::Client,
) -> Result<(), Error> {
    let http = reqwest::Client::new();
    println!(
        "\n{:<22} {:<36} {:<10} {:>8} {:<16} {:>8} {:>8}",
        "job", "id", "status", "attempts", "code", "inserted", "updated"
    );
    for (label, id) in jobs {
        let status: Value = http
            .get(format!("{base}/v1/etl-jobs/{id}"))
            .bearer_auth(key)
            .send()
            .await
            .map_err(Error::io)?
            .json()
            .await
            .map_err(Error::io)?;
        println!(
            "{:<22} {:<36} {:<10} {:>8} {:<16} {:>8} {:>8}",
            label,
            id,
            status["status"].as_str().unwrap_or("?"),
            status["attempts"].as_i64().unwrap_or(0),
            status["failure"]["code"].as_str().unwrap_or("-"),
            status["result"]["rows_inserted"]
                .as_i64()
                .map_or("-".into(), |n| n.to_string()),
            status["result"]["rows_updated"]
                .as_i64()
                .map_or("-".into(), |n| n.to_string()),
        );
    }
    let latency = session
        .query_one(
            "SELECT count(*),
                    coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)), 0)::float8,
                    coalesce(max(extract(epoch FROM started_at - run_at)), 0)::float8
               FROM etl_jobs WHERE started_at IS NOT NULL AND attempts = 1",
            &[],
        )
        .await?;
    let (n, p50, max): (i64, f64, f64) = (latency.get(0), latency.get(1), latency.get(2));
    println!(
        "\nenqueue→start latency over {n} first attempts (database clock): p50 {:.1} ms, max {:.1} ms",
        p50 * 1000.0,
        max * 1000.0
    );
    Ok(())
}
