//! Privacy, proven with canaries: drive every path with canary strings in payloads, principals,
//! idempotency keys, credentials and paths, then search every log line (all levels), the metrics
//! of both roles, every API response and every stored code for them, for our SQL, and for
//! PostgreSQL error messages.

use crate::handlers::{Scripted, SCRIPTED};
use crate::support::{
    count, eventually, free_port, insert_jobs, pool, session_pid, signal, until_all_terminal,
    Processes, TestDb,
};
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use durable_etl::shutdown::{self, Stage};
use durable_etl::worker::Worker;
use serde_json::{json, Value};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What must never appear anywhere: canaries, our SQL, and PostgreSQL's error texts.
const FORBIDDEN: &[&str] = &[
    "canary",
    "select ",
    "update etl",
    "insert into",
    "delete from",
    "for update",
    "etl_job_records",
    "etl_job_intake",
    "etl_job_outcomes",
    "error:",
    "violates",
    "duplicate key",
    "syntax error",
    "deadlock detected",
    "canceling statement",
    "lock timeout",
    "terminating connection",
    "detail:",
];

/// The first forbidden string found in `text` (case-insensitive), if any.
pub fn leak(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    FORBIDDEN.iter().copied().find(|f| lower.contains(f))
}

/// Starts the binary with `args`, collecting its standard error (every log line) in the buffer.
fn spawn_logged(url: &str, secret: &str, args: &[&str]) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .env("DURABLE_ETL_SECRET", secret)
        .env("RUST_LOG", "trace")
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_canary_sql_or_database_message_leaks_from_the_binaries() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let secret = "privacy-secret-0123456789";
    let created = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &db.config.url)
        .env("DURABLE_ETL_SECRET", secret)
        .env("RUST_LOG", "trace")
        .args(["api-keys", "create", "--owner", "canary-principal"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&created.stdout);
    let key = stdout
        .lines()
        .find_map(|l| l.strip_prefix("key:"))
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(leak(&String::from_utf8_lossy(&created.stderr)), None);

    let (api_port, metrics_port) = (free_port(), free_port());
    let api_listen = format!("127.0.0.1:{api_port}");
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let (api, api_log) = spawn_logged(&db.config.url, secret, &["serve", "--listen", &api_listen]);
    let (work, work_log) = spawn_logged(
        &db.config.url,
        secret,
        &[
            "work",
            "--owner-id",
            "privacy-replica",
            "--poll-interval",
            "100ms",
            "--lock-timeout",
            "100ms",
            "--retry-min-delay",
            "50ms",
            "--retry-max-delay",
            "100ms",
            "--metrics-listen",
            &metrics_listen,
        ],
    );
    let mut running = Processes(vec![api, work]);
    let http = reqwest::Client::new();
    let base = format!("http://{api_listen}");
    eventually("the API to serve", || {
        let (http, base) = (&http, &base);
        async move { http.get(format!("{base}/healthz")).send().await.is_ok() }
    })
    .await;
    let bodies = Mutex::new(Vec::<String>::new());
    let call = |req: reqwest::RequestBuilder| async {
        let response = req.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        bodies.lock().unwrap().push(text.clone());
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        )
    };
    let submit = |idem: &str, body: Value| {
        http.post(format!("{base}/v1/etl-jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", idem.to_owned())
            .json(&body)
    };

    // Success, a record failure, a transient failure that retries, a cancellation.
    let ok = json!({"dataset": "d", "key": "canary_key", "records": [{"canary_key": "canary-1", "v": "canary-value"}]});
    let (_, good) = call(submit("canary-idem-1", ok.clone())).await;
    let bad = json!({"dataset": "d", "key": "k", "records": [{"k": 1, "n": "canary-nan"}], "transform": {"cast": {"n": "integer"}}});
    call(submit("canary-idem-2", bad)).await;
    call(submit(
        "canary-idem-1",
        json!({"dataset": "d", "key": "k", "records": [{"k": "canary-reuse"}]}),
    ))
    .await;
    call(submit(
        "canary-idem-3",
        json!({"dataset": "d", "key": "k", "records": [], "canary_member": 1}),
    ))
    .await;
    call(
        http.post(format!("{base}/v1/etl-jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "canary-4")
            .header("content-type", "application/json")
            .body("{\"canary\": "),
    )
    .await;
    call(
        http.get(format!("{base}/v1/etl-jobs"))
            .bearer_auth("canary-bearer-token"),
    )
    .await;
    call(
        http.get(format!("{base}/v1/etl-jobs/canary-path"))
            .bearer_auth(&key),
    )
    .await;
    until_all_terminal(&client).await;
    // A locked target row: the load times out, retries, and succeeds once the lock is gone.
    let holder = db.client().await;
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM etl_target_rows WHERE record_key = 'canary-1' FOR UPDATE",
        )
        .await
        .unwrap();
    let update = json!({"dataset": "d", "key": "canary_key", "records": [{"canary_key": "canary-1", "v": "canary-changed"}]});
    let (_, retried) = call(submit("canary-idem-5", update)).await;
    eventually("a retry", || {
        let client = &client;
        async move {
            count(
                client,
                "etl_job_records WHERE status = 'pending' AND attempts >= 1",
            )
            .await
                == 1
        }
    })
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    // The worker's session is killed (it reconnects); a pending job is cancelled, then again (409).
    let pid = session_pid(&client, &db).await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let deferred = json!({"dataset": "d", "key": "k", "records": [{"k": "canary-later"}], "run_at": "2099-01-01T00:00:00Z"});
    let (_, later) = call(submit("canary-idem-6", deferred)).await;
    let later_id = later["id"].as_str().unwrap().to_owned();
    call(
        http.delete(format!("{base}/v1/etl-jobs/{later_id}"))
            .bearer_auth(&key),
    )
    .await;
    call(
        http.delete(format!("{base}/v1/etl-jobs/{later_id}"))
            .bearer_auth(&key),
    )
    .await;
    until_all_terminal(&client).await;
    for id in [&good["id"], &retried["id"]] {
        let (_, status) = call(
            http.get(format!("{base}/v1/etl-jobs/{}", id.as_str().unwrap()))
                .bearer_auth(&key),
        )
        .await;
        assert_eq!(status["status"], "succeeded");
    }
    call(http.get(format!("{base}/v1/etl-jobs")).bearer_auth(&key)).await;
    let api_metrics = crate::support::text_of(&http, &format!("{base}/metrics")).await;
    let worker_metrics_url = format!("http://{metrics_listen}/metrics");
    eventually("the worker's session to reconnect", || {
        let (http, url) = (&http, &worker_metrics_url);
        async move {
            let text = http.get(url).send().await.unwrap().text().await.unwrap();
            text.contains("durable_etl_session_reconnects_total 1")
        }
    })
    .await;
    let worker_metrics = http
        .get(&worker_metrics_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        worker_metrics.contains("durable_etl_jobs_failed_total{code=\"record_invalid\"} 1"),
        "{worker_metrics}"
    );
    assert!(
        worker_metrics.contains("durable_etl_session_reconnects_total 1"),
        "{worker_metrics}"
    );
    assert!(
        worker_metrics.contains("durable_etl_jobs_retried_total"),
        "{worker_metrics}"
    );
    assert!(
        api_metrics.contains("durable_etl_queue_jobs{state=\"due\"} 0"),
        "{api_metrics}"
    );

    for child in &mut running.0 {
        signal(child, "TERM");
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }
    let stored: Vec<String> = client
        .query(
            "SELECT coalesce(failure_code, '') || ' ' || status FROM etl_jobs",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(stored.iter().any(|s| s.starts_with("record_invalid")));
    let logs = [
        api_log.lock().unwrap().clone(),
        work_log.lock().unwrap().clone(),
    ];
    assert!(
        logs[0].contains("serving") && logs[1].contains("worker starting"),
        "logs were captured"
    );
    assert!(logs[1].contains("session reconnected"));
    let everything = [
        logs.to_vec(),
        bodies.into_inner().unwrap(),
        vec![api_metrics, worker_metrics],
        stored,
    ]
    .concat();
    for text in &everything {
        assert_eq!(leak(text), None, "leaked in:\n{text}");
    }
}

/// A log sink for the in-process test.
#[derive(Clone, Default)]
pub(crate) struct Sink(pub(crate) Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends this process's logs, at every level and without colours, and its panic reports to the
/// returned sink.
pub(crate) fn capture_logs() -> Sink {
    let sink = Sink::default();
    let writer = sink.clone();
    tracing_subscriber::fmt()
        .with_env_filter(durable_etl::telemetry::filter(Some("trace")))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    durable_etl::telemetry::install_panic_hook();
    sink
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_timeouts_and_handler_errors_leak_nothing_into_logs() {
    let sink = capture_logs();
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let payloads: Vec<Value> = [
        "panic",
        "hang",
        "transient",
        "permanent",
        "write_then_constraint",
        "write",
    ]
    .iter()
    .map(|a| json!({"do": a, "canary": "canary-payload"}))
    .collect();
    insert_jobs(&client, SCRIPTED, &payloads, 2).await;
    let config = WorkerConfig {
        owner_id: "privacy-replica-2".into(),
        poll_interval: Duration::from_millis(50),
        execution_timeout: Duration::from_millis(300),
        retry_min_delay: Duration::from_millis(20),
        retry_max_delay: Duration::from_millis(40),
        ..WorkerConfig::default()
    };
    let worker = Worker::start(
        pool(&db).await,
        &db.config,
        config,
        Registry::new().register(Scripted::default()),
    )
    .await
    .unwrap();
    let (trigger, stop) = shutdown::manual();
    let run = tokio::spawn(worker.run(stop));
    until_all_terminal(&client).await;
    // Lease loss: a job whose claim is taken from it mid-run.
    insert_jobs(
        &client,
        SCRIPTED,
        &[json!({"do": "hang", "canary": "canary-lost"})],
        2,
    )
    .await;
    eventually("the job to run", || {
        let client = &client;
        async move { count(client, "etl_job_records WHERE status = 'running'").await == 1 }
    })
    .await;
    client
        .execute("UPDATE etl_job_records SET lease_claim_id = gen_random_uuid() WHERE status = 'running'", &[])
        .await
        .unwrap();
    trigger.request(Stage::Draining);
    run.await.unwrap().unwrap();
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    if let Some(found) = leak(&text) {
        eprintln!("leaked {found:?} in:\n{text}");
    }
    assert!(
        text.contains("a task panicked"),
        "the panic was reported (by location):\n{text}"
    );
    assert!(
        text.contains("job settled"),
        "trace-level logs were captured"
    );
    assert_eq!(leak(&text), None, "leaked in:\n{text}");
}

/// A job of the runtime's test kind: what to do, and a secret it carries.
#[derive(serde::Serialize, serde::Deserialize)]
struct Canary {
    /// `ok`, `flaky` (transient once), `doomed` (permanent) or `panic`.
    what: String,
    /// A canary that must never leave the payload.
    secret: String,
}

impl durable_etl::Job for Canary {
    const KIND: &'static str = "test.privacy";
}

/// Runs [`Canary`] jobs; every failure carries a canary in its source or message.
struct CanaryRunner;

impl durable_etl::Perform for CanaryRunner {
    type Job = Canary;
    type Effects = ();

    async fn compute(
        &self,
        job: Canary,
        ctx: &durable_etl::JobContext,
    ) -> Result<(), durable_etl::JobError> {
        use durable_etl::JobError;
        match job.what.as_str() {
            "flaky" if ctx.attempt == 1 => Err(JobError::transient(std::io::Error::other(
                format!("canary-transient {}", job.secret),
            ))),
            "doomed" => Err(JobError::Permanent {
                code: durable_etl::Code::HandlerFailed,
                record_index: None,
                source: Some(format!("canary-permanent {}", job.secret).into()),
            }),
            "panic" => panic!("canary-panic {}", job.secret),
            _ => Ok(()),
        }
    }
}

/// A kind of the job runtime (`Jobs`, `Perform`) whose payloads, owner, idempotency keys and
/// concurrency keys (in a key-capped queue, so their permits are taken and freed) are canaries, run through success, a transient failure, a permanent failure and a panic (each
/// failure with a canary in its error), plus a refused replay: none of it reaches the logs (all
/// levels), the replica's metrics, the status and listing answers, a refusal's message or a
/// stored code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_kinds_payloads_owner_and_keys_never_leak() {
    let sink = capture_logs();
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let secret = durable_etl::Secret::new("privacy-secret-0123456789").unwrap();
    let jobs = durable_etl::Jobs::new(secret, "canary-owner");
    durable_etl::queue::set_key_cap(&client, "default", Some(1))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for what in ["ok", "flaky", "doomed", "panic"] {
        let job = Canary {
            what: what.into(),
            secret: format!("canary-secret-{what}"),
        };
        let key = format!("canary-key-{what}");
        let tenant = format!("canary-tenant-{what}");
        let options = durable_etl::EnqueueOptions {
            idempotency_key: Some(&key),
            concurrency_key: Some(&tenant),
            ..durable_etl::EnqueueOptions::default()
        };
        ids.push(jobs.enqueue(&client, &job, options).await.unwrap().id);
    }
    let reused = Canary {
        what: "ok".into(),
        secret: "canary-other".into(),
    };
    let options = durable_etl::EnqueueOptions {
        idempotency_key: Some("canary-key-ok"),
        ..durable_etl::EnqueueOptions::default()
    };
    let refused = jobs.enqueue(&client, &reused, options).await.unwrap_err();
    assert_eq!(leak(&refused.to_string()), None, "{refused}");

    let config = WorkerConfig {
        owner_id: "privacy-runtime".into(),
        retry_min_delay: Duration::from_millis(10),
        retry_max_delay: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(CanaryRunner);
    let worker = Worker::start(pool(&db).await, &db.config, config, registry)
        .await
        .unwrap();
    let stats = worker.stats_handle();
    let replica = worker.spawn();
    until_all_terminal(&client).await;
    let metrics = durable_etl::service::metrics::render_worker(&stats);
    replica.stop().await.unwrap();
    let sample = durable_etl::service::metrics::sample_queues(&client)
        .await
        .unwrap();
    assert_eq!(sample[0].key_cap, Some(1), "the jobs ran key-capped");
    let sampled = format!("{sample:?}");

    let page = jobs
        .list(&client, durable_etl::jobs::Window::default(), None, 10)
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 4);
    let answers = serde_json::to_string(&page.jobs).unwrap();
    let states: Vec<String> = page.jobs.iter().map(|j| j.status.to_string()).collect();
    assert_eq!(states, ["failed", "failed", "succeeded", "succeeded"]);
    let codes: Vec<String> = crate::support::first_column(
        &client,
        "SELECT coalesce(failure_code, '-') FROM etl_job_outcomes ORDER BY job_id",
    )
    .await;
    assert_eq!(codes, ["-", "-", "handler_failed", "handler_panicked"]);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("job settled"),
        "trace-level logs were captured"
    );
    for (what, found) in [
        ("logs", &text),
        ("metrics", &metrics),
        ("answers", &answers),
        ("queue sample", &sampled),
    ] {
        assert_eq!(leak(found), None, "leaked in the {what}:\n{found}");
    }
}
