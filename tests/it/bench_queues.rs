//! `durable-etl bench`'s queue flags (#25): the jobs land in the queues and priorities the flags
//! name, the per-queue counts add up, a capped queue never runs more than its cap, and the
//! priority figures describe the claim order; with `--keys`, every job carries its Zipf key, the
//! key cap is set and holds, and the per-key figures count every job once. No figure's size is asserted (tests never judge
//! speed), only the invariants the figures must keep.

use crate::bench::{bench, exists, server_cpu, server_is_local};
use crate::support::{admin_config, connect, first_column};
use std::process::Command;

/// Runs `durable-etl bench` with the space-separated `args`, keeping its database (see
/// [`bench`]).
fn bench_kept(tag: &str, args: &str) -> (serde_json::Value, String) {
    let mut args: Vec<&str> = args.split(' ').collect();
    args.push("--keep");
    bench(tag, &args)
}

/// A client on the kept bench database `name`.
pub(crate) async fn kept(name: &str) -> tokio_postgres::Client {
    let mut config = admin_config();
    config.dbname(name);
    connect(&config).await
}

/// Drops the kept bench database `name`.
pub(crate) async fn drop_kept(name: &str) {
    connect(&admin_config())
        .await
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await
        .unwrap();
}

/// The report's per-queue entries as `(queue, weight, in_window, succeeded)`.
fn per_queue(report: &serde_json::Value) -> Vec<(String, u64, u64, u64)> {
    report["queues"]["per_queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["queue"].as_str().unwrap().to_owned(),
                q["weight"].as_u64().unwrap(),
                q["in_window"].as_u64().unwrap(),
                q["succeeded"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The succeeded jobs of the kept database `name` by queue, as `queue:jobs` sorted by queue;
/// then drops the database.
async fn jobs_by_queue_then_drop(name: &str) -> Vec<String> {
    let client = kept(name).await;
    let jobs = first_column(
        &client,
        "SELECT queue || ':' || count(*) FROM etl_jobs WHERE status = 'succeeded'
          GROUP BY queue ORDER BY queue",
    )
    .await;
    drop(client);
    drop_kept(name).await;
    jobs
}

#[tokio::test]
async fn bench_queues_spreads_jobs_equally_and_the_per_queue_counts_add_up() {
    let (report, name) = bench_kept(
        "queues",
        "burn-down --jobs 300 --queues 3 --replicas 2 --slots 8",
    );
    assert_eq!(report["succeeded"], 300, "{report}");
    let queues = per_queue(&report);
    let names: Vec<(&str, u64, u64)> = queues.iter().map(|q| (q.0.as_str(), q.1, q.3)).collect();
    assert_eq!(
        names,
        vec![("q0", 1, 100), ("q1", 1, 100), ("q2", 1, 100)],
        "{report}"
    );
    // Burn-down's window ends when the first queue ran out: that queue's jobs are all in it,
    // the others' at most. No top-up watched a backlog.
    assert!(queues.iter().all(|q| q.2 <= q.3), "{report}");
    assert!(queues.iter().any(|q| q.2 == q.3), "{report}");
    assert!(report["queues"]["per_queue"][0]["fewest_due"].is_null());
    assert!(report["queues"]["window_s"].as_f64().unwrap() > 0.0);
    // Each replica's start-up claim at least asked every queue.
    assert!(report["queues"]["discovery_claims"].as_u64().unwrap() >= 2);
    assert_eq!(
        jobs_by_queue_then_drop(&name).await,
        vec!["q0:100", "q1:100", "q2:100"]
    );
}

#[tokio::test]
async fn bench_hot_queue_puts_every_job_in_q0_and_lists_the_empty_queues() {
    let (report, name) = bench_kept("hot", "burn-down --jobs 40 --queues 4 --hot-queue");
    let queues = per_queue(&report);
    assert_eq!(queues.len(), 4, "{report}");
    assert_eq!(queues[0], ("q0".to_owned(), 1, 40, 40));
    assert!(queues[1..].iter().all(|q| q.2 == 0 && q.3 == 0), "{report}");
    assert_eq!(jobs_by_queue_then_drop(&name).await, vec!["q0:40"]);
}

#[tokio::test]
async fn bench_saturated_keeps_weighted_queues_busy_and_counts_the_window() {
    let (report, name) = bench_kept(
        "weights",
        "saturated --weights 3,1 --backlog 100 --duration 2s --slots 8",
    );
    assert_eq!(report["config"]["mode"], "saturated");
    let queues = per_queue(&report);
    assert_eq!(queues.len(), 2, "{report}");
    assert_eq!((queues[0].1, queues[1].1), (3, 1));
    // The window's counts are a part of the run's, and they add up to the window's rate.
    let succeeded = report["succeeded"].as_u64().unwrap();
    assert_eq!(queues.iter().map(|q| q.3).sum::<u64>(), succeeded);
    let in_window: u64 = queues.iter().map(|q| q.2).sum();
    assert!(
        in_window <= succeeded && queues.iter().all(|q| q.2 > 0),
        "{report}"
    );
    let window = &report["queues"];
    let rate = window["window_jobs_per_s"].as_f64().unwrap() * window["window_s"].as_f64().unwrap();
    assert!((rate - in_window as f64).abs() < 0.5, "{report}");
    // Both queues stayed saturated, so every claim asked 3:1: the heavier queue got more.
    assert!(queues[0].2 > queues[1].2, "{report}");
    // The top-ups saw each queue's backlog (how low it got is the machine's business).
    for q in report["queues"]["per_queue"].as_array().unwrap() {
        assert!(q["fewest_due"].is_u64(), "{report}");
    }
    // Each queue started with its backlog and was topped up: more than it held at any time.
    assert!(queues.iter().all(|q| q.3 > 100), "{report}");
    // Those top-ups (thousands of jobs) ran on the bench's own session: its CPU is the producers'.
    let [_, _, producers, _, _] = server_cpu(&report);
    assert!(producers > 0.0 || !server_is_local().await, "{report}");
    assert_eq!(jobs_by_queue_then_drop(&name).await.len(), 2);
}

#[tokio::test]
async fn bench_priority_mix_claims_in_deadline_order_without_aging_writes() {
    let (report, name) = bench_kept(
        "priority",
        "burn-down --jobs 400 --priority-mix 90:0,10:9 --slots 4 --prefetch 8",
    );
    let figures = &report["queues"];
    let waits = figures["priorities"].as_array().unwrap();
    assert_eq!(waits.len(), 2, "{report}");
    assert_eq!(
        (waits[0]["priority"].as_i64(), waits[1]["priority"].as_i64()),
        (Some(0), Some(9))
    );
    assert_eq!(waits[0]["wait_ms"]["samples"], 360);
    assert_eq!(waits[1]["wait_ms"]["samples"], 40);
    assert_eq!(figures["priority_bound_ms"].as_f64(), Some(90_000.0));
    assert_eq!(figures["aging_writes"], 0, "{report}");
    // One replica claims in (sort_at, id) order: no priority-9 job before the last priority-0
    // one (all were due at once), so none was overtaken.
    assert_eq!(figures["overtaken_max_ms"].as_f64(), Some(0.0), "{report}");
    let client = kept(&name).await;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE priority = 9), count(*) FILTER (WHERE priority = 0),
                    (SELECT min(started_at) FROM etl_jobs WHERE priority = 9)
                        >= (SELECT max(started_at) FROM etl_jobs WHERE priority = 0)
               FROM etl_jobs",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (40, 360));
    assert!(row.get::<_, bool>(2));
    // One update per job at least (its claim); none of them aged a pending row.
    assert!(
        figures["live_row_updates_per_job"].as_f64().unwrap() >= 1.0,
        "{report}"
    );
    drop(client);
    drop_kept(&name).await;
}

#[tokio::test]
async fn bench_cap_is_set_before_the_replicas_start_and_never_exceeded() {
    let (report, name) = bench_kept(
        "cap",
        "burn-down --jobs 60 --cap 2 --job-ms 10 --replicas 2 --slots 4",
    );
    assert_eq!(report["succeeded"], 60, "{report}");
    let cap = &report["queues"]["cap"];
    assert_eq!(cap["cap"], 2);
    let most = cap["max_running"].as_u64().unwrap();
    assert!((1..=2).contains(&most), "{report}");
    // Every start after the first two is paired with the completion that freed its permit.
    assert_eq!(cap["permit_to_start_ms"]["samples"], 58, "{report}");
    assert_eq!(cap["cap_bound_jobs_per_s"].as_f64(), Some(200.0));
    let client = kept(&name).await;
    let (queue, set): (String, Option<i32>) = {
        let row = client
            .query_one("SELECT queue, cap FROM etl_queues", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((queue.as_str(), set), ("default", Some(2)));
    let held: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_queue_permits WHERE claim_id IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0, "no permit is held once the queue drained");
    drop(client);
    drop_kept(&name).await;
    assert!(!exists(&name).await);
}

#[tokio::test]
async fn bench_keys_spread_zipf_keys_under_a_key_cap_and_split_the_pickup_by_key() {
    let (report, name) = bench_kept(
        "keys",
        "offered-load --rate 200 --duration 1s --batch 10 --keys 50 --key-cap 1 --job-ms 5 --replicas 2 --slots 4",
    );
    // The producer stops when the second is over: what it had not sent by then is left out
    // (statements of 10 leave it 50 ms each, so a slow debug build still offers most of them).
    let offered = report["offered"].as_u64().unwrap();
    assert!((100..=200).contains(&offered), "{report}");
    assert_eq!(report["succeeded"], offered, "{report}");
    let keys = &report["keys"];
    let samples = |group: &str| keys[group]["samples"].as_u64().unwrap();
    let hot = samples("hot_enqueue_to_start_ms");
    let warm = samples("warm_enqueue_to_start_ms");
    let cold = samples("cold_enqueue_to_start_ms");
    assert_eq!(
        hot + warm + cold,
        offered,
        "every job counted once: {report}"
    );
    // 1 / H(50) of the jobs are the hot key's (about 45 of 200), k1 to k9 about 100 more.
    assert!(
        (offered / 8..offered / 3).contains(&hot) && cold > offered / 10,
        "{report}"
    );
    let client = kept(&name).await;
    let key_cap: Option<i32> = client
        .query_one(
            "SELECT key_cap FROM etl_queues WHERE queue = 'default'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(key_cap, Some(1));
    let held: i64 = client
        .query_one("SELECT count(*) FROM etl_key_permits", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0, "no key permit is held once every job ended");
    drop(client);
    drop_kept(&name).await;
    assert!(!exists(&name).await);
}

#[test]
fn bench_refuses_bad_queue_flags_before_making_a_database() {
    for args in [
        &["burn-down", "--handler", "etl", "--queues", "2"][..],
        &["burn-down", "--keys", "1"],
        &["burn-down", "--key-cap", "2"],
        &["burn-down", "--weights", "3"],
        &["burn-down", "--weights", "3,1", "--queues", "2"],
        &["burn-down", "--hot-queue"],
        &["burn-down", "--queues", "0"],
        &["burn-down", "--priority-mix", "90:0,10:10"],
        &["burn-down", "--priority-mix", "90:0"],
        &["saturated", "--cap", "0"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
            .arg("bench")
            .args(args)
            .args(["--bench-database", "durable_etl_bench_never_made"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
