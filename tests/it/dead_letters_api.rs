//! The dead-letter routes over HTTP: owner-scoped for owners' keys (another owner's letter is
//! `404`), every owner's for an operator's key; a replay answers `202` with the new job's
//! monitor, once per letter; a body replays only when it is the failed job's request; filters
//! are validated; no answer carries a payload value or a principal.

use crate::etl::{etl_worker, new_job, req};
use crate::support::{count, TestDb};
use durable_etl::config::ApiConfig;
use durable_etl::kinds::etl::enqueue::enqueue;
use durable_etl::service::api_keys::{self, Role};
use durable_etl::{service, AppState, Secret};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

/// The tests' secret.
pub(crate) const SECRET: &str = "dead-letter-api-secret-0123456789";

/// A value only the failing requests carry: no answer may show it.
pub(crate) const CANARY: &str = "CANARY-dl-api-93ab";

/// The API on a fresh database, its keys, and every body it answered.
pub(crate) struct Api {
    /// The database.
    pub(crate) db: TestDb,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    /// Alice's key (an owner's).
    pub(crate) alice: String,
    /// Bob's key (an owner's).
    pub(crate) bob: String,
    /// An operator's key.
    pub(crate) ops: String,
    /// The client.
    pub(crate) http: Client,
    /// Every body answered, for the privacy check.
    pub(crate) seen: std::sync::Mutex<Vec<String>>,
}

impl Api {
    /// Starts the API, retaining payloads for an hour.
    pub(crate) async fn start() -> Api {
        let db = TestDb::migrated().await;
        let secret = Secret::new(SECRET).unwrap();
        let client = db.client().await;
        let key = |owner: &'static str, role| {
            let (client, secret) = (&client, &secret);
            async move {
                api_keys::create_as(client, secret, owner, role)
                    .await
                    .unwrap()
                    .key
            }
        };
        let alice = key("alice", Role::Owner).await;
        let bob = key("bob", Role::Owner).await;
        let ops = key("ops", Role::Operator).await;
        let config = ApiConfig {
            retain_payloads: Some(Duration::from_secs(3600)),
            ..ApiConfig::default()
        };
        let pool = durable_etl::db::connect_pool(&db.config, "api")
            .await
            .unwrap();
        let app = service::app(AppState::new(pool, secret, config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Api {
            db,
            base,
            alice,
            bob,
            ops,
            http: Client::new(),
            seen: Default::default(),
        }
    }

    /// Sends `method` to `path` as `key`, with `body` as JSON if given; returns the status, the
    /// `Location` header and the JSON body (or null).
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let location = response
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned());
        let text = response.text().await.unwrap();
        self.seen.lock().unwrap().push(text.clone());
        (
            status,
            location,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    /// Submits `body` through the API as `key` with idempotency key `idem`; returns the job's
    /// id (the last segment of its monitor's `Location`).
    pub(crate) async fn submit(&self, key: &str, idem: &str, body: &Value) -> String {
        let response = self
            .http
            .post(format!("{}/v1/etl-jobs", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", idem)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let location = response.headers()["location"].to_str().unwrap();
        location.rsplit('/').next().unwrap().to_owned()
    }

    /// GETs `path` as `key`.
    pub(crate) async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let (status, _, body) = self.send(Method::GET, path, key, None).await;
        (status, body)
    }
}

/// A request whose second record fails its cast: the job ends `record_invalid`.
pub(crate) fn failing(tag: &str) -> Value {
    json!({
        "dataset": "d", "key": "id",
        "records": [{"id": 1, "n": "5"}, {"id": 2, "n": format!("{CANARY}-{tag}")}],
        "transform": {"cast": {"n": "integer"}}
    })
}

#[tokio::test]
async fn the_routes_are_owner_scoped_replay_once_and_show_no_payload() {
    let api = Api::start().await;
    let client = api.db.client().await;
    // Alice's failing job comes through the API, which retains its request; bob's through the
    // library without retention.
    api.submit(&api.alice, "a-1", &failing("alice")).await;
    let secret = Secret::new(SECRET).unwrap();
    let bob_owner = secret.digest(durable_etl::digest::DigestKind::Principal, b"bob");
    let bob_request = req(failing("bob"));
    let bob_job = enqueue(
        &client,
        &secret,
        &bob_owner,
        new_job("b-1", &bob_request, 1),
    )
    .await
    .unwrap()
    .id;
    let worker = etl_worker(&api.db, "letters-api", Duration::from_secs(5)).await;
    while count(&client, "etl_job_records").await > 0 {
        worker.step().await.unwrap();
    }
    assert_eq!(count(&client, "etl_dead_letters").await, 2);

    // Listings: each owner its own, the operator all (or one owner's).
    let (status, alice_list) = api.get("/v1/dead-letters", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    let letters = alice_list["letters"].as_array().unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["code"], "record_invalid");
    assert_eq!(letters[0]["kind"], "etl.load");
    assert_eq!(letters[0]["retained"], true);
    let alice_letter = letters[0]["job_id"].as_str().unwrap().to_owned();
    let (_, bob_list) = api.get("/v1/dead-letters", &api.bob).await;
    assert_eq!(bob_list["letters"][0]["job_id"], bob_job.to_string());
    assert_eq!(bob_list["letters"][0]["retained"], false);
    let (_, all) = api.get("/v1/dead-letters", &api.ops).await;
    assert_eq!(all["letters"].as_array().unwrap().len(), 2);
    let (_, only_bob) = api.get("/v1/dead-letters?owner=bob", &api.ops).await;
    assert_eq!(only_bob["letters"].as_array().unwrap().len(), 1);
    let (_, paged) = api.get("/v1/dead-letters?limit=1", &api.ops).await;
    let cursor = paged["next_cursor"].as_str().unwrap();
    let (_, second) = api
        .get(
            &format!("/v1/dead-letters?limit=1&cursor={cursor}"),
            &api.ops,
        )
        .await;
    assert_eq!(second["letters"].as_array().unwrap().len(), 1);
    assert_ne!(
        second["letters"][0]["job_id"],
        paged["letters"][0]["job_id"]
    );
    assert!(second["next_cursor"].is_null());
    let (_, counts) = api.get("/v1/dead-letters/counts", &api.ops).await;
    assert_eq!(
        counts,
        json!({"counts": [{"queue": "default", "code": "record_invalid", "count": 2}], "total": 2})
    );
    let (_, counts) = api
        .get("/v1/dead-letters/counts?code=record_invalid", &api.alice)
        .await;
    assert_eq!(counts["total"], 1);

    // Refused filters.
    for (path, pointer) in [
        ("/v1/dead-letters?owner=bob", Some("/owner")),
        ("/v1/dead-letters?limit=0", Some("/limit")),
        ("/v1/dead-letters?cursor=nope", Some("/cursor")),
        ("/v1/dead-letters?queue=Not%20a%20queue", Some("/queue")),
        ("/v1/dead-letters?since=yesterday", Some("/since")),
        ("/v1/dead-letters?status=failed", None),
        // A listing's page parameters are not a count's.
        ("/v1/dead-letters/counts?limit=5", None),
        ("/v1/dead-letters/counts?cursor=nope", None),
    ] {
        let (status, problem) = api.get(path, &api.alice).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(problem["code"], "query_invalid", "{path}");
        assert_eq!(problem["pointer"].as_str(), pointer, "{path}");
    }

    // A bulk action names its filter: without a body it takes nothing, never every letter.
    for path in ["/v1/dead-letters/replay", "/v1/dead-letters/discard"] {
        let (status, _, problem) = api.send(Method::POST, path, &api.ops, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(problem["code"], "request_malformed", "{path}");
    }
    let (_, counts) = api.get("/v1/dead-letters/counts", &api.ops).await;
    assert_eq!(counts["total"], 2, "{counts}");

    // Bob cannot see, discard or replay alice's letter.
    let alice_path = format!("/v1/dead-letters/{alice_letter}");
    let (status, _) = api.get(&alice_path, &api.bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = api.send(Method::DELETE, &alice_path, &api.bob, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let replay_path = format!("{alice_path}/replay");
    let (status, _, _) = api.send(Method::POST, &replay_path, &api.bob, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Alice replays hers from its retained request: 202 with the new job's monitor, once.
    let (status, location, done) = api.send(Method::POST, &replay_path, &api.alice, None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(done["made"], true);
    let new_job = done["job_id"].as_str().unwrap().to_owned();
    assert_eq!(
        location.as_deref(),
        Some(format!("/v1/etl-jobs/{new_job}").as_str())
    );
    let (status, monitor) = api
        .get(&format!("/v1/etl-jobs/{new_job}"), &api.alice)
        .await;
    assert_eq!(
        (status, &monitor["status"]),
        (StatusCode::OK, &json!("pending"))
    );
    let (_, _, again) = api.send(Method::POST, &replay_path, &api.alice, None).await;
    assert_eq!(
        (&again["made"], &again["job_id"]),
        (&json!(false), &json!(new_job))
    );
    let (_, letter) = api.get(&alice_path, &api.alice).await;
    assert_eq!(letter["replayed_job_id"], json!(new_job));

    // Bob's was not retained: without a body 409, with another body 422, with his own 202.
    let bob_replay = format!("/v1/dead-letters/{bob_job}/replay");
    let (status, _, problem) = api.send(Method::POST, &bob_replay, &api.bob, None).await;
    assert_eq!(
        (status, &problem["code"]),
        (StatusCode::CONFLICT, &json!("payload_not_retained"))
    );
    let (status, _, problem) = api
        .send(Method::POST, &bob_replay, &api.bob, Some(&failing("other")))
        .await;
    assert_eq!(
        (status, &problem["code"]),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            &json!("replay_body_mismatch")
        )
    );
    let (status, _, problem) = api
        .send(
            Method::POST,
            &bob_replay,
            &api.bob,
            Some(&json!({"dataset": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    let (status, _, done) = api
        .send(Method::POST, &bob_replay, &api.bob, Some(&failing("bob")))
        .await;
    assert_eq!(
        (status, &done["made"]),
        (StatusCode::ACCEPTED, &json!(true))
    );
    // Who asked is the key's id, never the owner.
    let by: Vec<String> = crate::support::first_column(
        &client,
        "SELECT replayed_by FROM etl_dead_letters ORDER BY replayed_by",
    )
    .await;
    assert!(by.iter().all(|b| b.starts_with("key:")), "{by:?}");

    // The replays fail again: new letters. The operator discards bob's by filter, replays the
    // rest in bulk (alice's, retained), then nothing is left.
    while count(&client, "etl_job_records").await > 0 {
        worker.step().await.unwrap();
    }
    let (_, open) = api.get("/v1/dead-letters", &api.ops).await;
    assert_eq!(open["letters"].as_array().unwrap().len(), 2);
    let (status, _, discarded) = api
        .send(
            Method::POST,
            "/v1/dead-letters/discard",
            &api.ops,
            Some(&json!({"owner": "bob"})),
        )
        .await;
    assert_eq!(
        (status, &discarded["discarded"]),
        (StatusCode::OK, &json!(1))
    );
    let (status, _, bulk) = api
        .send(
            Method::POST,
            "/v1/dead-letters/replay",
            &api.ops,
            Some(&json!({})),
        )
        .await;
    assert_eq!(
        (status, bulk),
        (
            StatusCode::OK,
            json!({"made": 1, "not_retained": 0, "unreadable": 0})
        )
    );
    let (status, _, problem) = api
        .send(
            Method::POST,
            "/v1/dead-letters/replay",
            &api.ops,
            Some(&json!({"limit": 5})),
        )
        .await;
    assert_eq!(
        (status, &problem["code"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("request_invalid"))
    );
    let (_, open) = api.get("/v1/dead-letters", &api.ops).await;
    assert!(open["letters"].as_array().unwrap().is_empty());
    // Alice discards nothing of bob's, and a discarded letter is gone.
    let (status, _, _) = api
        .send(
            Method::DELETE,
            &format!("/v1/dead-letters/{bob_job}"),
            &api.alice,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let seen = api.seen.lock().unwrap().join("\n");
    assert!(!seen.contains(CANARY), "no answer shows a payload value");
    for principal in ["\"alice\"", "\"bob\""] {
        assert!(!seen.contains(principal), "no answer names an owner");
    }
}
