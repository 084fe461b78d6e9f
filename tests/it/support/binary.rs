//! The real binary as the processes of a deployment: commands with a database URL and an API
//! secret, an API key made with `api-keys create`, and counters read off a replica's `/metrics`.

use std::process::{Command, Stdio};

/// The API secret of the processes these helpers start.
const BINARY_SECRET: &str = "binary-secret-0123456789";

/// A durable-etl command of the real binary on `url` with [`BINARY_SECRET`], its logs at `warn`
/// to a null standard error.
pub fn binary(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    c.env("DATABASE_URL", url)
        .env("DURABLE_ETL_SECRET", BINARY_SECRET)
        .env("RUST_LOG", "warn")
        .args(args)
        .stderr(Stdio::null());
    c
}

/// A new API key of owner `team` on the database of `url`.
pub fn api_key(url: &str) -> String {
    let created = binary(url, &["api-keys", "create", "--owner", "team"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    String::from_utf8_lossy(&created.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("key:").map(|k| k.trim().to_owned()))
        .expect("a key")
}

/// The value of counter `name` (exposed as `name_total`) in the `/metrics` served at `addr`.
pub async fn counter(http: &reqwest::Client, addr: &str, name: &str) -> u64 {
    let text = text_of(http, &format!("http://{addr}/metrics")).await;
    let prefix = format!("{name}_total ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} in the metrics"))
        .parse()
        .unwrap()
}

/// The body of a GET of `url`, as text.
pub async fn text_of(http: &reqwest::Client, url: &str) -> String {
    let response = http.get(url).send().await.unwrap();
    response.text().await.unwrap()
}

/// Waits until the API at `api` is ready and every replica serves its `/metrics` at `metrics`.
pub async fn until_serving(http: &reqwest::Client, api: &str, metrics: &[String]) {
    super::eventually("the API and the replicas to serve", || async move {
        let mut up = http
            .get(format!("http://{api}/readyz"))
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
    })
    .await;
}

/// Submits ETL job `i` of `records` target rows (keys `{i}-{r}`) through the API at `api`;
/// returns its status monitor (the `Location` of the 202).
pub async fn submit_load(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    i: usize,
    records: usize,
) -> String {
    let records: Vec<_> = (0..records)
        .map(|r| serde_json::json!({"id": format!("{i}-{r}")}))
        .collect();
    let response = post_load(http, api, key, &format!("load-{i}"), records)
        .await
        .unwrap();
    assert_eq!(response.status(), 202, "submission {i}");
    let location = response.headers().get("location").expect("a Location");
    location.to_str().unwrap().to_owned()
}

/// Posts an ETL job of `records` into dataset `events` (keyed `id`) to the API at `api`, with
/// idempotency key `idempotency_key`; returns the answer, whatever it is.
pub async fn post_load(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    idempotency_key: &str,
    records: Vec<serde_json::Value>,
) -> reqwest::Result<reqwest::Response> {
    let body = serde_json::json!({"dataset": "events", "key": "id", "records": records});
    http.post(format!("http://{api}/v1/etl-jobs"))
        .bearer_auth(key)
        .header("Idempotency-Key", idempotency_key)
        .json(&body)
        .send()
        .await
}
