//! The deployment topology of `compose.yaml` (one API, three worker replicas with stable owner
//! ids, one database), started as processes of the real binary, since no container engine runs
//! here.

use crate::support::{count, eventually, free_port, signal, Processes, TestDb};
use serde_json::json;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_api_and_three_replicas_share_the_work() {
    let db = TestDb::empty().await;
    let secret = "deploy-secret-0123456789";
    let bin = env!("CARGO_BIN_EXE_durable-etl");
    let command = |args: &[&str]| {
        let mut c = Command::new(bin);
        c.env("DATABASE_URL", &db.config.url)
            .env("DURABLE_ETL_SECRET", secret)
            .env("RUST_LOG", "warn")
            .args(args);
        c
    };
    assert!(command(&["migrate"]).status().unwrap().success());
    let created = command(&["api-keys", "create", "--owner", "team"])
        .output()
        .unwrap();
    let key = String::from_utf8_lossy(&created.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("key:").map(|k| k.trim().to_owned()))
        .unwrap();
    let api_addr = format!("127.0.0.1:{}", free_port());
    let mut processes = Processes(vec![command(&["serve", "--listen", &api_addr])
        .spawn()
        .unwrap()]);
    let mut metrics = Vec::new();
    for i in 1..=3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let owner = format!("worker-{i}");
        processes.0.push(
            command(&["work", "--owner-id", &owner, "--metrics-listen", &addr])
                .spawn()
                .unwrap(),
        );
        metrics.push(addr);
    }
    let http = reqwest::Client::new();
    eventually("the API and the replicas to serve", || {
        let (http, api_addr, metrics) = (&http, &api_addr, &metrics);
        async move {
            let mut up = http
                .get(format!("http://{api_addr}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            for addr in metrics {
                up &= http
                    .get(format!("http://{addr}/metrics"))
                    .send()
                    .await
                    .is_ok();
            }
            up
        }
    })
    .await;
    for i in 0..30 {
        let body = json!({"dataset": "events", "key": "id", "records": [{"id": i}]});
        let response = http
            .post(format!("http://{api_addr}/v1/etl-jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("deploy-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    let client = db.client().await;
    eventually("every job to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_records WHERE status = 'succeeded'").await == 30 }
    })
    .await;
    assert_eq!(
        count(&client, "etl_job_records WHERE attempts <> 1").await,
        0
    );
    let mut claimed = 0;
    for addr in &metrics {
        let text = http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        claimed += text
            .lines()
            .find_map(|l| l.strip_prefix("durable_etl_jobs_claimed_total "))
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(claimed, 30, "each job claimed once, across the replicas");
    for child in &mut processes.0 {
        signal(child, "TERM");
        assert_eq!(
            child.wait().unwrap().code(),
            Some(0),
            "graceful exit on SIGTERM"
        );
    }
}
