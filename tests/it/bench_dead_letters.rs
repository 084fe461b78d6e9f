//! `durable-etl bench dead-letters`: a small run makes every letter of both variants into
//! exactly one job, runs them all to success, times pages of every listing, and drops its
//! database; the queue flags are refused. Counts are asserted, never timings.

use crate::bench::{bench, bench_output, elements, exists, number};

#[tokio::test]
async fn dead_letters_replays_each_letter_once_runs_the_jobs_and_times_every_listing() {
    let dir = std::env::temp_dir().join(format!("durable-etl-report-{}", uuid::Uuid::new_v4()));
    // 250 letters a variant: the bulk replay takes two transactions of 200.
    let (report, name) = bench(
        "dead_letters",
        &[
            "dead-letters",
            "--letters",
            "250",
            "--history",
            "3000",
            "--pages",
            "5",
            "--page-size",
            "20",
            "--connections",
            "3",
            "--report",
            dir.to_str().unwrap(),
        ],
    );
    let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let names = elements(&page);
    assert_eq!(names.iter().filter(|n| *n == "table").count(), 1, "{page}");
    assert!(
        page.contains("<tr><th>replay retained</th><td>250 of 250 letters made jobs"),
        "{page}"
    );
    assert!(
        page.contains("<tr><th>list, filter owner</th><td>first page p50 "),
        "{page}"
    );
    assert!(!exists(&name).await, "the bench dropped its database");

    assert_eq!(report["config"]["mode"], "dead_letters", "{report}");
    let figures = &report["dead_letters"];
    assert_eq!(figures["failed_by"], "sql", "{report}");
    // 3,000 ended jobs, one in ten failed.
    assert_eq!(figures["history"]["ended"], 3000, "{report}");
    assert_eq!(figures["history"]["failed"], 300, "{report}");
    // Each letter of each variant made exactly one job, and that job succeeded.
    for (variant, connections) in [("retained", 1), ("resubmitted", 3)] {
        let r = &figures[variant];
        for key in [
            "letters",
            "made",
            "replayed",
            "distinct_jobs",
            "owner_jobs_made",
            "succeeded",
        ] {
            assert_eq!(r[key], 250, "{variant}.{key}: {report}");
        }
        assert_eq!(r["connections"], connections, "{variant}: {report}");
        assert!(number(r, "jobs_per_s") > 0.0, "{variant}: {report}");
        assert!(number(r, "seconds") > 0.0, "{variant}: {report}");
    }
    assert_eq!(
        figures["retained_left"],
        serde_json::json!([0, 0]),
        "{report}"
    );
    let run = &figures["run"];
    assert_eq!(run["succeeded"], 500, "{report}");
    assert_eq!(run["not_succeeded"], 0, "{report}");
    assert!(number(run, "seconds") >= 0.0, "{report}");
    assert!(number(run, "wall_s") > 0.0, "{report}");
    assert_eq!(report["succeeded"], 500, "{report}");

    // Every listing timed its pages: the 300 letters of the history (the replayed ones are no
    // longer open), one owner's fifth, one queue's quarter, and one code's 80 (the codes take
    // turns by runs of 20 letters: four of the 15 runs).
    let listing = figures["listing"].as_array().unwrap();
    let filters: Vec<(&str, u64)> = listing
        .iter()
        .map(|l| {
            (
                l["filter"].as_str().unwrap(),
                l["letters"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        filters,
        [("none", 300), ("owner", 60), ("queue", 75), ("code", 80)],
        "{report}"
    );
    for l in listing {
        assert_eq!(l["page_size"], 20, "{report}");
        assert_eq!(l["first_page_ms"]["samples"], 5, "{report}");
        let deep = l["deep_page_ms"]["samples"].as_u64().unwrap();
        assert!((1..=5).contains(&deep), "{report}");
        for depth in ["first_page_ms", "deep_page_ms"] {
            for key in ["p50", "p99", "max"] {
                assert!(number(&l[depth], key) > 0.0, "{depth}.{key}: {report}");
            }
        }
        assert_eq!(
            l["deep_from"].as_u64().unwrap(),
            l["letters"].as_u64().unwrap() / 2,
            "{report}"
        );
        assert!(!l["index"].as_str().unwrap().is_empty(), "{report}");
    }
}

#[test]
fn dead_letters_refuses_the_queue_flags() {
    // Its letters' jobs keep the default queue, which replicas told to serve others never run.
    let (out, _) = bench_output("dead_letters_queues", &["dead-letters", "--queues", "2"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leave out the queue flags"),
        "{out:?}"
    );
}
