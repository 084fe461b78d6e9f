//! `durable-etl bench offered-load`'s producers (#26): several producers share one open-loop
//! schedule, batches go out as one statement each, and the figures put the achieved rate and the
//! enqueue lag beside the asked rate, and say so loudly when the asked rate was missed. No
//! figure's size is asserted beyond coarse invariants (tests never judge speed).

use crate::bench::{bench, bench_output, exists};
use crate::bench_queues::{drop_kept, kept};
use crate::support::first_column;

/// `report[key]` as a number; panics (with the report) if it is not one.
fn number(report: &serde_json::Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {report}"))
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
            "--keep",
        ],
    );
    assert_eq!(report["config"]["producers"], 2, "{report}");
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
    // Each statement enqueued its 4 jobs in one transaction (one `created_at` per statement).
    let client = kept(&name).await;
    let sizes: Vec<i64> = first_column(
        &client,
        "SELECT count(*) FROM etl_jobs GROUP BY created_at ORDER BY 1",
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
    let (out, name) = bench_output(
        "missed_text",
        &["offered-load", "--rate", "1000000", "--duration", "300ms"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
