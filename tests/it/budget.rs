//! The connection budget (`worker::budget`, docs/operations.md): a replica and the API of the real
//! binary never hold more backends than their budget, idle or under load, counted per
//! `application_name` in `pg_stat_activity` of the test's own database.

use crate::support::{
    api_key, binary, enqueue_loads, eventually, free_port, signal, submit_load, until_all_terminal,
    Processes, TestDb,
};
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::worker::budget::Budget;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The backends of this database by `application_name` (durable-etl's processes only).
async fn backends(client: &tokio_postgres::Client) -> BTreeMap<String, i64> {
    client
        .query(
            "SELECT application_name, count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'durable-etl/%'
              GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The most backends of each name seen in one sample, and the most of the replica's and the
/// API's own names together.
#[derive(Debug, Default)]
struct Peaks {
    /// By `application_name`.
    by_name: BTreeMap<String, i64>,
    /// `durable-etl/worker`, `claimer` and `session` together.
    replica: i64,
    /// `durable-etl/api` and `notifier` together.
    api: i64,
}

impl Peaks {
    /// Takes `sample` in.
    fn add(&mut self, sample: &BTreeMap<String, i64>) {
        let of = |names: &[&str]| -> i64 {
            names
                .iter()
                .map(|n| {
                    sample
                        .get(&format!("durable-etl/{n}"))
                        .copied()
                        .unwrap_or(0)
                })
                .sum()
        };
        for (name, n) in sample {
            let peak = self.by_name.entry(name.clone()).or_default();
            *peak = (*peak).max(*n);
        }
        self.replica = self.replica.max(of(&["worker", "claimer", "session"]));
        self.api = self.api.max(of(&["api", "notifier"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_and_the_api_stay_within_their_budget_idle_and_under_load() {
    let db = TestDb::migrated().await;
    let key = api_key(&db.config.url);
    let (pool, api_pool) = (3u32, 2u32);
    let api_addr = format!("127.0.0.1:{}", free_port());
    let api_pool_arg = api_pool.to_string();
    let pool_arg = pool.to_string();
    let mut processes = Processes(vec![binary(
        &db.config.url,
        &["serve", "--listen", &api_addr, "--pool-size", &api_pool_arg],
    )
    .spawn()
    .unwrap()]);
    processes.0.push(
        binary(
            &db.config.url,
            &[
                "work",
                "--owner-id",
                "budget",
                "--slots",
                "16",
                "--pool-size",
                &pool_arg,
            ],
        )
        .spawn()
        .unwrap(),
    );
    let sampler = db.client().await;
    eventually("the API and the replica to connect", || async {
        let now = backends(&sampler).await;
        now.contains_key("durable-etl/session") && now.contains_key("durable-etl/notifier")
    })
    .await;
    let peaks = Arc::new(Mutex::new(Peaks::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = {
        let (peaks, stop) = (Arc::clone(&peaks), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let sample = backends(&sampler).await;
                peaks.lock().unwrap().add(&sample);
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
    };
    // Idle for a few polls, then a burst of ETL jobs and API submissions at once.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let idle = peaks.lock().unwrap().replica;
    let client = db.client().await;
    enqueue_loads(&client, "budget", 2_000, 5, 3).await;
    let http = reqwest::Client::new();
    let submissions = (0..64).map(|i| submit_load(&http, &api_addr, &key, i, 3));
    futures::future::join_all(submissions).await;
    until_all_terminal(&client).await;
    stop.store(true, Ordering::Relaxed);
    sampling.await.unwrap();
    for child in &mut processes.0 {
        signal(child, "TERM");
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }
    let peaks = peaks.lock().unwrap();
    let db_config = DatabaseConfig {
        pool_max_size: pool,
        ..DatabaseConfig::default()
    };
    let replica = Budget::replica(&db_config, &WorkerConfig::default());
    let api = Budget::api(&DatabaseConfig {
        pool_max_size: api_pool,
        ..DatabaseConfig::default()
    });
    let peak = |name: &str| peaks.by_name.get(name).copied().unwrap_or(0);
    println!("idle replica: {idle} backends; peaks: {peaks:?}");
    assert_eq!(replica.total(), pool + 6);
    assert!(peaks.replica <= i64::from(replica.total()), "{peaks:?}");
    assert!(peaks.api <= i64::from(api.total()), "{peaks:?}");
    assert!(peak("durable-etl/claimer") <= i64::from(replica.claim));
    assert!(peak("durable-etl/session") <= i64::from(replica.session));
    assert!(peak("durable-etl/worker") <= i64::from(replica.pool + replica.commit));
    assert!(peak("durable-etl/notifier") <= 1 && peak("durable-etl/api") <= i64::from(api_pool));
    // Every kind of connection was used: the sampler saw what it bounds.
    for name in ["worker", "claimer", "session", "api", "notifier"] {
        assert!(
            peak(&format!("durable-etl/{name}")) >= 1,
            "{name}: {peaks:?}"
        );
    }
}
