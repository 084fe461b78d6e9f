//! Unit tests of the metrics registry and its Prometheus text exposition.

use super::*;
use crate::codes::Code;
use std::sync::atomic::Ordering;

#[test]
fn histograms_count_into_cumulative_buckets() {
    let h = Histogram::new(&[1.0, 2.0]);
    for v in [0.5, 1.0, 1.5, 3.0, -1.0] {
        h.observe(v);
    }
    assert_eq!(h.count(), 5);
    let mut out = String::new();
    let (name, help, histogram) = ("x", "help", h);
    encode(
        &mut out,
        vec![Box::new(Named {
            name,
            help,
            histogram,
        })],
    );
    assert!(out.contains("x_bucket{le=\"1\"} 3\n"), "{out}");
    assert!(out.contains("x_bucket{le=\"2\"} 4\n"), "{out}");
    assert!(out.contains("x_bucket{le=\"+Inf\"} 5\n"), "{out}");
    // prometheus-client writes a float sample with its decimal point (`6.0`), which a
    // scraper reads as the same number the hand-written `6` was.
    let sum = out.lines().find_map(|l| l.strip_prefix("x_sum "));
    assert_eq!(sum.map(str::parse::<f64>), Some(Ok(6.0)), "{out}");
    assert!(out.contains("x_count 5\n"), "{out}");
}

#[tokio::test]
async fn a_replica_is_ready_while_its_session_is_up_and_only_then() {
    let stats = WorkerStats::default();
    let down = workers_ready([&stats]);
    assert_eq!(down.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    let body = axum::body::to_bytes(down.into_body(), 4096).await.unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["code"], "database_unavailable", "{problem}");
    stats.session_up.store(1, Ordering::Relaxed);
    let up = workers_ready([&stats]);
    assert_eq!(up.status(), axum::http::StatusCode::OK);
    let body = axum::body::to_bytes(up.into_body(), 4096).await.unwrap();
    assert_eq!(&body[..], br#"{"status":"ready"}"#);
    stats.session_up.store(0, Ordering::Relaxed);
    assert_eq!(
        workers_ready([&stats]).status(),
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    );
}

#[test]
fn a_scrape_between_two_counter_bumps_does_not_underflow() {
    // A snapshot reads `claims` first and `claims_by_notify` later: a claim counted in
    // between makes the by-trigger count exceed the total it read.
    let stats = WorkerStats::default();
    stats.claims_by_notify.store(2, Ordering::Relaxed);
    stats.claims.store(1, Ordering::Relaxed);
    let text = render_worker(&stats);
    assert!(
        text.contains("durable_etl_claims_total{trigger=\"other\"} 0\n"),
        "{text}"
    );
}

#[test]
fn every_documented_metric_is_exposed_with_its_documented_type() {
    let stats = WorkerStats::default();
    let mut text = render_worker(&stats);
    let shared = Shared {
        connections: 2,
        idle_connections: 1,
        sample: Some(QueueSample::default()),
    };
    let capped = QueueDepth {
        queue: "mail".to_owned(),
        cap: Some(4),
        ..QueueDepth::default()
    };
    encode(
        &mut text,
        vec![Box::new(shared), Box::new(queues::PerQueue(vec![capped]))],
    );
    let help = (
        "durable_etl_http_responses",
        "HTTP responses served, by status class.",
    );
    render_counter_family(&mut text, help, "class", &[("2xx", 0)]);
    let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"));
    let section = doc.split("## Metrics").nth(1).unwrap();
    let rows = section.lines().filter(|l| l.starts_with("| `durable_etl_"));
    let mut documented = 0;
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let kind = cells[2];
        for name in cells[1].split(", ") {
            let name = name.trim_matches('`').split('{').next().unwrap();
            documented += 1;
            let type_line = format!("# TYPE {name} {kind}\n");
            assert!(text.contains(&type_line), "{type_line}{text}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
    }
    assert_eq!(documented, text.matches("# TYPE ").count(), "{text}");
    // The documented bounds, written the way the hand-written exposition wrote them.
    let latency = "0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 10 60 +Inf";
    let batch = "1 2 4 8 16 32 64 128 256 1024 +Inf";
    for (name, bounds) in [
        ("durable_etl_enqueue_to_start_seconds", latency),
        ("durable_etl_execution_seconds", latency),
        ("durable_etl_claim_batch_size", batch),
        ("durable_etl_commit_batch_size", batch),
    ] {
        let prefix = format!("{name}_bucket{{le=\"");
        let written: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix)?.split('"').next())
            .collect();
        assert_eq!(written.join(" "), bounds, "{name}");
    }
}

#[test]
fn worker_metrics_have_only_fixed_labels() {
    let stats = WorkerStats::default();
    stats.record(crate::worker::complete::completer::Transition::Failed(
        Code::RecordInvalid,
    ));
    let text = render_worker(&stats);
    assert!(text.contains("durable_etl_jobs_failed_total{code=\"record_invalid\"} 1"));
    assert!(text.contains("durable_etl_claims_total{trigger=\"notify\"} 0"));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let labels = line.split('{').nth(1).unwrap_or("");
        assert!(labels.len() < 40, "{line}");
    }
}

#[test]
fn per_queue_gauges_label_each_queue_and_only_capped_queues_have_a_cap() {
    let mail = QueueDepth {
        queue: "mail".to_owned(),
        due: 3,
        deferred: 1,
        running: 2,
        oldest_due_seconds: 1.5,
        cap: Some(4),
        permits_held: 2,
        paused: true,
        unserved: 1,
        key_cap: Some(2),
        key_permits_held: 3,
    };
    let bulk = QueueDepth {
        queue: "bulk".to_owned(),
        due: 7,
        ..QueueDepth::default()
    };
    let mut text = String::new();
    encode(
        &mut text,
        vec![Box::new(queues::PerQueue(vec![mail, bulk]))],
    );
    let value = |series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    for (series, expected) in [
        ("durable_etl_queue_due{queue=\"mail\"}", 3.0),
        ("durable_etl_queue_due{queue=\"bulk\"}", 7.0),
        ("durable_etl_queue_deferred{queue=\"mail\"}", 1.0),
        ("durable_etl_queue_running{queue=\"mail\"}", 2.0),
        (
            "durable_etl_queue_oldest_due_by_queue_seconds{queue=\"mail\"}",
            1.5,
        ),
        ("durable_etl_queue_cap{queue=\"mail\"}", 4.0),
        ("durable_etl_queue_permits_held{queue=\"mail\"}", 2.0),
        ("durable_etl_queue_paused{queue=\"mail\"}", 1.0),
        ("durable_etl_queue_paused{queue=\"bulk\"}", 0.0),
        ("durable_etl_queue_unserved{queue=\"mail\"}", 1.0),
        ("durable_etl_queue_unserved{queue=\"bulk\"}", 0.0),
        ("durable_etl_queue_key_cap{queue=\"mail\"}", 2.0),
        ("durable_etl_queue_key_permits_held{queue=\"mail\"}", 3.0),
    ] {
        assert_eq!(value(series), Some(expected), "{series} in {text}");
    }
    assert!(
        !text.contains("durable_etl_queue_cap{queue=\"bulk\"}"),
        "{text}"
    );
    assert!(!text.contains("durable_etl_queue_permits_held{queue=\"bulk\"}"));
    assert!(!text.contains("durable_etl_queue_key_cap{queue=\"bulk\"}"));
    assert!(!text.contains("durable_etl_queue_key_permits_held{queue=\"bulk\"}"));
}

/// The replica's endpoint reports the incarnation its source holds at each request, on a
/// kept-alive connection too, and answers `503` while it holds none (the replica starts again).
#[tokio::test]
async fn the_endpoint_reports_the_current_incarnation_and_is_unavailable_between_two() {
    let db = crate::test_db::TestDb::migrated().await;
    let pool = crate::db::connect_pool(&db.config, "test").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (current, source) = tokio::sync::watch::channel(None);
    let (trigger, shutdown) = crate::shutdown::manual();
    let serving = tokio::spawn(serve_worker(listener, vec![(None, source)], shutdown));
    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let http = http.clone();
        async move {
            let answer = http
                .get(format!("http://{address}{path}"))
                .send()
                .await
                .unwrap();
            (answer.status().as_u16(), answer.text().await.unwrap())
        }
    };
    for path in ["/readyz", "/metrics"] {
        let (status, body) = get(path).await;
        assert_eq!(status, 503, "{path}");
        assert!(body.contains("database_unavailable"), "{body}");
    }
    let first = std::sync::Arc::new(WorkerStats::default());
    first.session_up.store(1, Ordering::Relaxed);
    first.record_adopted(3);
    current.send_replace(Some((std::sync::Arc::clone(&first), pool.clone())));
    assert_eq!(get("/readyz").await.0, 200);
    let (status, body) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("durable_etl_database_up 1"), "{body}");
    assert!(body.contains("durable_etl_jobs_adopted_total 3"), "{body}");
    let second = std::sync::Arc::new(WorkerStats::default());
    current.send_replace(Some((second, pool)));
    assert_eq!(get("/readyz").await.0, 503, "the new incarnation's session");
    current.send_replace(None);
    assert_eq!(get("/metrics").await.0, 503);
    trigger.request(crate::shutdown::Stage::Draining);
    serving.await.unwrap().unwrap();
}

/// Two cells' replicas in one exposition: each family's HELP and TYPE once, every sample
/// labelled with its cell first (with or without labels of its own), histograms whole.
#[test]
fn several_cells_merge_into_one_exposition_each_sample_under_its_cell() {
    let (a, b) = (WorkerStats::default(), WorkerStats::default());
    a.record_adopted(3);
    b.record_adopted(5);
    let parts = [
        (Some("cell_a".to_owned()), render_worker(&a)),
        (Some("cell_b".to_owned()), render_worker(&b)),
    ];
    let text = merge_cells(&parts);
    for line in [
        "durable_etl_jobs_adopted_total{cell=\"cell_a\"} 3",
        "durable_etl_jobs_adopted_total{cell=\"cell_b\"} 5",
        "durable_etl_claims_total{cell=\"cell_b\",trigger=\"notify\"} 0",
        "durable_etl_claim_batch_size_count{cell=\"cell_a\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    let single = render_worker(&a);
    let headers = |t: &str| t.lines().filter(|l| l.starts_with('#')).count();
    assert_eq!(headers(&text), headers(&single));
    assert_eq!(
        text.lines().count(),
        2 * single.lines().count() - headers(&single)
    );
    // A family's samples follow its header: no sample of one family sits under another's.
    let mut family = String::new();
    for line in text.lines() {
        match line.strip_prefix("# TYPE ") {
            Some(typed) => family = typed.split(' ').next().unwrap_or_default().to_owned(),
            None if !line.starts_with('#') => {
                let base = family.trim_end_matches("_total");
                assert!(line.starts_with(base), "{line} under {family}");
            }
            None => {}
        }
    }
    // A sample without a cell is kept as it is, and an empty label set takes the cell alone.
    let unlabelled = merge_cells(&[(None, "# TYPE x gauge\nx 1\n".to_owned())]);
    assert_eq!(unlabelled, "# TYPE x gauge\nx 1\n");
    assert_eq!(labelled_line("x{} 1", "c"), "x{cell=\"c\"} 1");
    assert_eq!(labelled_line("x", "c"), "x");
}

/// A process serving several cells is ready while every cell's replica is, and reports them all.
#[tokio::test]
async fn an_endpoint_of_several_cells_is_ready_only_while_every_cell_is() {
    let db = crate::test_db::TestDb::migrated().await;
    let pool = crate::db::connect_pool(&db.config, "test").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (a, b) = (
        std::sync::Arc::new(WorkerStats::default()),
        std::sync::Arc::new(WorkerStats::default()),
    );
    let (_keep_a, source_a) = tokio::sync::watch::channel(Some((a.clone(), pool.clone())));
    let (_keep_b, source_b) = tokio::sync::watch::channel(Some((b.clone(), pool)));
    let sources = vec![
        (Some("cell_a".to_owned()), source_a),
        (Some("cell_b".to_owned()), source_b),
    ];
    let (trigger, shutdown) = crate::shutdown::manual();
    let serving = tokio::spawn(serve_worker(listener, sources, shutdown));
    let get = |path: &'static str| async move {
        let answer = reqwest::get(format!("http://{address}{path}"))
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    };
    a.session_up.store(1, Ordering::Relaxed);
    assert_eq!(get("/readyz").await.0, 503, "cell_b is not up");
    b.session_up.store(1, Ordering::Relaxed);
    assert_eq!(get("/readyz").await.0, 200);
    let (status, body) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("durable_etl_database_up{cell=\"cell_a\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("durable_etl_database_up{cell=\"cell_b\"} 1"),
        "{body}"
    );
    trigger.request(crate::shutdown::Stage::Draining);
    serving.await.unwrap().unwrap();
}
