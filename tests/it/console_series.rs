//! The operator view's per-minute series (migration 0038) end to end: what a replica reports by
//! queue and per pickup latency bucket, the backlog row sampled once a minute, and the charts
//! drawn from them; and the rows of a release before 0038, whose missing figures are no data,
//! never zeros.

use crate::console::Console;
use crate::support::{count, eventually};
use reqwest::StatusCode;
use serde_json::json;

/// Asserts that the operator view, as an operator sees it, shows each of `texts`; returns it.
async fn operator_view_shows(console: &Console, texts: &[&str]) -> String {
    let alice = console.sign_in(&console.alice).await;
    let view = console.get("/console/operator", &alice).await;
    assert_eq!(view.status, StatusCode::OK);
    for text in texts {
        assert!(view.body.contains(text), "{text}: {}", view.body);
    }
    view.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reports_by_queue_and_latency_bucket_and_the_charts_show_them() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let replica = console.replica("series").await;
    for i in 0..2 {
        console
            .submit(&console.bob, &format!("ok-{i}"), false)
            .await;
    }
    let failing = json!({"dataset": "d", "key": "id", "records": [{"id": 1, "n": "abc"}],
                         "transform": {"cast": {"n": "integer"}}});
    console.submit_body(&console.bob, "bad", &failing).await;
    eventually("the report of three ended jobs", || async {
        count(
            &client,
            "etl_replica_minutes WHERE owner_id = 'series' AND succeeded = 2 AND failed = 1",
        )
        .await
            == 1
    })
    .await;
    let row = client
        .query_one(
            "SELECT by_queue, pickup_buckets, pickups FROM etl_replica_minutes
              WHERE owner_id = 'series' AND succeeded = 2 AND failed = 1",
            &[],
        )
        .await
        .unwrap();
    let by_queue: serde_json::Value = row.get(0);
    assert_eq!(by_queue, json!({"default": [2, 1]}));
    let buckets: Vec<i64> = row.get(1);
    assert_eq!(
        buckets.len(),
        durable_etl::worker::stats::LATENCY_BUCKETS.len() + 1
    );
    assert_eq!(
        buckets.iter().sum::<i64>(),
        row.get::<_, i64>(2),
        "every pickup"
    );
    assert!(
        count(&client, "etl_backlog_minutes").await >= 1,
        "the first report of a minute samples the backlog"
    );

    let view = operator_view_shows(
        &console,
        &[
            "aria-label=\"Jobs succeeded per minute by queue\"",
            "aria-label=\"Pickup latency per minute: p50 and p99 (bucket bounds) and mean\"",
            "aria-label=\"Backlog per minute\"",
            "default 2 in the hour",
            "default 1 in the hour",
            "<span class=\"series series-0\">p50 last ",
            "<span class=\"series series-1\">p99 last ",
            "<span class=\"series series-2\">mean last ",
            "Backlog per minute: <span class=\"series series-0\">due last ",
            "deferred or retrying last ",
            ">0 ms</text>",
            ">0 jobs</text>",
            ">now</text>",
            ">59 minutes ago</text>",
        ],
    )
    .await;
    assert!(!view.contains("no data in this hour"));
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_releases_rows_are_no_data_not_zero() {
    let console = Console::start().await;
    let client = console.db.client().await;
    // A replica of a release before 0038, running for an hour: its last two minutes, without
    // per-queue totals or pickup buckets (its statement names neither column).
    client
        .execute(
            "INSERT INTO etl_replica_minutes (minute, owner_id, incarnation, started_at,
                                              succeeded, failed, failed_by_code, recovered,
                                              pickups, pickup_seconds)
             SELECT date_trunc('minute', now()) - m * interval '1 minute', 'old',
                    '00000000-0000-0000-0000-00000000000a', now() - interval '1 hour',
                    s, f, c::jsonb, 0, s + f, p
               FROM (VALUES (1, 10, 0, '{}', 0.010),
                            (0, 13, 1, '{\"record_invalid\": 1}', 0.014)) AS v(m, s, f, c, p)",
            &[],
        )
        .await
        .unwrap();
    operator_view_shows(
        &console,
        &[
            "queue not reported 3 in the hour, at most 3 jobs a minute",
            "queue not reported 1 in the hour, at most 1 jobs a minute",
            "p50 no data",
            "p99 no data",
            "mean last 1 ms, highest 1 ms",
            "Backlog per minute: no data in this hour",
        ],
    )
    .await;
}
