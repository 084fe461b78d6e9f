//! `durable-etl bench offered-load`'s producers (#26): several producers share one open-loop
//! schedule, batches go out as one statement each, and the figures put the achieved rate and the
//! enqueue lag beside the asked rate, and say so loudly when the asked rate was missed; a sweep's
//! report plots every rate; `bench depth-target` keeps the backlog near its depth. No figure's
//! size is asserted beyond coarse invariants (tests never judge speed).

use crate::bench::{bench, bench_output, elements, exists, server_cpu};
use crate::bench_queues::{drop_kept, kept};
use crate::support::first_column;

/// `report[key]` as a number; panics (with the report) if it is not one.
fn number(report: &serde_json::Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {report}"))
}

/// Runs `durable-etl bench` with `args` (text output) on a database named after `tag`; returns
/// what it printed and the database name. Panics if it failed.
fn bench_text(tag: &str, args: &[&str]) -> (String, String) {
    let (out, name) = bench_output(tag, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), name)
}

#[tokio::test]
async fn bench_two_producers_offer_batches_and_report_the_achieved_rate_beside_the_asked_one() {
    let (report, name) = bench(
        "producers",
        &[
            "offered-load",
            "--rate",
            "100",
            "--duration",
            "2s",
            "--producers",
            "2",
            "--batch",
            "4",
            "--replicas",
            "2",
            "--claim-cooldown",
            "20ms",
            "--keep",
        ],
    );
    assert_eq!(report["config"]["producers"], 2, "{report}");
    // The replicas started with the cooldown (a flag they refused would fail their start).
    assert_eq!(report["config"]["claim_cooldown_us"], 20_000, "{report}");
    assert_eq!(report["config"]["batch"], 4, "{report}");
    assert_eq!(
        (report["producers"].clone(), report["batch"].clone()),
        (2.into(), 4.into())
    );
    assert_eq!(number(&report, "asked_rate"), 100.0);
    assert_eq!(report["scheduled"], 200, "{report}");
    let offered = report["offered"].as_u64().unwrap();
    assert!((100..=200).contains(&offered), "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    // Credited with at most the asked rate, and well within a wide band of it.
    let achieved = number(&report, "achieved_rate");
    assert!((50.0..=100.0).contains(&achieved), "{report}");
    assert_eq!(report["rate_missed"], false, "{report}");
    server_cpu(&report);
    assert!(
        number(&report, "span_s") >= offered as f64 / 100.0,
        "{report}"
    );
    // One lag per statement of 4 jobs, in order.
    let lag = &report["lag_ms"];
    assert_eq!(
        lag["samples"].as_u64().unwrap(),
        offered.div_ceil(4),
        "{report}"
    );
    let (p50, p99, max) = (number(lag, "p50"), number(lag, "p99"), number(lag, "max"));
    assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{report}");
    // Each statement enqueued its 4 jobs in one transaction: one inserting transaction id
    // (`xmin` of the insert-only intake rows) per statement; two statements may share a
    // `created_at` microsecond.
    let client = kept(&name).await;
    let sizes: Vec<i64> = first_column(
        &client,
        "SELECT count(*) FROM etl_job_intake GROUP BY xmin::text ORDER BY 1",
    )
    .await;
    assert_eq!(sizes.len() as u64, offered.div_ceil(4), "{sizes:?}");
    assert!(sizes.iter().all(|&n| n == 4), "{sizes:?}");
    drop(client);
    drop_kept(&name).await;
    assert!(!exists(&name).await);
}

#[tokio::test]
async fn bench_an_impossible_rate_is_cut_off_at_the_duration_and_flagged_loudly() {
    let dir = std::env::temp_dir().join(format!("durable-etl-report-{}", uuid::Uuid::new_v4()));
    let impossible = [
        "offered-load",
        "--rate",
        "1000000",
        "--duration",
        "1s",
        "--json",
        "--report",
        dir.to_str().unwrap(),
    ];
    let (out, name) = bench_output("missed", &impossible);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rate_missed"], true, "{report}");
    assert_eq!(report["producers"], 1, "{report}");
    assert_eq!(report["scheduled"], 1_000_000, "{report}");
    // The duration stopped the producer long before the schedule's end, and said how far it got.
    let offered = report["offered"].as_u64().unwrap();
    assert!(offered > 0 && offered < 1_000_000, "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    let achieved = number(&report, "achieved_rate");
    assert!(achieved > 0.0 && achieved < 0.98 * 1_000_000.0, "{report}");
    // Late all along: the last statement went out far behind its due time.
    assert!(number(&report["lag_ms"], "max") > 0.0, "{report}");
    assert!(stderr.contains("WARNING: offered "), "{stderr}");
    assert!(stderr.contains(" of 1000000 jobs/s asked ("), "{stderr}");
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        page.contains("<p class=\"warning\"><strong>WARNING: offered "),
        "{page}"
    );
    assert!(!exists(&name).await);
    // The text output puts the warning right under the run's description.
    let (text, name) = bench_text(
        "missed_text",
        &["offered-load", "--rate", "1000000", "--duration", "300ms"],
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("offered load of 1000000 jobs/s"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("WARNING: offered ")
            && lines[1].contains(" of 1000000 jobs/s asked ("),
        "{text}"
    );
    assert!(lines[2].starts_with("offered "), "{text}");
    assert!(text.contains("enqueue lag "), "{text}");
    assert!(!exists(&name).await);
}

#[tokio::test]
async fn bench_a_rate_sweep_runs_each_rate_in_turn_and_prints_one_report_per_rate() {
    let (report, name) = bench(
        "sweep",
        &["offered-load", "--rate", "20,40", "--duration", "500ms"],
    );
    let reports = report.as_array().unwrap_or_else(|| panic!("{report}"));
    assert_eq!(reports.len(), 2, "{report}");
    for (report, rate) in reports.iter().zip([20.0, 40.0]) {
        assert_eq!(report["config"]["rate"].as_f64(), Some(rate), "{report}");
        assert_eq!(number(report, "asked_rate"), rate, "{report}");
        assert_eq!(number(report, "scheduled"), rate / 2.0, "{report}");
        // Each rate ran on a fresh database: it counts its own jobs only.
        let offered = report["offered"].as_u64().unwrap();
        assert!(offered >= 1 && offered as f64 <= rate / 2.0, "{report}");
        assert_eq!(report["succeeded"], offered, "{report}");
    }
    assert!(!exists(&name).await);
}

/// Checks that `report`'s claims, empty claims and commits per job are its counts per succeeded
/// job.
fn assert_per_job_counts(report: &serde_json::Value) {
    let succeeded = number(report, "succeeded");
    assert!(succeeded > 0.0, "{report}");
    for (count, per_job) in [
        ("claims", "claims_per_job"),
        ("empty_claims", "empty_claims_per_job"),
        ("commit_batches", "commits_per_job"),
    ] {
        let expected = number(report, count) / succeeded;
        assert!(
            (number(report, per_job) - expected).abs() < 1e-9,
            "{per_job}: {report}"
        );
    }
    assert!(number(report, "claims_per_job") > 0.0, "{report}");
    assert!(number(report, "commits_per_job") > 0.0, "{report}");
    assert!(number(report, "wal_bytes_per_job") > 0.0, "{report}");
}

#[tokio::test]
async fn bench_a_sweep_report_plots_every_rate_and_flags_a_missed_one_loudly() {
    let dir = std::env::temp_dir().join(format!("durable-etl-sweep-{}", uuid::Uuid::new_v4()));
    let (report, name) = bench(
        "sweep_report",
        &[
            "offered-load",
            "--rate",
            "20,1000000",
            "--duration",
            "500ms",
            "--report",
            dir.to_str().unwrap(),
        ],
    );
    // The JSON of a sweep stays an array, one report per rate, each with its per-job counts.
    let reports = report.as_array().unwrap_or_else(|| panic!("{report}"));
    assert_eq!(reports.len(), 2, "{report}");
    // 1,000,000 jobs/s is out of reach; 20 jobs/s is not judged (tests never time anything).
    assert_eq!(reports[1]["rate_missed"], true, "{report}");
    let missed = reports.iter().filter(|r| r["rate_missed"] == true).count();
    reports.iter().for_each(assert_per_job_counts);
    reports.iter().for_each(|r| {
        server_cpu(r);
    });
    // Each rate keeps its own page, and the sweep's page plots them all.
    for rate in ["20", "1000000"] {
        assert!(
            dir.join(format!("rate-{rate}/index.html")).exists(),
            "{rate}"
        );
    }
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let names = elements(&page);
    assert_eq!(names.iter().filter(|n| *n == "svg").count(), 5, "{page}");
    // One point per rate on every line: 2 + 3 + 5 + 4 + 1 lines (server CPU, its replicas',
    // producers' and aux parts, the replica processes'), each with a polyline.
    assert_eq!(
        names.iter().filter(|n| *n == "circle").count(),
        2 * 15,
        "{page}"
    );
    assert_eq!(
        names.iter().filter(|n| *n == "polyline").count(),
        15,
        "{page}"
    );
    assert!(
        page.contains("of which replicas / producers / aux"),
        "{page}"
    );
    for external in ["<script", "src=", "<link", "@import"] {
        assert!(!page.contains(external), "{external} in {page}");
    }
    assert!(page.contains("<a href=\"rate-20/index.html\">"), "{page}");
    // Each missed rate is loud: a warning, a marked row, and a line through it in every plot.
    assert!(
        page.contains("<p class=\"warning\"><strong>At 1000000 jobs/s asked: WARNING: offered "),
        "{page}"
    );
    assert_eq!(
        page.matches("<p class=\"warning\">").count(),
        missed,
        "{page}"
    );
    assert_eq!(
        page.matches("<td class=\"missed\">").count(),
        missed,
        "{page}"
    );
    assert_eq!(page.matches(">MISSED</text>").count(), 5 * missed, "{page}");
    assert!(!exists(&name).await);
}

#[tokio::test]
async fn bench_depth_target_keeps_the_backlog_near_its_depth_with_bulk_top_ups() {
    let dir = std::env::temp_dir().join(format!("durable-etl-depth-{}", uuid::Uuid::new_v4()));
    // Slow jobs (200 ms, 4 slots: at most 20 jobs/s) so that two producers keep the depth.
    let (report, name) = bench(
        "depth",
        &[
            "depth-target",
            "--depth",
            "40",
            "--duration",
            "2s",
            "--producers",
            "2",
            "--batch",
            "8",
            "--slots",
            "4",
            "--job-ms",
            "200",
            "--report",
            dir.to_str().unwrap(),
            "--keep",
        ],
    );
    assert_eq!(report["config"]["mode"], "depth_target", "{report}");
    assert_eq!(
        (report["depth"].clone(), report["producers"].clone()),
        (40.into(), 2.into()),
        "{report}"
    );
    // The depth was held: counted many times, its median at the depth, and never above what
    // the reservations allow (depth + producers x batch).
    server_cpu(&report);
    let held = &report["depth_held"];
    assert!(held["samples"].as_u64().unwrap() >= 10, "{report}");
    assert_eq!(report["depth_missed"], false, "{report}");
    assert!(number(held, "median") >= 0.98 * 40.0, "{report}");
    assert!(number(held, "max") <= 40.0 + 2.0 * 8.0, "{report}");
    assert!(number(held, "min") <= number(held, "median"), "{report}");
    // Every offered job ran, was paired with its acknowledgement and handler start, and the
    // throughput counts the window's completions only.
    let offered = report["offered"].as_u64().unwrap();
    assert!(offered >= 40, "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    assert_eq!(report["ack_to_start_ms"]["samples"], offered, "{report}");
    assert_eq!(
        report["per_job_ms"].as_array().unwrap().len() as u64,
        offered
    );
    let completed = number(&report, "completed_in_window");
    assert!(completed > 0.0 && completed <= offered as f64, "{report}");
    assert_eq!(number(&report, "window_jobs_per_s"), completed / 2.0);
    assert_per_job_counts(&report);
    assert!(report["asked_rate"].is_null(), "{report}");
    // Bulk top-ups: each statement one transaction of at most 8 jobs.
    let client = kept(&name).await;
    let sizes: Vec<i64> = first_column(
        &client,
        "SELECT count(*) FROM etl_job_intake GROUP BY xmin::text ORDER BY 1",
    )
    .await;
    assert_eq!(sizes.len() as u64, report["statements"].as_u64().unwrap());
    assert!(sizes.iter().all(|&n| (1..=8).contains(&n)), "{sizes:?}");
    drop(client);
    drop_kept(&name).await;
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    elements(&page);
    assert!(
        page.contains("depth target of 40 due jobs for 2 s"),
        "{page}"
    );
    assert!(
        page.contains("<th>depth held min / median / max of asked</th>"),
        "{page}"
    );
    assert!(!page.contains("class=\"warning\""), "{page}");
}

#[tokio::test]
async fn bench_depth_target_that_cannot_hold_its_depth_says_so_loudly() {
    // A depth the one producer cannot fill within 300 ms: never held, and said on stdout.
    let (text, name) = bench_text(
        "depth_missed",
        &["depth-target", "--depth", "10000000", "--duration", "300ms"],
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("depth target of 10000000 due jobs"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("WARNING: held a median of 0 of 10000000 due jobs asked"),
        "{text}"
    );
    assert!(lines[2].starts_with("depth held "), "{text}");
    assert!(text.contains("claims per job "), "{text}");
    assert!(!exists(&name).await);
}
