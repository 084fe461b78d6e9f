//! `durable-etl bench`: both modes run real replicas to completion on their own database, report
//! figures read from the database and the replicas, and leave nothing behind. No figure's size
//! is asserted (tests never judge speed), only that each was measured.

use crate::support::{admin_config, connect};
use std::process::Command;

/// Runs `durable-etl bench` with `args` on a database named after `tag`; returns the JSON report
/// and the database name.
pub(crate) fn bench(tag: &str, args: &[&str]) -> (serde_json::Value, String) {
    let mut args = args.to_vec();
    args.push("--json");
    let (out, name) = bench_output(tag, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), name)
}

/// Runs `durable-etl bench` with `args` (no `--json` added) on a database named after `tag`;
/// returns what the process left and the database name.
pub(crate) fn bench_output(tag: &str, args: &[&str]) -> (std::process::Output, String) {
    let name = bench_name(tag);
    (bench_on(&name, args), name)
}

/// A bench database name of a test's own, after `tag`.
fn bench_name(tag: &str) -> String {
    // Database names are at most 63 bytes: a 12-digit unique suffix keeps them under.
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("durable_etl_bench_test_{tag}_{}", &unique[..12])
}

/// Runs `durable-etl bench` with `args` on database `name`; returns what the process left.
fn bench_on(name: &str, args: &[&str]) -> std::process::Output {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .arg("bench")
        .args(args)
        .args(["--bench-database", name])
        .output()
        .unwrap()
}

/// The server CPU fields of `report` (microseconds per job): `server_cpu_us_per_job` and its
/// replicas, producers, aux and other split, in that order. Panics (with the report) unless each
/// is present, finite and non-negative, and the first is the sum of the next three.
pub(crate) fn server_cpu(report: &serde_json::Value) -> [f64; 5] {
    let fields = [
        "server_cpu_us_per_job",
        "server_cpu_replicas_us_per_job",
        "server_cpu_producers_us_per_job",
        "server_cpu_aux_us_per_job",
        "server_cpu_other_us_per_job",
    ]
    .map(|key| {
        let value = report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {report}"));
        assert!(value.is_finite() && value >= 0.0, "{key}: {report}");
        value
    });
    let [total, replicas, producers, aux, _] = fields;
    assert!(
        (total - (replicas + producers + aux)).abs() <= 1e-6 * total.max(1.0),
        "server CPU is replicas + producers + aux: {report}"
    );
    fields
}

/// The figure `key` of `figures`, which must be a finite number.
pub(crate) fn number(figures: &serde_json::Value, key: &str) -> f64 {
    let value = figures[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {figures}"));
    assert!(value.is_finite(), "{key}: {figures}");
    value
}

/// Whether the test server runs on this host (its backends show in this host's `/proc`), so
/// that the bench can read its CPU.
pub(crate) async fn server_is_local() -> bool {
    let pid: i32 = connect(&admin_config())
        .await
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"postgres: "))
}

/// Whether database `name` exists.
pub(crate) async fn exists(name: &str) -> bool {
    connect(&admin_config())
        .await
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .unwrap()
        .is_some()
}

/// The elements of the XML document `text`, by name, in document order; panics if it is not
/// well-formed (unclosed or mismatched elements, unquoted attributes, bad escapes).
pub(crate) fn elements(text: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(text);
    let (mut names, mut open) = (Vec::new(), Vec::new());
    loop {
        match reader.read_event().unwrap() {
            quick_xml::events::Event::Start(e) => {
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                for attribute in e.attributes() {
                    attribute.unwrap();
                }
                open.push(name.clone());
                names.push(name);
            }
            quick_xml::events::Event::Empty(e) => {
                names.push(String::from_utf8(e.name().as_ref().to_vec()).unwrap());
            }
            quick_xml::events::Event::End(e) => {
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                assert_eq!(open.pop(), Some(name), "mismatched end tag");
            }
            quick_xml::events::Event::Text(t) => {
                t.decode().unwrap();
            }
            quick_xml::events::Event::Eof => break,
            _ => {}
        }
    }
    assert!(open.is_empty(), "unclosed elements: {open:?}");
    names
}

#[tokio::test]
async fn burn_down_drains_every_job_through_several_replicas_and_drops_its_database() {
    let dir = std::env::temp_dir().join(format!("durable-etl-report-{}", uuid::Uuid::new_v4()));
    let (report, name) = bench(
        "burn",
        &[
            "burn-down",
            "--jobs",
            "300",
            "--replicas",
            "2",
            "--slots",
            "16",
            "--claim-cooldown",
            "1500us",
            "--report",
            dir.to_str().unwrap(),
        ],
    );
    // The HTML report: one well-formed, self-contained page with the three plots, one line per
    // replica in the throughput plot, and the run's figures.
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let names = elements(&page);
    assert_eq!(names.iter().filter(|n| *n == "svg").count(), 3, "{page}");
    assert_eq!(
        names.iter().filter(|n| *n == "polyline").count(),
        3,
        "{page}"
    );
    assert!(names.iter().filter(|n| *n == "rect").count() >= 1, "{page}");
    for external in ["<script", "src=", "href=", "<link", "@import"] {
        assert!(!page.contains(external), "{external} in {page}");
    }
    assert!(page.contains("burn-down of 300 jobs, 2 replica(s) x 16 slots"));
    // A backlog's claims never wait for the cooldown: the burn-down drained all the same.
    assert!(page.contains("claim cooldown 1.5 ms"), "{page}");
    assert!(page.contains("<th>succeeded</th><td>300</td>"), "{page}");
    assert!(
        page.contains("replicas / producers / aux / other"),
        "{page}"
    );
    assert_eq!(report["config"]["mode"], "burn_down");
    assert_eq!(report["succeeded"], 300);
    assert_eq!(report["not_succeeded"], 0);
    assert!(report["jobs_per_s"].as_f64().unwrap() > 0.0);
    // Every claim and completion was counted by the replicas themselves.
    let claims = report["claims"].as_u64().unwrap();
    let commits = report["commit_batches"].as_u64().unwrap();
    // Each claim takes at most the room of a replica: its slots and what it claims ahead.
    let room = 16 + durable_etl::config::PREFETCH_DEFAULT as u64;
    assert!(claims >= 300u64.div_ceil(room) && commits >= 1, "{report}");
    assert!(report["round_trips_per_job"].as_f64().unwrap() > 0.0);
    assert!(report["wal_bytes_per_job"].as_f64().unwrap() > 0.0);
    assert!(report["replica_peak_rss_mib"].as_f64().unwrap() > 0.0);
    // No producers in a burn-down: the fill ran before the window, on the bench's own session.
    let [_, _, producers, _, _] = server_cpu(&report);
    assert_eq!(producers, 0.0, "{report}");
    assert!(report["ack_to_done_ms"].is_null());
    assert!(report["ack_to_start_ms"].is_null());
    assert!(!exists(&name).await, "the bench dropped its database");
}

#[tokio::test]
async fn offered_load_reports_pickup_latency_of_etl_jobs_and_can_keep_its_database() {
    let (report, name) = bench(
        "offered",
        &[
            "offered-load",
            "--rate",
            "40",
            "--duration",
            "500ms",
            "--handler",
            "etl",
            "--keep",
        ],
    );
    assert_eq!(report["config"]["mode"], "offered_load");
    // The producer stops when the 500 ms are over: a late last job may be left out, never one
    // more than the 20 scheduled, and every job offered succeeds.
    let offered = report["offered"].as_u64().unwrap();
    assert_eq!(report["scheduled"], 20, "{report}");
    assert!((1..=20).contains(&offered), "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    let ack = &report["ack_to_done_ms"];
    assert!(ack["p50"].as_f64().unwrap() <= ack["max"].as_f64().unwrap());
    assert!(report["enqueue_to_start_ms"]["max"].as_f64().unwrap() > 0.0);
    // Every offered job's handler start was recorded by its replica, and comes before the
    // statement that completed the job (same host clock). It may come before the producer
    // saw its acknowledgement: the job is claimable from its commit on.
    assert_eq!(report["ack_to_start_ms"]["samples"], offered, "{report}");
    let jobs = report["per_job_ms"].as_array().unwrap();
    assert_eq!(jobs.len() as u64, offered);
    for job in jobs {
        let start = job["ack_to_start"].as_f64().unwrap();
        let done = job["ack_to_done"].as_f64().unwrap();
        assert!(start <= done, "{job}");
    }
    // The kept database holds the loaded rows: 10 records per offered job, each applied once.
    assert!(exists(&name).await);
    let client = crate::bench_queues::kept(&name).await;
    let rows: i64 = client
        .query_one("SELECT count(*) FROM etl_target_rows", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows as u64, 10 * offered);
    drop(client);
    crate::bench_queues::drop_kept(&name).await;
}

/// `--fail`: a burn-down of failing jobs. Every job ends `failed` after one attempt with its
/// diagnosis and its dead letter, and the per-job figures are per job ended, not per success.
#[tokio::test]
async fn a_burn_down_of_failing_jobs_ends_each_once_with_its_diagnosis_and_letter() {
    let (report, name) = bench(
        "fail",
        &[
            "burn-down",
            "--jobs",
            "60",
            "--replicas",
            "1",
            "--fail",
            "--keep",
        ],
    );
    assert_eq!(report["config"]["shape"]["fail"], true, "{report}");
    assert_eq!(report["succeeded"], 0, "{report}");
    assert_eq!(report["not_succeeded"], 60, "{report}");
    assert!(
        report["wal_bytes_per_job"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["round_trips_per_job"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    if server_is_local().await {
        assert!(server_cpu(&report)[1] > 0.0, "{report}");
    }
    let client = crate::bench_queues::kept(&name).await;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE o.status = 'failed' AND o.failure_code = 'handler_failed'
                                       AND o.attempts = 1
                                       AND o.diagnosis #>> '{chain,0,type}' = 'std::io::error::Error'
                                       AND o.diagnosis #> '{detail,asked}' = 'true'),
                    count(*),
                    (SELECT count(*) FROM etl_dead_letters WHERE code = 'handler_failed')
               FROM etl_job_outcomes o",
            &[],
        )
        .await
        .unwrap();
    let (failed, ended, letters): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((failed, ended, letters), (60, 60, 60));
    drop(client);
    crate::bench_queues::drop_kept(&name).await;
}

/// The offered load's server CPU counts the producers' backends (their inserts, the enqueue
/// trigger, their commits) apart from the replicas', over the window; sizes are not judged.
#[tokio::test]
async fn offered_load_counts_the_producers_server_cpu_apart_from_the_replicas() {
    let (report, name) = bench(
        "server_cpu",
        &[
            "offered-load",
            "--rate",
            "300",
            "--duration",
            "1s",
            "--producers",
            "1",
            "--replicas",
            "1",
        ],
    );
    let offered = report["offered"].as_u64().unwrap();
    assert!(offered >= 100, "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    let [total, replicas, producers, _, _] = server_cpu(&report);
    if server_is_local().await {
        // A few hundred single-job statements: many clock ticks of backend CPU on each side.
        // (`server_cpu` checked that the total is their sum with the aux processes'.)
        assert!(producers > 0.0 && replicas > 0.0, "{report}");
    } else {
        assert_eq!(total, 0.0, "a remote server's CPU is not read: {report}");
    }
    assert!(!exists(&name).await);
}

#[test]
fn bench_refuses_a_database_that_is_not_its_own() {
    let out = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .args(["bench", "burn-down", "--bench-database", "postgres"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("durable_etl_bench"));
}

#[tokio::test]
async fn recovery_times_each_kill_until_a_live_replica_runs_the_job_again() {
    let (report, name) = bench(
        "recovery",
        &["recovery", "--trials", "2", "--replicas", "1"],
    );
    assert_eq!(report["config"]["mode"], "recovery");
    // At least two replicas, whatever was asked: one to kill, one to take over.
    assert_eq!(report["config"]["replicas"], 2);
    // Each trial kills one job inside its effects and one computing; each then succeeds.
    assert_eq!(report["succeeded"], 4, "{report}");
    // With the default settings a killed replica's job runs elsewhere within 2 s, whether it
    // was computing or inside its effects: its silence is 1.75 s, and the rescuer judges again
    // the moment it ends.
    for phase in ["recovery_effects_ms", "recovery_compute_ms"] {
        let recovery = &report[phase];
        assert_eq!(recovery["samples"], 2, "{report}");
        assert!(recovery["p50"].as_f64().unwrap() > 0.0, "{report}");
        assert!(
            recovery["max"].as_f64().unwrap() < 2000.0,
            "{phase}: {report}"
        );
    }
    assert!(!exists(&name).await);
}

/// A signal stops a bench at once: its replicas are killed with it and it exits 1
/// (`cancelled`), where it used to run its schedule to the end whatever it was sent.
#[tokio::test]
async fn a_shutdown_signal_stops_a_bench_and_its_replicas() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("durable_etl_bench_test_sigterm_{}", &unique[..12]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .args([
            "bench",
            "offered-load",
            "--rate",
            "20",
            "--duration",
            "600s",
        ])
        .args(["--replicas", "2", "--bench-database", &name])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let admin = connect(&admin_config()).await;
    let replicas = "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = $1 AND application_name = 'durable-etl/session'";
    crate::support::eventually("the bench's replicas to run", || async {
        let row = admin.query_one(replicas, &[&name]).await.unwrap();
        row.get::<_, i64>(0) == 2
    })
    .await;
    crate::support::signal(&child, "TERM");
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    });
    let (status, err) = tokio::time::timeout(std::time::Duration::from_secs(60), status)
        .await
        .expect("the bench to stop at the signal")
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("[cancelled]"), "{err}");
    crate::support::eventually("the bench's replicas to be gone", || async {
        let row = admin.query_one(replicas, &[&name]).await.unwrap();
        row.get::<_, i64>(0) == 0
    })
    .await;
    let quoted = durable_etl::db::quote_ident(&name);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
        .await
        .unwrap();
}

/// The URLs users run: a password (any is accepted by the test server's trust authentication)
/// and two hosts, the first of which refuses connections, so only the second reaches the server.
/// Without `--bench-database` the bench picks a name of its own (the prefix and 8 hex digits,
/// new for every run), reaches it through the whole URL (its replicas too), and drops it.
#[tokio::test]
async fn bench_runs_on_a_multi_host_url_with_a_password_in_a_database_of_its_own() {
    let base = admin_config();
    let tokio_postgres::config::Host::Tcp(host) = &base.get_hosts()[0] else {
        panic!("a TCP host");
    };
    let port = base.get_ports()[0];
    let refused = crate::support::free_port();
    let url = format!("postgres://postgres:s3cret@127.0.0.1:{refused},{host}:{port}/postgres");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "warn")
            .args([
                "bench",
                "burn-down",
                "--jobs",
                "20",
                "--replicas",
                "1",
                "--json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["succeeded"], 20, "{report}");
        report["config"]["database"].as_str().unwrap().to_owned()
    };
    let (first, second) = (run(), run());
    for name in [&first, &second] {
        let suffix = name.strip_prefix("durable_etl_bench_").unwrap();
        assert!(suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!exists(name).await, "{name} dropped");
    }
    assert_ne!(first, second, "each run a database of its own");
}

/// `bench --bench-database` never drops a database it did not create (one of the user's with a
/// table), nor one of its own that a session uses (another bench, say): it stops with exit 2 and
/// `database_taken`, and the table and the session are intact. A database an earlier bench left
/// and no session uses is recreated, run on and dropped.
#[tokio::test]
async fn bench_never_drops_a_database_it_did_not_create_nor_one_in_use() {
    let name = bench_name("taken");
    let quoted = durable_etl::db::quote_ident(&name);
    let admin = connect(&admin_config()).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {quoted}"))
        .await
        .unwrap();
    let mut config = admin_config();
    config.dbname(&name);
    let user = connect(&config).await;
    user.batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .unwrap();
    let burn_down = ["burn-down", "--jobs", "20", "--replicas", "1", "--json"];
    let refused = |out: &std::process::Output, reason: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(reason), "{err}");
        assert!(err.contains("--bench-database NAME"), "{err}");
        assert!(err.contains("[database_taken]"), "{err}");
    };
    refused(
        &bench_on(&name, &burn_down),
        "exists without this tool's mark",
    );
    // As an earlier bench leaves it (`--keep`), with a session of the user's in it.
    let marker = durable_etl::db::marker("bench");
    admin
        .batch_execute(&format!("COMMENT ON DATABASE {quoted} IS '{marker}'"))
        .await
        .unwrap();
    refused(&bench_on(&name, &burn_down), "is in use");
    let kept: i64 = user
        .query_one("SELECT count(*) FROM mine", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1, "the table and the session are intact");
    drop(user);
    crate::support::eventually("the user's session to end", || async {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 0
    })
    .await;
    let out = bench_on(&name, &burn_down);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!exists(&name).await, "dropped at the end");
}
