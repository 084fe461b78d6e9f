//! The HTTP API through a real socket against real PostgreSQL: every status code, idempotent
//! replay, key reuse, owner scoping, cancellation, replacement, deferred jobs, and no request
//! value in any response.

use crate::support::{
    count, eventually, hold_job_row, job_row, pool, register_waiting, stalled_claimant, Listener,
    TestDb,
};
use durable_etl::config::{ApiConfig, WorkerConfig};
use durable_etl::digest::Secret;
use durable_etl::intake::IntakeLimits;
use durable_etl::job::handler::Registry;
use durable_etl::jobs::notifier::Notifier;
use durable_etl::kinds::etl::load::EtlLoad;
use durable_etl::service::api_keys;
use durable_etl::service::{self, AppState};
use durable_etl::worker::completer::Transition;
use durable_etl::worker::Worker;
use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_postgres::types::Type;

/// The secret of these tests.
const SECRET: &str = "api-test-secret-0123456789";

/// A running API on a real socket, with two owners' keys.
struct Api {
    /// The database.
    db: TestDb,
    /// `http://127.0.0.1:PORT`.
    base: String,
    /// Alice's API key.
    alice: String,
    /// Bob's API key.
    bob: String,
    /// The HTTP client.
    http: Client,
    /// Every response body seen, for the canary scan.
    seen: std::sync::Mutex<Vec<String>>,
}

impl Api {
    /// Starts the API on port 0 with small limits.
    async fn start() -> Api {
        Api::start_with(|_| {}).await
    }

    /// Starts the API on port 0 with small limits, then whatever `adjust` changes.
    async fn start_with(adjust: impl FnOnce(&mut ApiConfig)) -> Api {
        Api::start_on(TestDb::migrated().await, adjust, false).await
    }

    /// Starts the API as `durable-etl serve` does, with the process's coalescing notifier.
    async fn start_notifying() -> Api {
        Api::start_on(TestDb::migrated().await, |_| {}, true).await
    }

    /// Starts the API on `db`, port 0, with small limits, then whatever `adjust` changes; with a
    /// notifier if `notifying`.
    async fn start_on(db: TestDb, adjust: impl FnOnce(&mut ApiConfig), notifying: bool) -> Api {
        let secret = Secret::new(SECRET).unwrap();
        let client = db.client().await;
        let alice = api_keys::create(&client, &secret, "alice")
            .await
            .unwrap()
            .key;
        let bob = api_keys::create(&client, &secret, "bob").await.unwrap().key;
        let mut config = ApiConfig {
            limits: IntakeLimits {
                max_records: 50,
                max_bytes: 4096,
            },
            ..ApiConfig::default()
        };
        adjust(&mut config);
        let mut state = AppState::new(pool(&db).await, secret, config);
        if notifying {
            state = state.with_notifier(Notifier::start(&db.config).unwrap());
        }
        let app = service::app(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Api {
            db,
            base,
            alice,
            bob,
            http: Client::new(),
            seen: Default::default(),
        }
    }

    /// Records a response's body and returns (status, headers, JSON body or Null).
    async fn read(&self, response: Response) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        self.seen.lock().unwrap().push(text.clone());
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    /// POSTs `body` as `key`'s job with idempotency key `idem`.
    async fn submit(
        &self,
        key: &str,
        idem: &str,
        body: &Value,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self
            .http
            .post(format!("{}/v1/etl-jobs", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", idem)
            .json(body)
            .send()
            .await
            .unwrap();
        self.read(response).await
    }

    /// Sends `method` to `url` (another server's, say) as `key`.
    async fn send_to(
        &self,
        method: reqwest::Method,
        url: &str,
        key: &str,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self
            .http
            .request(method, url)
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        self.read(response).await
    }

    /// Every page of `key`'s listing of `status`, `limit` jobs a page, following the cursors:
    /// each page's job ids.
    async fn pages(&self, key: &str, status: &str, limit: usize) -> Vec<Vec<uuid::Uuid>> {
        let mut pages = Vec::new();
        let mut cursor = String::new();
        loop {
            let path = format!("/v1/etl-jobs?status={status}&limit={limit}{cursor}");
            let (s, _, page) = self.get(key, &path).await;
            assert_eq!(s, StatusCode::OK, "{page}");
            let jobs = page["jobs"].as_array().unwrap();
            assert!(jobs.iter().all(|j| j["status"] == status), "{page}");
            pages.push(jobs.iter().map(id_of).collect());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = format!("&cursor={next}"),
                None => return pages,
            }
        }
    }

    /// GETs `path` as `key`.
    async fn get(&self, key: &str, path: &str) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        self.read(response).await
    }

    /// DELETEs `path` as `key`.
    async fn delete(
        &self,
        key: &str,
        path: &str,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self
            .http
            .delete(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        self.read(response).await
    }

    /// A worker on this API's database.
    async fn worker(&self, owner: &str) -> Worker {
        let config = WorkerConfig {
            owner_id: owner.to_owned(),
            ..WorkerConfig::default()
        };
        Worker::start(
            pool(&self.db).await,
            &self.db.config,
            config,
            Registry::new().perform(EtlLoad::default()),
        )
        .await
        .unwrap()
    }
}

/// A small valid request.
fn small(n: i64) -> Value {
    json!({"dataset": "orders", "key": "id", "records": [{"id": n, "v": "x"}]})
}

/// The job id in a status body.
fn id_of(body: &Value) -> uuid::Uuid {
    body["id"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_answers_202_with_a_status_monitor_and_replays_idempotently() {
    let api = Api::start().await;
    let (status, headers, body) = api.submit(&api.alice, "k-1", &small(1)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = id_of(&body);
    assert_eq!(headers["location"], format!("/v1/etl-jobs/{id}").as_str());
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(
        (body["status"].as_str(), body["attempts"].as_i64()),
        (Some("pending"), Some(0))
    );

    let (status, _, replay) = api.submit(&api.alice, "k-1", &small(1)).await;
    assert_eq!((status, id_of(&replay)), (StatusCode::ACCEPTED, id));
    let (status, _, problem) = api.submit(&api.alice, "k-1", &small(2)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["code"], "idempotency_key_reused");

    let (status, headers, monitor) = api.get(&api.alice, &format!("/v1/etl-jobs/{id}")).await;
    assert_eq!(
        (status, monitor["status"].as_str()),
        (StatusCode::OK, Some("pending"))
    );
    assert_eq!(headers["retry-after"], "1");
    let worker = api.worker("api-worker").await;
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(id, Transition::Succeeded)]
    );
    let (status, headers, done) = api.get(&api.alice, &format!("/v1/etl-jobs/{id}")).await;
    assert_eq!(
        (status, done["status"].as_str()),
        (StatusCode::OK, Some("succeeded"))
    );
    assert!(headers.get("retry-after").is_none());
    assert_eq!(done["result"]["rows_inserted"], 1);
    assert_eq!(done["result"]["checksum"].as_str().unwrap().len(), 64);

    // Another owner sees exactly what a nonexistent job looks like.
    let (status, _, theirs) = api.get(&api.bob, &format!("/v1/etl-jobs/{id}")).await;
    let (status2, _, none) = api
        .get(&api.bob, &format!("/v1/etl-jobs/{}", uuid::Uuid::now_v7()))
        .await;
    assert_eq!(
        (status, status2),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(theirs, none);
    let (status, _, _) = api.get(&api.alice, "/v1/etl-jobs/not-a-uuid").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_problem_with_a_stable_code() {
    let api = Api::start().await;
    let url = format!("{}/v1/etl-jobs", api.base);
    let send =
        |builder: reqwest::RequestBuilder| async { api.read(builder.send().await.unwrap()).await };

    let (s, h, p) = send(
        api.http
            .post(&url)
            .header("Idempotency-Key", "x")
            .json(&small(1)),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(h["www-authenticate"], "Bearer");
    let (s, _, _) = send(
        api.http
            .post(&url)
            .bearer_auth("detl_wrong")
            .header("Idempotency-Key", "x")
            .json(&small(1)),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    let (s, _, p) = send(
        api.http
            .post(&url)
            .bearer_auth(&api.alice)
            .header("Idempotency-Key", "x")
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("request_malformed"))
    );
    // A missing key is told it is missing; an unknown member is told what v1 defines.
    let (s, _, p) = send(api.http.post(&url).bearer_auth(&api.alice).json(&small(1))).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("idempotency_key_invalid"))
    );
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("The Idempotency-Key header is required"),
        "{p}"
    );
    let mut unknown = small(1);
    unknown["colour"] = json!("blue");
    let (s, _, p) = api.submit(&api.alice, "x", &unknown).await;
    assert_eq!(
        (s, p["code"].as_str(), p["pointer"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("request_invalid"),
            Some("")
        )
    );
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("only dataset, key, records, transform, run_at and replaces"),
        "{p}"
    );
    let (s, _, p) = api
        .submit(
            &api.alice,
            "x",
            &json!({"dataset": "BAD", "key": "id", "records": []}),
        )
        .await;
    assert_eq!(
        (s, p["code"].as_str(), p["pointer"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("dataset_invalid"),
            Some("/dataset")
        )
    );
    let many: Vec<Value> = (0..51).map(|i| json!({"id": i})).collect();
    let (s, _, p) = api
        .submit(
            &api.alice,
            "x",
            &json!({"dataset": "d", "key": "id", "records": many}),
        )
        .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("too_many_records"))
    );
    let (s, _, p) = send(
        api.http
            .post(&url)
            .bearer_auth(&api.alice)
            .header("Idempotency-Key", "x")
            .header("content-type", "application/json")
            .body(vec![b' '; 5000]),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("request_too_large"))
    );
    let (s, _, p) = send(
        api.http
            .post(&url)
            .bearer_auth(&api.alice)
            .header("Idempotency-Key", "x")
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("unsupported_media_type")
        )
    );
    // An unknown route is not a missing job, and the root leads to the console.
    let (s, _, p) = api.get(&api.alice, "/v1/no-such-route").await;
    assert_eq!(
        (s, p["code"].as_str(), p["title"].as_str()),
        (
            StatusCode::NOT_FOUND,
            Some("no_such_route"),
            Some("No such resource")
        )
    );
    let root = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(root.status(), StatusCode::SEE_OTHER);
    assert_eq!(root.headers()["location"], "/console");
    // A misspelt or unknown query parameter is refused, not ignored, and not echoed.
    for query in [
        "state=running",
        "status=running&canary_param=1",
        "limit=1&limit=2",
    ] {
        let (s, _, p) = api.get(&api.alice, &format!("/v1/etl-jobs?{query}")).await;
        assert_eq!(
            (s, p["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("query_invalid")),
            "{query}"
        );
        let detail = p["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("only the query parameters status, limit and cursor"),
            "{p}"
        );
    }
    let (s, _, p) = api.get(&api.alice, "/v1/etl-jobs?limit=0").await;
    assert_eq!(
        (s, p["pointer"].as_str()),
        (StatusCode::BAD_REQUEST, Some("/limit"))
    );
    let (s, _, p) = api.get(&api.alice, "/v1/etl-jobs?status=paused").await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("query_invalid"))
    );
    let (s, _, _) = api.get(&api.alice, "/v1/etl-jobs?cursor=zzz").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // A revoked key no longer works.
    let client = api.db.client().await;
    let secret = Secret::new(SECRET).unwrap();
    let revocable = api_keys::create(&client, &secret, "carol").await.unwrap();
    assert_eq!(
        api.get(&revocable.key, "/v1/etl-jobs").await.0,
        StatusCode::OK
    );
    api_keys::revoke(&client, revocable.id).await.unwrap();
    assert_eq!(
        api.get(&revocable.key, "/v1/etl-jobs").await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_answers_503_with_retry_after_and_readyz_agrees() {
    let api = Api::start().await;
    let (s, _, h) = api.get(&api.alice, "/readyz").await;
    assert_eq!((s, h["status"].as_str()), (StatusCode::OK, Some("ready")));
    let dead = durable_etl::config::DatabaseConfig {
        url: "postgres://postgres@127.0.0.1:1/nowhere".into(),
        connect_timeout: Duration::from_millis(200),
        ..durable_etl::config::DatabaseConfig::default()
    };
    let manager =
        durable_etl::db::Manager::new(durable_etl::db::Connector::for_role(&dead, "api").unwrap());
    let pool = bb8::Pool::builder()
        .connection_timeout(Duration::from_millis(300))
        .build_unchecked(manager);
    let app = service::app(AppState::new(
        pool,
        Secret::new(SECRET).unwrap(),
        ApiConfig::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    // The operators' routes too, before they know whose key it is.
    let paths = [
        "/v1/etl-jobs",
        "/readyz",
        "/v1/queues",
        "/v1/queues/default",
    ];
    for path in paths {
        let url = format!("{base}{path}");
        let (s, h, p) = api.send_to(reqwest::Method::GET, &url, &api.alice).await;
        assert_eq!(
            (s, p["code"].as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("database_unavailable")
            ),
            "{path}"
        );
        assert_eq!(h["retry-after"], "1");
    }
    // A console page with a session cookie (signed in on the live server, the same secret) is
    // unavailable too; without one it goes to sign-in, which needs no database.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed = crate::console::post_sign_in(&http, &api.base, &api.alice).await;
    let session = format!("detl_session={}", signed.cookie("detl_session").unwrap());
    let page = crate::console::get_page(&http, &base, "/console/queues", &session).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.body.contains("database_unavailable"), "{}", page.body);
    let page = crate::console::get_page(&http, &base, "/console/queues", "").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location(), "/console/sign-in");
    let page = crate::console::get_page(&http, &base, "/console/sign-in", "").await;
    assert_eq!(page.status, StatusCode::OK);
    let response = api
        .http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "liveness does not need the database"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_its_time_answers_503_request_timeout_as_a_problem_and_is_counted() {
    let api = Api::start_with(|c| c.request_timeout = Duration::from_millis(300)).await;
    // Another session holds the job table exclusively: the status monitor's read waits on it.
    let mut blocker = api.db.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE etl_job_records IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let path = format!("/v1/etl-jobs/{}", uuid::Uuid::new_v4());
    let (s, h, p) = api.get(&api.alice, &path).await;
    assert_eq!(
        (s, p["code"].as_str(), p["status"].as_u64()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("request_timeout"),
            Some(503)
        )
    );
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(h["retry-after"], "1");
    lock.rollback().await.unwrap();
    let (s, _, _) = api.get(&api.alice, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    let metrics = api.seen.lock().unwrap().last().unwrap().clone();
    assert!(
        metrics.contains("durable_etl_http_responses_total{class=\"5xx\"} 1\n"),
        "{metrics}"
    );
}

/// The API's own sessions (role `api`) of `db` that are not idle: running a statement, or in a
/// transaction.
async fn busy_api_sessions(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'durable-etl/api'
                AND state <> 'idle'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Serves the API and console of `db` on port 0 with a pool of one connection (role `api`) and
/// a request timeout of 1 s; returns its base URL.
async fn serve_on_one_connection(db: &TestDb) -> String {
    let one = durable_etl::config::DatabaseConfig {
        pool_max_size: 1,
        ..db.config.clone()
    };
    let pool = durable_etl::db::connect_pool(&one, "api").await.unwrap();
    let config = ApiConfig {
        request_timeout: Duration::from_secs(1),
        ..ApiConfig::default()
    };
    let app = service::app(AppState::new(pool, Secret::new(SECRET).unwrap(), config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A request cut by its timeout while its statement waits for a row lock, on a pool of one
/// connection: the statement is cancelled and the connection settled before reuse, so the next
/// requests on that connection answer (instead of queueing behind the cut statement until its
/// lock timeout), no statement of the API is left running, and the cut cancellation never
/// takes effect later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_mid_statement_never_hands_its_busy_connection_on() {
    let api = Api::start().await;
    let held = id_of(&api.submit(&api.alice, "cut-held", &small(1)).await.2);
    let other = id_of(&api.submit(&api.alice, "cut-other", &small(1)).await.2);
    let base = serve_on_one_connection(&api.db).await;
    // Another session holds the pending job's live row: the cancellation's DELETE waits for it
    // (the lock timeout, 5 s, is far beyond the request's 1 s).
    let mut blocker = api.db.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.execute(
        "SELECT 1 FROM etl_job_records WHERE id = $1 FOR UPDATE",
        &[&held],
    )
    .await
    .unwrap();
    let url = format!("{base}/v1/etl-jobs/{held}");
    let observer = api.db.client().await;
    let (cut, waiter) = tokio::join!(
        api.send_to(reqwest::Method::DELETE, &url, &api.alice),
        lock_waiter(&observer)
    );
    let (s, _, p) = cut;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("request_timeout"))
    );
    let url = format!("{base}/v1/etl-jobs/{other}");
    for round in 0..3 {
        let (s, _, p) = api.send_to(reqwest::Method::GET, &url, &api.alice).await;
        assert_eq!(s, StatusCode::OK, "request {round} after the cut one: {p}");
        assert_eq!(id_of(&p), other);
    }
    assert_eq!(
        busy_api_sessions(&observer).await,
        0,
        "a cut statement still runs"
    );
    // The cut request's session ended: a cancel request that landed late has nothing to cancel.
    let alive: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND pid = $1",
            &[&waiter],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(alive, 0, "the cut session was used again");
    lock.commit().await.unwrap();
    assert_eq!(job_row(&observer, held).await.status, "pending");
}

/// The backend of this database's API session that waits for a row lock, once there is one.
async fn lock_waiter(observer: &tokio_postgres::Client) -> i32 {
    for _ in 0..3000 {
        let row = observer
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'durable-etl/api'
                    AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return row.get(0);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no API session waited for the row lock");
}

/// The console's pages run their statements the same way: a sign-in cut while the key table is
/// locked has its statement cancelled, so the next request on the pool's only connection
/// answers while the lock is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_request_cut_mid_statement_never_hands_its_busy_connection_on() {
    let api = Api::start().await;
    let base = serve_on_one_connection(&api.db).await;
    let http = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let form = http
        .get(format!("{base}/console/sign-in"))
        .send()
        .await
        .unwrap();
    let nonce = form
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("detl_sign_in="))
        .and_then(|v| v.split(';').next())
        .unwrap()
        .to_owned();
    let html = form.text().await.unwrap();
    let at = html.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = &html[at..at + 64];
    let mut blocker = api.db.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE etl_api_clients IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let cut = http
        .post(format!("{base}/console/sign-in"))
        .header(reqwest::header::COOKIE, format!("detl_sign_in={nonce}"))
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(format!("api_key={}&csrf={csrf}", api.alice))
        .send()
        .await
        .unwrap();
    assert_eq!(cut.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Readiness reads only the schema history, which the lock leaves alone.
    let url = format!("{base}/readyz");
    let (s, _, p) = api.send_to(reqwest::Method::GET, &url, &api.alice).await;
    assert_eq!(s, StatusCode::OK, "after the cut sign-in: {p}");
    let observer = api.db.client().await;
    assert_eq!(
        busy_api_sessions(&observer).await,
        0,
        "a cut statement still runs"
    );
    lock.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_a_413_problem_with_or_without_a_content_length() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = Api::start().await;
    let url = format!("{}/v1/etl-jobs", api.base);
    let request = api
        .http
        .post(&url)
        .bearer_auth(&api.alice)
        .header("Idempotency-Key", "x")
        .header("content-type", "application/json")
        .body(vec![b' '; 5000]);
    let (s, h, p) = api.read(request.send().await.unwrap()).await;
    assert_eq!(
        (s, p["code"].as_str(), p["status"].as_u64()),
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("request_too_large"),
            Some(413)
        )
    );
    assert_eq!(h["content-type"], "application/problem+json");
    // A declared length over the limit is refused before the body is read, and so before the
    // credentials are looked at.
    let request = api
        .http
        .post(&url)
        .header("content-type", "application/json")
        .body(vec![b' '; 5000]);
    let (s, _, p) = api.read(request.send().await.unwrap()).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("request_too_large"))
    );
    // The same body in chunks, with no Content-Length to refuse it by.
    let addr = api.base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/etl-jobs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: x\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        api.alice
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..5 {
        let chunk = format!("3e8\r\n{}\r\n", " ".repeat(1000));
        // The server may answer and close before every chunk is sent.
        if socket.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = socket.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/problem+json\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("\"code\":\"request_too_large\""),
        "{answer}"
    );
    // A body within the limit is read as before.
    let (s, _, _) = api.submit(&api.alice, "small", &small(1)).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(count(&api.db.client().await, "etl_job_records").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_is_owner_scoped_newest_first_and_paginated() {
    let api = Api::start().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(id_of(
            &api.submit(&api.alice, &format!("l-{i}"), &small(i)).await.2,
        ));
    }
    api.submit(&api.bob, "bob-1", &small(9)).await;
    let (s, _, page1) = api.get(&api.alice, "/v1/etl-jobs?limit=2").await;
    assert_eq!(s, StatusCode::OK);
    let got: Vec<_> = page1["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(got, vec![ids[4], ids[3]]);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, _, page2) = api
        .get(&api.alice, &format!("/v1/etl-jobs?limit=2&cursor={cursor}"))
        .await;
    let (_, _, page3) = api
        .get(
            &api.alice,
            &format!(
                "/v1/etl-jobs?limit=2&cursor={}",
                page2["next_cursor"].as_str().unwrap()
            ),
        )
        .await;
    assert_eq!(
        page3["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect::<Vec<_>>(),
        vec![ids[0]]
    );
    assert!(page3.get("next_cursor").is_none());
    api.delete(&api.alice, &format!("/v1/etl-jobs/{}", ids[1]))
        .await;
    let (_, _, cancelled) = api.get(&api.alice, "/v1/etl-jobs?status=cancelled").await;
    assert_eq!(
        cancelled["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect::<Vec<_>>(),
        vec![ids[1]]
    );
    let (_, _, all) = api.get(&api.alice, "/v1/etl-jobs").await;
    assert_eq!(
        all["jobs"].as_array().unwrap().len(),
        5,
        "bob's job is not listed"
    );
}

/// `?status=` pages through one status of the owner's jobs by the owner + status index: behind
/// 20,000 newer succeeded jobs, the three cancelled ones come newest first, two pages of them,
/// and the listing's plan reads them through `etl_job_outcomes_owner_status_listing_idx` without
/// filtering out a single other job.
/// A listing by a live status pages the owner's live jobs of that status, newest first, and
/// none of another owner's or of the other live status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_status_listing_pages_the_owners_live_jobs_newest_first() {
    use durable_etl::worker::claimer;
    let api = Api::start().await;
    let client = api.db.client().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(id_of(
            &api.submit(&api.alice, &format!("live-{n}"), &small(1))
                .await
                .2,
        ));
    }
    api.submit(&api.bob, "live-bob", &small(1)).await;
    // The claim takes the due jobs oldest first: alice's two oldest run, her newest waits.
    let claimant = claimer::Claimant {
        owner_id: "lister",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    let claimed = claimer::claim(&client, claimant, 2).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(
        api.pages(&api.alice, "running", 1).await,
        vec![vec![ids[1]], vec![ids[0]]]
    );
    assert_eq!(
        api.pages(&api.alice, "pending", 20).await,
        vec![vec![ids[2]]]
    );
    assert_eq!(
        api.pages(&api.bob, "running", 20).await,
        [Vec::<uuid::Uuid>::new()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_listing_reads_one_page_of_the_owner_status_index() {
    let api = Api::start().await;
    let client = api.db.client().await;
    let mut cancelled = Vec::new();
    for i in 0..3 {
        let id = id_of(&api.submit(&api.alice, &format!("s-{i}"), &small(i)).await.2);
        api.delete(&api.alice, &format!("/v1/etl-jobs/{id}")).await;
        cancelled.push(id);
    }
    // 20,000 newer succeeded jobs of the same owner (time-ordered ids after the cancelled ones).
    crate::support::insert_ended_jobs(
        &client,
        "SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::int8 + 1000 + g), 12, '0')
                 || '70008' || lpad(to_hex(g), 15, '0'))::uuid AS id,
                i.owner_key, 'succeeded' AS status, NULL::text AS failure_code,
                now() AS finished_at, NULL::uuid AS replaces_job_id
           FROM generate_series(1, 20000) g,
                (SELECT owner_key FROM etl_job_intake WHERE id = $1) i",
        &[&cancelled[0]],
    )
    .await;
    client
        .batch_execute("ANALYZE etl_job_intake, etl_job_records, etl_job_outcomes")
        .await
        .unwrap();

    assert_eq!(
        api.pages(&api.alice, "cancelled", 2).await,
        vec![vec![cancelled[2], cancelled[1]], vec![cancelled[0]]]
    );

    let owner: Vec<u8> = client
        .query_one(
            "SELECT owner_key FROM etl_job_intake WHERE id = $1",
            &[&cancelled[0]],
        )
        .await
        .unwrap()
        .get(0);
    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        durable_etl::jobs::LIST_ENDED_SQL
    );
    let plan: Value = client
        .query_typed(
            &explain,
            &[
                (&owner, Type::BYTEA),
                (&None::<uuid::Uuid>, Type::UUID),
                (&"cancelled", Type::TEXT),
                (&51i64, Type::INT8),
                (&None::<uuid::Uuid>, Type::UUID),
            ],
        )
        .await
        .unwrap()[0]
        .get(0);
    let text = plan.to_string();
    assert!(
        text.contains("\"Index Name\":\"etl_job_outcomes_owner_status_listing_idx\""),
        "{plan:#}"
    );
    assert!(!text.contains("Rows Removed by Filter"), "{plan:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_of_pending_running_and_terminal_jobs() {
    let api = Api::start().await;
    let client = api.db.client().await;
    let pending = id_of(&api.submit(&api.alice, "c-1", &small(1)).await.2);
    let (s, _, body) = api
        .delete(&api.alice, &format!("/v1/etl-jobs/{pending}"))
        .await;
    assert_eq!(
        (s, body["status"].as_str(), body["failure"]["code"].as_str()),
        (StatusCode::OK, Some("cancelled"), Some("cancelled"))
    );
    assert!(!job_row(&client, pending).await.live);
    let (s, _, p) = api
        .delete(&api.alice, &format!("/v1/etl-jobs/{pending}"))
        .await;
    assert_eq!(
        (s, p["job_status"].as_str()),
        (StatusCode::CONFLICT, Some("cancelled"))
    );
    let (s, _, _) = api
        .delete(&api.bob, &format!("/v1/etl-jobs/{pending}"))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // A running job: claimed by a stalled replica, cancelled, then its commit is refused.
    let running = id_of(&api.submit(&api.alice, "c-2", &small(2)).await.2);
    let claimant = stalled_claimant("stalled", Duration::from_secs(60));
    let claimed = durable_etl::worker::claimer::claim(&client, claimant, 1)
        .await
        .unwrap();
    assert_eq!(claimed[0].id(), running);
    let (s, h, body) = api
        .delete(&api.alice, &format!("/v1/etl-jobs/{running}"))
        .await;
    assert_eq!(
        (
            s,
            body["cancel_requested"].as_bool(),
            body["may_still_succeed"].as_bool()
        ),
        (StatusCode::ACCEPTED, Some(true), Some(false))
    );
    assert!(h.get("location").is_some());
    // The stalled replica's lease expires; a live replica recovers the job, which ends cancelled.
    client.execute("UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second' WHERE id = $1", &[&running]).await.unwrap();
    let worker = api.worker("api-worker").await;
    assert_eq!(worker.recover().await.unwrap().exhausted, 1);
    let (_, _, body) = api
        .get(&api.alice, &format!("/v1/etl-jobs/{running}"))
        .await;
    assert_eq!(
        (body["status"].as_str(), body["failure"]["code"].as_str()),
        (Some("cancelled"), Some("cancelled"))
    );
    assert_eq!(count(&client, "etl_target_rows").await, 0);

    // A job cancelled while its worker computes: its fenced commit is refused.
    let racing = id_of(&api.submit(&api.alice, "c-3", &small(3)).await.2);
    let claimed = durable_etl::worker::claimer::claim(&client, claimant, 1)
        .await
        .unwrap();
    api.delete(&api.alice, &format!("/v1/etl-jobs/{racing}"))
        .await;
    client
        .execute(
            "UPDATE etl_job_records SET lease_owner_id = 'api-worker' WHERE id = $1",
            &[&racing],
        )
        .await
        .unwrap();
    drop(claimed);
    let succeeded = api.submit(&api.alice, "c-4", &small(4)).await.2;
    client.execute("UPDATE etl_job_records SET status = 'pending', lease_owner_id = NULL, lease_claim_id = NULL, lease_expires_at = NULL, attempts = 0 WHERE id = $1 AND status = 'running'", &[&racing]).await.unwrap();
    let done = worker.step().await.unwrap();
    assert!(done.contains(&(racing, Transition::Cancelled)), "{done:?}");
    assert!(done.contains(&(id_of(&succeeded), Transition::Succeeded)));
    assert_eq!(
        count(&client, "etl_target_rows").await,
        1,
        "only the uncancelled job loaded"
    );
    let (s, _, p) = api
        .delete(&api.alice, &format!("/v1/etl-jobs/{}", id_of(&succeeded)))
        .await;
    assert_eq!(
        (s, p["job_status"].as_str()),
        (StatusCode::CONFLICT, Some("succeeded"))
    );
}

/// A session of the test holds a running job's row, as its group commit does while the job's
/// effects apply: the DELETE answers `202` at once, saying the job may still succeed; the API
/// then waits for the row behind the holder and sets the request on it the moment it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_commit_holds_the_job_answers_202_at_once_that_it_may_still_succeed() {
    let api = Api::start().await;
    let client = api.db.client().await;
    let running = id_of(&api.submit(&api.alice, "d-1", &small(1)).await.2);
    let claimed = durable_etl::worker::claimer::claim(
        &client,
        stalled_claimant("committing", Duration::from_secs(60)),
        1,
    )
    .await
    .unwrap();
    assert_eq!(claimed[0].id(), running);
    let holder = hold_job_row(&api.db, running).await;
    let started = std::time::Instant::now();
    let (s, h, body) = api
        .delete(&api.alice, &format!("/v1/etl-jobs/{running}"))
        .await;
    let took = started.elapsed();
    eprintln!("DELETE of a committing job answered in {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(
        (
            s,
            body["status"].as_str(),
            body["may_still_succeed"].as_bool()
        ),
        (StatusCode::ACCEPTED, Some("running"), Some(true)),
        "{body}"
    );
    assert_eq!(
        h.get("location").and_then(|l| l.to_str().ok()),
        Some(format!("/v1/etl-jobs/{running}").as_str())
    );
    assert_eq!(count(&client, "etl_job_cancel_deferred").await, 1);
    eventually("the API to wait for the job's row", || async {
        count(
            &client,
            "pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            == 1
    })
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    eventually("the request to be set on the job", || async {
        count(&client, "etl_job_cancel_deferred").await == 0
    })
    .await;
    let (_, _, body) = api
        .get(&api.alice, &format!("/v1/etl-jobs/{running}"))
        .await;
    assert_eq!(
        (body["status"].as_str(), body["cancel_requested"].as_bool()),
        (Some("running"), Some(true))
    );
    drop(claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_cancels_the_old_job_atomically() {
    let api = Api::start().await;
    let client = api.db.client().await;
    let old = id_of(&api.submit(&api.alice, "r-1", &small(1)).await.2);
    let mut replacement = small(2);
    replacement["replaces"] = json!(old.to_string());
    let (s, _, new) = api.submit(&api.alice, "r-2", &replacement).await;
    assert_eq!(
        (s, new["replaces"].as_str()),
        (StatusCode::ACCEPTED, Some(old.to_string().as_str()))
    );
    let old_row = job_row(&client, old).await;
    assert_eq!(
        (old_row.status.as_str(), old_row.failure_code.as_deref()),
        ("cancelled", Some("replaced"))
    );
    // A replay replaces nothing again; replacing an ended job is a conflict; an unknown one, 404.
    let (s, _, again) = api.submit(&api.alice, "r-2", &replacement).await;
    assert_eq!((s, id_of(&again)), (StatusCode::ACCEPTED, id_of(&new)));
    let (s, _, p) = api.submit(&api.alice, "r-3", &replacement).await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    let mut unknown = small(3);
    unknown["replaces"] = json!(uuid::Uuid::now_v7().to_string());
    let (s, _, _) = api.submit(&api.alice, "r-4", &unknown).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    unknown["replaces"] = json!(old.to_string());
    let (s, _, _) = api.submit(&api.bob, "r-5", &unknown).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "bob cannot replace alice's job");
    assert_eq!(
        count(&client, "etl_job_intake").await,
        2,
        "refused replacements enqueued nothing"
    );
    let worker = api.worker("api-worker").await;
    assert_eq!(
        worker.step().await.unwrap(),
        vec![(id_of(&new), Transition::Succeeded)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_job_shows_its_run_at_in_utc_and_succeeds_after_it() {
    let api = Api::start().await;
    let client = api.db.client().await;
    let run_at = (chrono::Utc::now() + chrono::Duration::milliseconds(700))
        .with_timezone(&chrono::FixedOffset::east_opt(3600 * 5).unwrap());
    let mut body = small(1);
    body["run_at"] = json!(run_at.to_rfc3339());
    let (_, _, status) = api.submit(&api.alice, "d-1", &body).await;
    let shown = status["run_at"].as_str().unwrap();
    assert!(shown.ends_with('Z'), "{shown}");
    let shown = chrono::DateTime::parse_from_rfc3339(shown).unwrap();
    assert_eq!(
        shown.timestamp_micros(),
        run_at.timestamp_micros(),
        "the same instant, in UTC"
    );
    let worker = api.worker("api-worker").await;
    assert!(worker.step().await.unwrap().is_empty(), "not due yet");
    eventually("the job to become due and run", || {
        let worker = &worker;
        async move { !worker.step().await.unwrap().is_empty() }
    })
    .await;
    let id = id_of(&status);
    assert_eq!(job_row(&client, id).await.status, "succeeded");
    let not_early: bool = client
        .query_one(
            "SELECT started_at >= run_at FROM etl_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(not_early);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_value_appears_in_any_response() {
    let api = Api::start().await;
    let canary = json!({
        "dataset": "canary_dataset", "key": "canary_key",
        "records": [{"canary_key": "canary-record-key", "secret": "canary-value"}],
        "transform": {"rename": {"canary_from": "canary_to"}}
    });
    let (_, _, status) = api.submit(&api.alice, "canary-idem-key", &canary).await;
    let id = id_of(&status);
    api.submit(
        &api.alice,
        "canary-idem-key",
        &json!({"dataset": "canary_other", "key": "k", "records": []}),
    )
    .await;
    api.submit(
        &api.alice,
        "canary-bad",
        &json!({"dataset": "Canary-Bad", "key": "k", "records": []}),
    )
    .await;
    api.submit(
        &api.alice,
        "canary-bad",
        &json!({"dataset": "d", "key": "k", "records": [], "canary_field": "canary-x"}),
    )
    .await;
    let worker = api.worker("api-worker").await;
    worker.step().await.unwrap();
    api.get(&api.alice, &format!("/v1/etl-jobs/{id}")).await;
    api.get(&api.alice, "/v1/etl-jobs").await;
    api.get("canary-bearer", "/v1/etl-jobs").await;
    for body in api.seen.lock().unwrap().iter() {
        assert!(
            !body.to_lowercase().contains("canary"),
            "a request value leaked: {body}"
        );
    }
}

#[tokio::test]
async fn the_served_openapi_document_describes_every_route() {
    let api = Api::start().await;
    let (s, _, doc) = api.get(&api.alice, "/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(doc, service::openapi());
    assert_eq!(
        doc["components"]["schemas"]["EtlRequest"]["required"],
        json!(["dataset", "key", "records"])
    );
    assert!(doc["components"]["schemas"]["JsonValue"]["anyOf"].is_array());
    for (path, methods) in [
        ("/v1/etl-jobs", vec!["get", "post"]),
        ("/v1/etl-jobs/{id}", vec!["get", "delete"]),
        ("/healthz", vec!["get"]),
        ("/readyz", vec!["get"]),
        ("/metrics", vec!["get"]),
        ("/v1/queues", vec!["get"]),
        ("/v1/queues/{name}", vec!["get"]),
    ] {
        for method in methods {
            assert!(
                doc["paths"][path][method].is_object(),
                "{method} {path} undocumented"
            );
        }
    }
    assert_eq!(
        doc["components"]["schemas"]["EtlRequest"]["properties"]["dataset"]["pattern"],
        "^[a-z][a-z0-9_]{0,62}$"
    );
    let (s, h, _) = api.get(&api.alice, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    assert!(h["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let metrics = api.seen.lock().unwrap().last().unwrap().clone();
    assert!(
        metrics.contains("durable_etl_http_responses_total{class=\"2xx\"}"),
        "{metrics}"
    );
    let (s, _, h) = api.get(&api.alice, "/healthz").await;
    assert_eq!((s, h["status"].as_str()), (StatusCode::OK, Some("ok")));
}

#[tokio::test]
async fn every_error_is_a_problem_and_the_bearer_scheme_is_case_insensitive() {
    let api = Api::start().await;
    // A path segment that is not UTF-8 once decoded: no such job, as a problem.
    let (s, h, p) = api.get(&api.alice, "/v1/etl-jobs/%FF").await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(h["content-type"], "application/problem+json");
    let (s, h, p) = api.delete(&api.alice, "/v1/etl-jobs/%FF").await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(h["content-type"], "application/problem+json");
    // A method no route serves: 405 with Allow, as a problem.
    let put = api.http.put(format!("{}/v1/etl-jobs", api.base));
    let (s, h, p) = api
        .read(put.bearer_auth(&api.alice).send().await.unwrap())
        .await;
    assert_eq!(
        (s, p["code"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"))
    );
    assert_eq!(h["content-type"], "application/problem+json");
    let allow = h["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    // RFC 9110: the scheme name is case-insensitive; another scheme is still refused.
    for (scheme, expected) in [
        ("bearer", StatusCode::OK),
        ("BEARER", StatusCode::OK),
        ("Bearer", StatusCode::OK),
        ("Basic", StatusCode::UNAUTHORIZED),
    ] {
        let authorization = format!("{scheme} {}", api.alice);
        let listing = api.http.get(format!("{}/v1/etl-jobs", api.base));
        let response = listing.header("Authorization", authorization).send();
        assert_eq!(response.await.unwrap().status(), expected, "{scheme}");
    }
}

/// 200,000 succeeded jobs of yesterday: the history a scrape must not read (the rows of
/// [`crate::support::insert_ended_jobs`]).
const TERMINAL_HISTORY: &str =
    "SELECT gen_random_uuid() AS id, sha256(n::text::bytea) AS owner_key,
        'succeeded' AS status, NULL::text AS failure_code, now() AS finished_at,
        NULL::uuid AS replaces_job_id
   FROM generate_series(1, 200000) n";

/// The plan of `sql` on `client`, as `EXPLAIN (FORMAT JSON)` text.
async fn plan_of(client: &tokio_postgres::Client, sql: &str) -> String {
    let row = client
        .query_one(&format!("EXPLAIN (FORMAT JSON) {sql}"), &[])
        .await
        .unwrap();
    row.get::<_, serde_json::Value>(0).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_scrape_reads_only_the_active_rows_through_their_indexes() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    crate::support::insert_ended_jobs(&client, TERMINAL_HISTORY, &[]).await;
    crate::support::insert_jobs(&client, "test.noop", &vec![json!({}); 3], 3).await;
    crate::support::insert_job(&client, "now() + interval '1 hour'").await;
    client
        .batch_execute(
            "UPDATE etl_job_records
                SET status = 'running', attempts = 1, lease_owner_id = 'metrics',
                    lease_claim_id = gen_random_uuid(), lease_expires_at = now() + interval '1 minute',
                    lease_renewed_at = now()
              WHERE id = (SELECT id FROM etl_job_records WHERE status = 'pending'
                           AND run_at <= now() LIMIT 1)",
        )
        .await
        .unwrap();
    // Never analyzed since the insert, then analyzed: neither plan may read the ended jobs,
    // which since migration 0008 live in the intake and outcome tables only. (The live table is
    // tiny here, so the analyzed planner may rightly scan it whole.)
    for analyze in [false, true] {
        if analyze {
            client.batch_execute("ANALYZE").await.unwrap();
        }
        let plan = plan_of(&client, durable_etl::service::metrics::QUEUE_SAMPLE_SQL).await;
        assert!(
            plan.contains("\"etl_job_records\""),
            "analyzed {analyze}: {plan}"
        );
        for history in ["etl_job_outcomes", "etl_job_intake"] {
            assert!(!plan.contains(history), "analyzed {analyze}: {plan}");
        }
        let sample = durable_etl::service::metrics::sample_queue(&client)
            .await
            .unwrap();
        assert_eq!(
            (sample.due, sample.deferred, sample.running),
            (2, 1, 1),
            "{sample:?}"
        );
        assert!(sample.oldest_due_seconds >= 1.0, "{sample:?}");
    }
}

/// The next notification `listener` receives, within 30 s.
async fn next_notification(listener: &mut Listener) -> (String, String) {
    tokio::time::timeout(Duration::from_secs(30), listener.notifications.recv())
        .await
        .expect("a notification within 30 s")
        .expect("listener alive")
}

/// The backend pids of the notifier connections on `api`'s database.
async fn notifier_pids(client: &tokio_postgres::Client, api: &Api) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = $1 AND application_name = 'durable-etl/notifier'",
            &[&api.db.name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Served with its notifier, a submission's transaction runs with the trigger's NOTIFY off (a
/// second statement trigger records the setting inside it), and the replicas are woken anyway,
/// after the commits: N concurrent submissions cause between 1 and N empty notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_skip_the_trigger_and_wake_the_replicas_through_the_notifier() {
    let api = Api::start_notifying().await;
    let client = api.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE seen_notify_setting (setting text);
             CREATE FUNCTION record_notify_setting() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO seen_notify_setting VALUES (current_setting('durable_etl.notify', true));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER record_notify_setting AFTER INSERT ON etl_job_records
                 FOR EACH STATEMENT EXECUTE FUNCTION record_notify_setting();",
        )
        .await
        .unwrap();
    let mut listener = Listener::start(&api.db, &["durable_etl_jobs"]).await;
    register_waiting(&client, "listener").await;
    const N: usize = 8;
    let submissions = (0..N).map(|i| {
        let (api, body) = (&api, small(i as i64));
        async move { api.submit(&api.alice, &format!("n-{i}"), &body).await.0 }
    });
    let statuses = futures::future::join_all(submissions).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::ACCEPTED));
    let settings: Vec<Option<String>> = client
        .query("SELECT setting FROM seen_notify_setting", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(settings, vec![Some("off".to_owned()); N]);

    let mut seen = vec![next_notification(&mut listener).await];
    // The rest, if any, arrive soon after; the count is bounded whenever they come.
    while let Ok(Some(n)) =
        tokio::time::timeout(Duration::from_millis(500), listener.notifications.recv()).await
    {
        seen.push(n);
    }
    assert!(
        (1..=N).contains(&seen.len()),
        "{} notifications",
        seen.len()
    );
    assert!(seen
        .iter()
        .all(|n| *n == ("durable_etl_jobs".to_owned(), String::new())));
    // A replayed submission inserts nothing and wakes nobody.
    let (status, _, _) = api.submit(&api.alice, "n-0", &small(0)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    client
        .batch_execute("NOTIFY durable_etl_jobs, 'sentinel'")
        .await
        .unwrap();
    assert_eq!(
        next_notification(&mut listener).await.1,
        "sentinel",
        "the replay notified nothing"
    );
}

/// The notifier's connection, terminated by the server, is opened again, and later submissions
/// still wake the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notifier_reopens_its_terminated_connection() {
    let api = Api::start_notifying().await;
    let client = api.db.client().await;
    let mut listener = Listener::start(&api.db, &["durable_etl_jobs"]).await;
    register_waiting(&client, "listener").await;
    eventually("the notifier's connection", || async {
        notifier_pids(&client, &api).await.len() == 1
    })
    .await;
    let old = notifier_pids(&client, &api).await[0];
    client
        .query_one("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap();
    eventually("the terminated connection's end", || async {
        notifier_pids(&client, &api).await.is_empty()
    })
    .await;
    for i in 0..2 {
        let (status, _, _) = api
            .submit(&api.alice, &format!("after-{i}"), &small(i))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert_eq!(
            next_notification(&mut listener).await,
            ("durable_etl_jobs".to_owned(), String::new())
        );
    }
    let new = notifier_pids(&client, &api).await;
    assert_eq!(new.len(), 1);
    assert_ne!(new[0], old);
}

impl Api {
    /// Sends `method` to `path` as `key` (none: no credentials), with `body` as JSON if given;
    /// returns (status, JSON body or Null).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let (status, _, json) = self.read(request.send().await.unwrap()).await;
        (status, json)
    }
}

/// Schedules of ETL loads through the API: created, read, paused, resumed and deleted by their
/// owner only; a bad expression, a bad request (with its pointer under `/request`) or a bad
/// policy is refused and writes nothing.
#[tokio::test]
async fn schedules_are_their_owners_and_refused_with_a_pointer_when_invalid() {
    use reqwest::Method;
    let api = Api::start().await;
    let (alice, bob) = (Some(api.alice.as_str()), Some(api.bob.as_str()));
    let request = json!({"dataset": "d", "key": "id", "records": [{"id": 1}]});
    let body = json!({"cron": "0 6 * * *", "time_zone": "Europe/London", "request": request,
                      "missed": "catch_up", "catch_up_limit": 3, "overlap": "skip"});
    let path = "/v1/schedules/morning";
    let (status, stored) = api.call(Method::PUT, path, alice, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(
        (
            &stored["kind"],
            &stored["time_zone"],
            &stored["missed"],
            &stored["catch_up_limit"]
        ),
        (
            &json!("etl.load"),
            &json!("Europe/London"),
            &json!("catch_up"),
            &json!(3)
        )
    );
    assert_eq!(
        (&stored["overlap"], &stored["paused"]),
        (&json!("skip"), &json!(false))
    );
    let (_, listed) = api.call(Method::GET, "/v1/schedules", alice, None).await;
    assert_eq!(listed["schedules"].as_array().map(Vec::len), Some(1));

    // Bob sees and touches none of Alice's.
    let (_, theirs) = api.call(Method::GET, "/v1/schedules", bob, None).await;
    assert_eq!(theirs["schedules"], json!([]));
    for (method, route) in [
        (Method::GET, path.to_owned()),
        (Method::DELETE, path.to_owned()),
        (Method::POST, format!("{path}/pause")),
        (Method::GET, format!("{path}/fires")),
    ] {
        let (status, problem) = api.call(method, &route, bob, None).await;
        assert_eq!(
            (status, &problem["code"]),
            (StatusCode::NOT_FOUND, &json!("not_found"))
        );
    }
    let (status, _) = api.call(Method::GET, "/v1/schedules", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (_, paused) = api
        .call(Method::POST, &format!("{path}/pause"), alice, None)
        .await;
    assert_eq!(paused["paused"], json!(true));
    let (_, resumed) = api
        .call(Method::POST, &format!("{path}/resume"), alice, None)
        .await;
    assert_eq!(resumed["paused"], json!(false));
    let (status, fires) = api
        .call(Method::GET, &format!("{path}/fires"), alice, None)
        .await;
    assert_eq!((status, &fires["fires"]), (StatusCode::OK, &json!([])));

    // Refusals, each with its code and pointer, none written.
    let refused = [
        (
            json!({"cron": "nope", "request": request}),
            "schedule_invalid",
            "/cron",
        ),
        (
            json!({"cron": "* * * * *", "time_zone": "Nowhere/Special", "request": request}),
            "schedule_invalid",
            "/time_zone",
        ),
        (
            json!({"cron": "* * * * *", "request": {"dataset": "BAD", "key": "id", "records": [{"id": 1}]}}),
            "dataset_invalid",
            "/request/dataset",
        ),
        (
            json!({"cron": "* * * * *", "request": {"dataset": "d", "key": "id", "records": [{"id": 1}],
                                                  "run_at": "2030-01-01T00:00:00Z"}}),
            "schedule_invalid",
            "/request",
        ),
        (
            json!({"cron": "* * * * *", "request": request, "missed": "sometimes"}),
            "schedule_invalid",
            "/missed",
        ),
        (
            json!({"cron": "* * * * *", "request": request, "overlap": "never"}),
            "schedule_invalid",
            "/overlap",
        ),
        (
            json!({"cron": "* * * * *", "request": request, "colour": "red"}),
            "schedule_invalid",
            "",
        ),
    ];
    for (body, code, pointer) in refused {
        let (status, problem) = api
            .call(Method::PUT, "/v1/schedules/other", alice, Some(body))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
        assert_eq!(
            (&problem["code"], &problem["pointer"]),
            (&json!(code), &json!(pointer))
        );
    }
    let malformed = api
        .http
        .put(format!("{}/v1/schedules/other", api.base))
        .bearer_auth(&api.alice)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    let client = api.db.client().await;
    assert_eq!(count(&client, "etl_schedules").await, 1);

    let (status, _) = api.call(Method::DELETE, path, alice, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = api.call(Method::GET, path, alice, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api
        .call(Method::POST, &format!("{path}/resume"), alice, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
