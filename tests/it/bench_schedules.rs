//! `durable-etl bench schedules`: a small run records every fire of its window exactly once,
//! reports the lateness and the idle ticks' scans, and can keep its database for a look. Counts
//! are asserted, never timings: the schedules catch up, so a slow machine makes fires late, not
//! missing.

use crate::bench::{bench, exists, number};

#[tokio::test]
async fn schedules_records_every_fire_of_its_window_once_and_reports_lateness_and_idle_scans() {
    let dir = std::env::temp_dir().join(format!("durable-etl-report-{}", uuid::Uuid::new_v4()));
    let (report, name) = bench(
        "schedules",
        &[
            "schedules",
            "--schedules",
            "20",
            "--duration",
            "3s",
            "--replicas",
            "2",
            "--idle-schedules",
            "200",
            "--idle-duration",
            "2s",
            "--keep",
            "--report",
            dir.to_str().unwrap(),
        ],
    );
    // The HTML report: a well-formed page whose table holds the figures, a row each.
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let names = crate::bench::elements(&page);
    assert_eq!(names.iter().filter(|n| *n == "table").count(), 1, "{page}");
    assert!(names.iter().filter(|n| *n == "tr").count() >= 7, "{page}");
    assert!(
        page.contains("<tr><th>fires</th><td>60 expected, 60 recorded"),
        "{page}"
    );
    assert!(
        page.contains("<tr><th>fire lateness</th><td>p50 "),
        "{page}"
    );
    assert_eq!(report["config"]["mode"], "schedules", "{report}");
    let figures = &report["schedules"];
    // 20 schedules x 3 whole seconds, each fire recorded once, each with its own job.
    assert_eq!(figures["fires_expected"], 60, "{report}");
    assert_eq!(figures["fires_recorded"], 60, "{report}");
    assert_eq!(figures["fires_missing"], 0, "{report}");
    assert_eq!(figures["fires_without_job"], 0, "{report}");
    assert_eq!(figures["duplicate_jobs"], 0, "{report}");
    assert_eq!(figures["jobs_made"], 60, "{report}");
    let lateness = &figures["lateness_ms"];
    assert_eq!(lateness["samples"], 60, "{report}");
    for key in ["p50", "p99", "max"] {
        assert!(number(lateness, key) >= 0.0, "{key}: {report}");
    }
    assert!(
        number(lateness, "p50") <= number(lateness, "max"),
        "{report}"
    );
    assert!(number(figures, "fires_per_s") > 0.0, "{report}");
    let transactions = number(figures, "firing_transactions");
    assert!((1.0..=60.0).contains(&transactions), "{report}");
    for key in ["transactions_per_fire", "replica_cpu_us_per_fire"] {
        number(figures, key);
    }
    for window in ["empty_ticks", "idle_ticks"] {
        let ticks = &figures[window];
        for key in ["due_index_scans", "key_index_scans", "index_rows_read"] {
            assert!(number(ticks, key) >= 0.0, "{window}.{key}: {report}");
        }
        assert!(number(ticks, "window_s") > 0.0, "{window}: {report}");
    }
    assert_eq!(figures["idle_ticks"]["schedules"], 200, "{report}");
    assert_eq!(figures["empty_ticks"]["schedules"], 0, "{report}");

    // The kept database, read directly: every firing schedule fired at every second from its
    // first fire to its last, once each (no gap, no repeat), and made one job per fire.
    assert!(exists(&name).await);
    let client = crate::bench_queues::kept(&name).await;
    let gaps: i64 = client
        .query_one(
            "SELECT count(*) FROM (
                 SELECT name FROM etl_schedule_fires WHERE left(name, 5) = 'fire_'
                  GROUP BY name
                 HAVING count(*) <> extract(epoch FROM max(fire_at) - min(fire_at))::int8 + 1
                     OR count(*) <> count(DISTINCT fire_at)) AS s",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gaps, 0, "a schedule missed or repeated a second");
    let (schedules, idle, fires, jobs): (i64, i64, i64, i64) = {
        let row = client
            .query_one(
                "SELECT (SELECT count(DISTINCT name) FROM etl_schedule_fires),
                        (SELECT count(*) FROM etl_schedules WHERE left(name, 5) = 'idle_'),
                        (SELECT count(*) FROM etl_schedule_fires WHERE outcome = 'enqueued'),
                        (SELECT count(*) FROM etl_job_intake)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };
    assert_eq!(schedules, 20, "only the firing schedules fired");
    assert_eq!(idle, 200);
    assert!(fires >= 60);
    assert_eq!(jobs, fires, "one job per fire");
    drop(client);
    crate::bench_queues::drop_kept(&name).await;
}
