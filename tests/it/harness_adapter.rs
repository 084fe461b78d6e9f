//! The multi-system harness adapter (`examples/harness_adapter`) against the harness's contract
//! (`CONTRIBUTING_ADAPTERS.md` of hardbyte/postgresql-job-queue-benchmarking): settings from the
//! environment, a descriptor line, JSONL samples with the required metrics, fixed-rate
//! (adapter- and harness-paced) and depth-target producers, exit 0 within 5 s of SIGTERM, and
//! its exact count of lost jobs and duplicate effects, which must also see a loss and a
//! duplicate when there are some. No figure's size is judged, only its presence and shape.

use crate::support::{eventually, signal, TestDb};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The metrics the contract requires at every tick.
const REQUIRED: &[&str] = &[
    "claim_p50_ms",
    "claim_p95_ms",
    "claim_p99_ms",
    "enqueue_rate",
    "completion_rate",
    "queue_depth",
];

/// The longest the adapter may take to exit after SIGTERM.
const EXIT_BOUND: Duration = Duration::from_secs(5);

/// The adapter example's executable: `cargo test` (and nextest) build the examples beside the
/// test binary, in `<target>/<profile>/examples`.
fn adapter_exe() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let path = profile_dir.join("examples").join("harness_adapter");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --example harness_adapter`",
        path.display()
    );
    path
}

/// A running adapter process, killed on drop.
struct Adapter {
    /// The process.
    child: Child,
    /// Its standard input (the harness's pacing tokens), until closed.
    stdin: Option<ChildStdin>,
    /// Its standard output, line by line.
    lines: Receiver<String>,
    /// Its standard error so far, for failure messages.
    stderr: Arc<Mutex<String>>,
}

impl Drop for Adapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Adapter {
    /// Starts the adapter on database `url` with `env` over a clean harness environment.
    fn start(url: &str, env: &[(&str, &str)]) -> Adapter {
        Adapter::start_scenario(url, env, Stdio::piped())
    }

    /// [`Adapter::start`] with `stdin` for its standard input.
    fn start_scenario(url: &str, env: &[(&str, &str)], stdin: Stdio) -> Adapter {
        let mut command = Command::new(adapter_exe());
        for (key, _) in std::env::vars() {
            if key.starts_with("DURABLE_ETL_") || key.starts_with("PRODUCER_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "warn")
            .env("SAMPLE_EVERY_S", "1")
            .envs(env.iter().copied())
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sink, pipe) = (Arc::clone(&stderr), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        let stdin = child.stdin.take();
        Adapter {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// Its standard error so far.
    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next line of standard output within `wait`, parsed.
    fn next(&self, wait: Duration) -> Value {
        let line = self
            .lines
            .recv_timeout(wait)
            .unwrap_or_else(|_| panic!("no line within {wait:?}; stderr: {}", self.stderr()));
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"))
    }

    /// Reads lines until `done` holds of those read so far (at most 30 s); returns them.
    fn read_until(&self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut read = Vec::new();
        while !done(&read) {
            let left = deadline.saturating_duration_since(Instant::now());
            read.push(self.next(left.max(Duration::from_millis(1))));
        }
        read
    }

    /// Writes `text` to its standard input.
    fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes standard input (as the harness does), sends SIGTERM, and waits for the exit;
    /// returns the status, the time it took and the lines written meanwhile.
    fn terminate(mut self) -> (ExitStatus, Duration, Vec<Value>) {
        drop(self.stdin.take());
        let sent = Instant::now();
        signal(&self.child, "TERM");
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                sent.elapsed() < EXIT_BOUND * 2,
                "no exit after SIGTERM; stderr: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = sent.elapsed();
        let mut rest = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            rest.push(serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}")));
        }
        (status, took, rest)
    }
}

/// Asserts the descriptor's shape, and that it covers the static manifest (the harness's drift
/// check: its tables and extensions are a superset of `adapter.json`'s).
fn assert_descriptor(d: &Value, instance: u64) {
    assert_eq!(d["kind"], "descriptor", "{d}");
    assert_eq!(d["system"], "durable-etl");
    assert_eq!(d["instance_id"], instance);
    for field in ["version", "schema_version", "db_name", "started_at"] {
        assert!(
            d[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field}: {d}"
        );
    }
    chrono::DateTime::parse_from_rfc3339(d["started_at"].as_str().unwrap()).unwrap();
    let manifest: Value =
        serde_json::from_str(include_str!("../../examples/harness_adapter/adapter.json")).unwrap();
    assert_eq!(manifest["system"], d["system"]);
    for list in ["event_tables", "extensions"] {
        let have: BTreeSet<&str> = d[list]
            .as_array()
            .unwrap_or_else(|| panic!("{list}: {d}"))
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for want in manifest[list].as_array().unwrap() {
            assert!(have.contains(want.as_str().unwrap()), "{list} lacks {want}");
        }
    }
    assert!(!d["event_tables"].as_array().unwrap().is_empty());
}

/// Asserts one sample's shape: every field the harness reads, of its type.
fn assert_sample(s: &Value) {
    assert_eq!(s["kind"], "adapter", "{s}");
    assert_eq!(s["system"], "durable-etl", "{s}");
    assert_eq!(s["subject_kind"], "adapter", "{s}");
    assert!(s["subject"].is_string(), "{s}");
    assert!(s["metric"].as_str().is_some_and(|m| !m.is_empty()), "{s}");
    assert!(s["value"].as_f64().is_some_and(f64::is_finite), "{s}");
    assert!(s["window_s"].as_f64().is_some_and(|w| w >= 0.0), "{s}");
    assert!(s["instance_id"].is_u64(), "{s}");
    let t = s["t"].as_str().unwrap();
    assert!(t.ends_with('Z') && t.len() == 24, "{t}");
    chrono::DateTime::parse_from_rfc3339(t).unwrap();
}

/// The values of `metric` in `lines`, in order.
fn values(lines: &[Value], metric: &str) -> Vec<f64> {
    lines
        .iter()
        .filter(|l| l["kind"] == "adapter" && l["metric"] == metric)
        .map(|l| l["value"].as_f64().unwrap())
        .collect()
}

/// Whether `lines` hold at least `n` ticks with every required metric.
fn ticks_with_all_metrics(lines: &[Value], n: usize) -> bool {
    let mut by_tick: std::collections::BTreeMap<&str, BTreeSet<&str>> = Default::default();
    for l in lines.iter().filter(|l| l["kind"] == "adapter") {
        by_tick
            .entry(l["t"].as_str().unwrap_or(""))
            .or_default()
            .insert(l["metric"].as_str().unwrap_or(""));
    }
    by_tick
        .values()
        .filter(|metrics| REQUIRED.iter().all(|m| metrics.contains(m)))
        .count()
        >= n
}

/// Asserts the run ended as the contract says (exit 0 within 5 s of SIGTERM), with every line a
/// descriptor-free sample but the last, the exact count, which it returns (its `ledger`).
fn assert_clean_end(status: ExitStatus, took: Duration, rest: &[Value], stderr: &str) -> Value {
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(took < EXIT_BOUND, "SIGTERM to exit took {took:?}");
    let (last, samples) = rest.split_last().expect("a last line");
    for s in samples {
        assert_sample(s);
    }
    assert_eq!(last["kind"], "accounting", "{last}");
    assert_eq!(last["counted"], true, "{last}");
    assert_eq!(last["exact"], true, "{last}");
    let ledger = last["ledger"].clone();
    for zero in ["lost", "duplicate_effects", "unknown_effects"] {
        assert_eq!(ledger[zero], 0, "{zero}: {last}");
    }
    let n = |k: &str| ledger[k].as_i64().unwrap();
    assert!(n("enqueued") > 0, "{last}");
    assert_eq!(n("enqueued"), n("completed") + n("unfinished"), "{last}");
    // The same count, as samples the harness ingests.
    assert_eq!(values(samples, "lost_jobs"), [0.0]);
    assert_eq!(values(samples, "duplicate_effects"), [0.0]);
    ledger
}

/// Asserts the database agrees with the adapter's count: one job per ledger row, and the jobs
/// that succeeded are those whose effects committed.
async fn assert_database_agrees(client: &tokio_postgres::Client, ledger: &Value) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM harness_adapter_ledger),
                    (SELECT count(*) FROM etl_jobs WHERE kind = 'harness_adapter.job'),
                    (SELECT count(*) FROM etl_jobs
                      WHERE kind = 'harness_adapter.job' AND status = 'succeeded')",
            &[],
        )
        .await
        .unwrap();
    let (rows, jobs, succeeded): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(rows, ledger["enqueued"].as_i64().unwrap());
    assert_eq!(jobs, rows);
    assert_eq!(succeeded, ledger["completed"].as_i64().unwrap());
}

/// Stops `adapter` with SIGTERM, asserts it ended cleanly with an exact count that `db` agrees
/// with, and returns the count and a client of `db`.
async fn finish(adapter: Adapter, db: &TestDb) -> (Value, tokio_postgres::Client) {
    let stderr = Arc::clone(&adapter.stderr);
    let (status, took, rest) = adapter.terminate();
    let ledger = assert_clean_end(status, took, &rest, &stderr.lock().unwrap());
    let client = db.client().await;
    assert_database_agrees(&client, &ledger).await;
    (ledger, client)
}

#[tokio::test]
async fn a_fixed_rate_run_meets_the_contract_and_counts_exactly() {
    let db = TestDb::migrated().await;
    let adapter = Adapter::start(
        &db.config.url,
        &[("PRODUCER_RATE", "400"), ("WORKER_COUNT", "8")],
    );
    assert_descriptor(&adapter.next(Duration::from_secs(30)), 0);
    let running = adapter.read_until(|read| ticks_with_all_metrics(read, 2));
    for s in &running {
        assert_sample(s);
    }
    assert!(values(&running, "enqueue_rate").iter().any(|r| *r > 0.0));
    assert!(values(&running, "completion_rate").iter().any(|r| *r > 0.0));
    assert!(values(&running, "claim_p99_ms").iter().all(|p| *p > 0.0));
    assert!(values(&running, "producer_target_rate")
        .iter()
        .all(|r| *r == 400.0));
    let (_, client) = finish(adapter, &db).await;

    // The count must see a loss and a duplicate: one job's effects undone (it succeeded
    // without them: lost), another's committed twice. The accounting scenario then exits 1.
    client
        .batch_execute(
            "UPDATE harness_adapter_ledger SET applied = 0
              WHERE seq = (SELECT min(seq) FROM harness_adapter_ledger WHERE applied = 1);
             UPDATE harness_adapter_ledger SET applied = 2
              WHERE seq = (SELECT max(seq) FROM harness_adapter_ledger WHERE applied = 1)",
        )
        .await
        .unwrap();
    let counted =
        Adapter::start_scenario(&db.config.url, &[("SCENARIO", "accounting")], Stdio::null());
    let line = counted.next(Duration::from_secs(30));
    let last = counted
        .read_until(|read| read.last().is_some_and(|l| l["kind"] == "accounting"))
        .pop()
        .unwrap();
    assert_eq!(line["metric"], "lost_jobs", "{line}");
    assert_eq!(last["exact"], false, "{last}");
    assert_eq!(last["ledger"]["lost"], 1, "{last}");
    assert_eq!(
        last["ledger"]["lost_succeeded_without_effects"], 1,
        "{last}"
    );
    assert_eq!(last["ledger"]["duplicate_effects"], 1, "{last}");
    let mut child = counted;
    let status = child.child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{}", child.stderr());
}

#[tokio::test]
async fn harness_tokens_are_enqueued_exactly_in_bulk_inserts() {
    let db = TestDb::migrated().await;
    let mut adapter = Adapter::start(
        &db.config.url,
        &[
            ("PRODUCER_PACING", "harness"),
            // After standard input closes the producer paces itself at this rate: none here, so
            // the count is the tokens' alone.
            ("PRODUCER_RATE", "0"),
            ("PRODUCER_BATCH_MAX", "128"),
            ("BENCH_INSTANCE_ID", "3"),
        ],
    );
    assert_descriptor(&adapter.next(Duration::from_secs(30)), 3);
    // 300 is more than one insert's 128; the lines that are no token are ignored.
    adapter.send("ENQUEUE 300\nnot a token\nENQUEUE 300\nENQUEUE 0\nENQUEUE 300\nENQUEUE 7\n");
    let client = db.client().await;
    eventually("the tokens' 907 jobs enqueued", || async {
        client
            .query_one("SELECT count(*) = 907 FROM harness_adapter_ledger", &[])
            .await
            .unwrap()
            .get(0)
    })
    .await;
    let running = adapter.read_until(|read| ticks_with_all_metrics(read, 1));
    assert!(running.iter().all(|s| s["instance_id"] == 3));
    let (ledger, _) = finish(adapter, &db).await;
    assert_eq!(ledger["enqueued"], 907);
    // No batch above 128: the jobs of one insert share its transaction id (`xmin` of the
    // insert-only intake rows); at least ceil(300 / 128) = 3 inserts per 300 token.
    let largest: i64 = client
        .query_one(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM etl_job_intake
                                  WHERE kind = 'harness_adapter.job' GROUP BY xmin::text) b",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(largest <= 128, "an insert of {largest} jobs");
}

#[tokio::test]
async fn a_depth_target_run_keeps_the_backlog_at_the_target() {
    let db = TestDb::migrated().await;
    let adapter = Adapter::start(
        &db.config.url,
        &[
            ("PRODUCER_MODE", "depth-target"),
            ("TARGET_DEPTH", "40"),
            ("WORKER_COUNT", "2"),
            ("JOB_WORK_MS", "20"),
        ],
    );
    assert_descriptor(&adapter.next(Duration::from_secs(30)), 0);
    let running = adapter.read_until(|read| ticks_with_all_metrics(read, 3));
    let depths = values(&running, "queue_depth");
    // One producer never tops the due jobs above the target; the replica's 2 slots drain about
    // 100 jobs a second, so the backlog it keeps up is seen at a tick.
    assert!(depths.iter().all(|d| *d <= 40.0), "{depths:?}");
    assert!(depths.iter().any(|d| *d > 0.0), "{depths:?}");
    assert!(values(&running, "producer_target_rate")
        .iter()
        .all(|r| *r == 0.0));
    finish(adapter, &db).await;
}
