//! The web console (`/console`) at the handler level, over a real socket: sign-in and its
//! cookie, anti-forgery tokens, owner scoping, paging and filters, cancel, sign-out, and what
//! pages never show.

use crate::support::{pool, TestDb};
use durable_etl::config::WorkerConfig;
use durable_etl::config::{ApiConfig, DatabaseConfig};
use durable_etl::digest::Secret;
use durable_etl::job::handler::Registry;
use durable_etl::kinds::etl::load::EtlLoad;
use durable_etl::service::api_keys::{self, Role};
use durable_etl::service::{self, AppState};
use durable_etl::shutdown;
use durable_etl::worker::Worker;
use reqwest::header::{HeaderMap, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

/// The secret of these tests.
pub(crate) const SECRET: &str = "console-test-secret-0123456789";

/// A canary in every payload: no page may show it.
const CANARY: &str = "canary-payload-7c1e";

/// A running API and console with two owners' keys.
pub(crate) struct Console {
    /// The database.
    pub(crate) db: TestDb,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    /// Alice's key (an operator's).
    pub(crate) alice: String,
    /// Alice's key's id.
    alice_id: Uuid,
    /// Bob's key.
    pub(crate) bob: String,
    /// A client that does not follow redirects.
    pub(crate) http: Client,
}

/// A page as it came back.
pub(crate) struct Page {
    /// Its status.
    pub(crate) status: StatusCode,
    /// Its headers.
    pub(crate) headers: HeaderMap,
    /// Its body.
    pub(crate) body: String,
}

impl Page {
    /// The value of the first hidden `csrf` field.
    pub(crate) fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a csrf field")
            + 19;
        self.body[at..at + 64].to_owned()
    }

    /// The value cookie `name` is set to.
    pub(crate) fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(|v| v[name.len() + 1..v.find(';').unwrap_or(v.len())].to_owned())
    }

    /// Where it redirects.
    pub(crate) fn location(&self) -> &str {
        self.headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

impl Console {
    /// Starts the API and console on port 0 with keys for alice (an operator) and bob.
    pub(crate) async fn start() -> Console {
        let db = TestDb::migrated().await;
        let secret = Secret::new(SECRET).unwrap();
        let client = db.client().await;
        let alice = api_keys::create_as(&client, &secret, "alice", Role::Operator)
            .await
            .unwrap();
        let bob = api_keys::create(&client, &secret, "bob").await.unwrap().key;
        let app = service::app(AppState::new(pool(&db).await, secret, ApiConfig::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Console {
            db,
            base,
            alice: alice.key,
            alice_id: alice.id,
            bob,
            http: Client::builder().redirect(Policy::none()).build().unwrap(),
        }
    }

    /// Creates a key for `principal` with `role`; returns the key.
    pub(crate) async fn key_for(&self, principal: &str, role: Role) -> String {
        let client = self.db.client().await;
        let secret = Secret::new(SECRET).unwrap();
        api_keys::create_as(&client, &secret, principal, role)
            .await
            .unwrap()
            .key
    }

    /// GETs `path` with `cookies`.
    pub(crate) async fn get(&self, path: &str, cookies: &str) -> Page {
        get_page(&self.http, &self.base, path, cookies).await
    }

    /// POSTs the form `fields` to `path` with `cookies`.
    pub(crate) async fn post(&self, path: &str, cookies: &str, fields: &str) -> Page {
        post_form(&self.http, &self.base, path, cookies, fields).await
    }

    /// Posts the sign-in form served to a fresh browser with `key`; returns the answer.
    pub(crate) async fn post_sign_in(&self, key: &str) -> Page {
        post_sign_in(&self.http, &self.base, key).await
    }

    /// Signs in with `key`; returns the session cookie (`name=value`).
    pub(crate) async fn sign_in(&self, key: &str) -> String {
        let signed = self.post_sign_in(key).await;
        assert_eq!(signed.status, StatusCode::SEE_OTHER);
        format!("detl_session={}", signed.cookie("detl_session").unwrap())
    }

    /// Submits a job through the API as `key`, `deferred` by an hour or due now; returns its id.
    pub(crate) async fn submit(&self, key: &str, idem: &str, deferred: bool) -> Uuid {
        let hour = deferred.then(|| chrono::Duration::hours(1));
        self.submit_due_in(key, idem, hour).await
    }

    /// Submits a job through the API as `key`, due after `delay` (or now); returns its id.
    pub(crate) async fn submit_due_in(
        &self,
        key: &str,
        idem: &str,
        delay: Option<chrono::Duration>,
    ) -> Uuid {
        let mut body = json!({"dataset": "d", "key": "id", "records": [{"id": 1, "note": CANARY}]});
        if let Some(delay) = delay {
            body["run_at"] = json!((chrono::Utc::now() + delay).to_rfc3339());
        }
        self.submit_body(key, idem, &body).await
    }

    /// Submits the job `body` through the API as `key`; returns its id.
    pub(crate) async fn submit_body(&self, key: &str, idem: &str, body: &Value) -> Uuid {
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
        let job: Value = response.json().await.unwrap();
        Uuid::parse_str(job["id"].as_str().unwrap()).unwrap()
    }

    /// Starts a replica that runs ETL loads against the console's database, polling every
    /// 100 ms and reporting every second, as `owner_id`.
    pub(crate) async fn replica(&self, owner_id: &str) -> Replica {
        self.try_replica_on(&self.db.config, owner_id)
            .await
            .unwrap()
    }

    /// [`Console::replica`] connecting with `config` (to the console's database, through a
    /// proxy, say), or the error its start met.
    pub(crate) async fn try_replica_on(
        &self,
        config: &DatabaseConfig,
        owner_id: &str,
    ) -> Result<Replica, durable_etl::Error> {
        let worker = Worker::start(
            durable_etl::db::connect_pool(config, "test").await?,
            config,
            WorkerConfig {
                owner_id: owner_id.to_owned(),
                poll_interval: Duration::from_millis(100),
                lease: Duration::from_secs(10),
                heartbeat_interval: Duration::from_secs(1),
                ..WorkerConfig::default()
            },
            Registry::new().perform(EtlLoad::default()),
        )
        .await?;
        let (trigger, shutdown) = shutdown::manual();
        Ok(Replica {
            trigger,
            running: tokio::spawn(worker.run(shutdown)),
        })
    }
}

/// A running replica of [`Console::replica`].
pub(crate) struct Replica {
    /// Stops it.
    trigger: shutdown::Trigger,
    /// Its run.
    running: tokio::task::JoinHandle<Result<(), durable_etl::Error>>,
}

impl Replica {
    /// Drains and stops it, and asserts it stopped cleanly.
    pub(crate) async fn stop(self) {
        self.trigger.request(shutdown::Stage::Draining);
        self.running.await.unwrap().unwrap();
    }

    /// Kills it as `kill -9` would: its tasks end where they are, nothing runs after them (no
    /// release, no last report), and its connections close.
    pub(crate) async fn kill(self) {
        self.running.abort();
        let _ = self.running.await;
    }

    /// Waits (at most 30 s) for it to stop by itself; returns how its run ended.
    pub(crate) async fn ended(self) -> Result<(), durable_etl::Error> {
        tokio::time::timeout(Duration::from_secs(30), self.running)
            .await
            .expect("the replica to stop within 30 s")
            .unwrap()
    }
}

/// Reads a response into a page.
/// GETs `path` of the console at `base` with `cookies`.
pub(crate) async fn get_page(http: &Client, base: &str, path: &str, cookies: &str) -> Page {
    let response = http
        .get(format!("{base}{path}"))
        .header(COOKIE, cookies)
        .send()
        .await
        .unwrap();
    read(response).await
}

/// POSTs the form `fields` to `path` of the console at `base` with `cookies`.
pub(crate) async fn post_form(
    http: &Client,
    base: &str,
    path: &str,
    cookies: &str,
    fields: &str,
) -> Page {
    let response = http
        .post(format!("{base}{path}"))
        .header(COOKIE, cookies)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(fields.to_owned())
        .send()
        .await
        .unwrap();
    read(response).await
}

/// Posts the sign-in form the console at `base` serves a fresh browser, with `key`; returns the
/// answer.
pub(crate) async fn post_sign_in(http: &Client, base: &str, key: &str) -> Page {
    let form = get_page(http, base, "/console/sign-in", "").await;
    let nonce = form.cookie("detl_sign_in").unwrap();
    let fields = format!("api_key={key}&csrf={}", form.csrf());
    let nonce = format!("detl_sign_in={nonce}");
    post_form(http, base, "/console/sign-in", &nonce, &fields).await
}

/// A response read whole.
async fn read(response: reqwest::Response) -> Page {
    Page {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.unwrap(),
    }
}

/// Asserts the console's security headers on `page`.
fn assert_secured(page: &Page) {
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    assert!(!csp.contains("unsafe-inline"));
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    assert_eq!(page.headers["referrer-policy"], "no-referrer");
}

#[tokio::test]
async fn sign_in_exchanges_a_key_for_a_strict_session_cookie_that_never_holds_the_key() {
    let console = Console::start().await;
    let form = console.get("/console/sign-in", "").await;
    assert_eq!(form.status, StatusCode::OK);
    assert_secured(&form);
    assert_eq!(form.headers["cache-control"], "no-store");
    assert!(form.body.contains("<label for=\"api_key\">API key</label>"));
    // The key is never stored in the browser: its field asks no password manager to keep it.
    assert!(
        form.body.contains("autocomplete=\"off\"") && !form.body.contains("current-password"),
        "{}",
        form.body
    );
    let nonce_cookie = form.headers[SET_COOKIE].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/console"] {
        assert!(nonce_cookie.contains(attribute), "{nonce_cookie}");
    }
    let signed = console.post_sign_in(&console.alice).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    assert_eq!(signed.location(), "/console/jobs");
    let session = signed.cookie("detl_session").unwrap();
    assert!(session.starts_with(&console.alice_id.to_string()));
    assert!(!session.contains(&console.alice));
    let set: Vec<&str> = signed
        .headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(set.iter().any(|c| c.starts_with("detl_session=")
        && c.contains("Max-Age=1800")
        && c.contains("HttpOnly")
        && c.contains("SameSite=Strict")));
    assert!(
        set.iter().any(|c| c.starts_with("detl_sign_in=;")),
        "the nonce is spent"
    );
    let jobs = console
        .get("/console/jobs", &format!("detl_session={session}"))
        .await;
    assert_eq!(jobs.status, StatusCode::OK);
    assert!(!jobs.body.contains(&console.alice));
    assert!(
        jobs.body.contains("href=\"/console/operator\""),
        "alice is an operator"
    );
}

#[tokio::test]
async fn a_wrong_key_is_refused_without_echo_and_a_forged_or_stale_form_is_forbidden() {
    let console = Console::start().await;
    let form = console.get("/console/sign-in", "").await;
    let nonce = format!("detl_sign_in={}", form.cookie("detl_sign_in").unwrap());
    let wrong = console
        .post(
            "/console/sign-in",
            &nonce,
            &format!("api_key=detl_wrong-canary&csrf={}", form.csrf()),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("role=\"alert\""));
    assert!(!wrong.body.contains("wrong-canary"));
    assert!(wrong.cookie("detl_session").is_none());
    // No nonce cookie (a form posted from another site), a wrong token, a stale nonce.
    let key = format!("api_key={}", console.alice);
    let forged = [
        ("", format!("{key}&csrf={}", form.csrf())),
        (nonce.as_str(), format!("{key}&csrf={}", "0".repeat(64))),
        (
            "detl_sign_in=abc.1000",
            format!("{key}&csrf={}", form.csrf()),
        ),
    ];
    for (cookies, fields) in forged {
        let refused = console.post("/console/sign-in", cookies, &fields).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{cookies} {fields}");
        assert!(refused.cookie("detl_session").is_none());
    }
    // A form far larger than any key is refused before it is read whole.
    let huge = format!("api_key={}&csrf={}", "k".repeat(20_000), form.csrf());
    let refused = console.post("/console/sign-in", &nonce, &huge).await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn pages_need_a_live_session_and_revoking_the_key_ends_it() {
    let console = Console::start().await;
    for path in [
        "/console/jobs",
        &format!("/console/jobs/{}", Uuid::now_v7()),
    ] {
        let page = console.get(path, "").await;
        assert_eq!(
            (page.status, page.location()),
            (StatusCode::SEE_OTHER, "/console/sign-in")
        );
    }
    let session = console.sign_in(&console.bob).await;
    assert_eq!(
        console.get("/console/jobs", &session).await.status,
        StatusCode::OK
    );
    let tampered = session.replace("detl_session=", "detl_session=0");
    let refused = console.get("/console/jobs", &tampered).await;
    assert_eq!(
        (refused.status, refused.location()),
        (StatusCode::SEE_OTHER, "/console/sign-in?ended=1")
    );
    let client = console.db.client().await;
    let alice_session = console.sign_in(&console.alice).await;
    api_keys::revoke(&client, console.alice_id).await.unwrap();
    // A session that ended (its key revoked, or expired, or signed out) is told so on the
    // sign-in page, and its cookie is cleared; a request without one is sent there plainly.
    let revoked = console.get("/console/jobs", &alice_session).await;
    assert_eq!(
        (revoked.status, revoked.location()),
        (StatusCode::SEE_OTHER, "/console/sign-in?ended=1")
    );
    let sign_in = console.get(revoked.location(), "").await;
    assert_eq!(sign_in.status, StatusCode::OK);
    assert!(
        sign_in.body.contains("Your session has ended"),
        "{}",
        sign_in.body
    );
    let plain = console.get("/console/sign-in", "").await;
    assert!(!plain.body.contains("Your session has ended"));
    assert_eq!(
        console.get("/console/jobs", &session).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_owner_sees_only_their_jobs_and_another_owners_job_is_not_found() {
    let console = Console::start().await;
    let mine = console.submit(&console.bob, "idem-canary-1", false).await;
    let theirs = console.submit(&console.alice, "idem-canary-2", false).await;
    let session = console.sign_in(&console.bob).await;
    let list = console.get("/console/jobs", &session).await;
    assert!(list.body.contains(&mine.to_string()));
    assert!(!list.body.contains(&theirs.to_string()));
    assert!(
        !list.body.contains("href=\"/console/operator\""),
        "bob is no operator"
    );
    let own = console
        .get(&format!("/console/jobs/{mine}"), &session)
        .await;
    assert_eq!(own.status, StatusCode::OK);
    assert_secured(&own);
    assert!(own.body.contains("pending") && own.body.contains("Accepted "));
    // Each job shows its kind, queue and priority, on the list and on its page.
    for page in [&list, &own] {
        assert!(page.body.contains("<code>etl.load</code>"), "{}", page.body);
        assert!(page.body.contains("<code>default</code>"), "{}", page.body);
    }
    assert!(own.body.contains(" at priority 0"), "{}", own.body);
    for path in [
        format!("/console/jobs/{theirs}"),
        "/console/jobs/not-a-uuid".to_owned(),
    ] {
        let other = console.get(&path, &session).await;
        assert_eq!(other.status, StatusCode::NOT_FOUND);
        assert!(!other.body.contains(&theirs.to_string()));
    }
    // No page shows a payload, a principal, an idempotency key or a key.
    for page in [list, own] {
        for secret in [CANARY, "idem-canary", "bob", console.bob.as_str(), "SELECT"] {
            assert!(!page.body.contains(secret), "{secret}");
        }
    }
}

#[tokio::test]
async fn the_list_pages_newest_first_and_filters_by_status_and_id() {
    let console = Console::start().await;
    let mut ids = Vec::new();
    for i in 0..53 {
        ids.push(console.submit(&console.bob, &format!("k-{i}"), false).await);
    }
    let session = console.sign_in(&console.bob).await;
    let first = console.get("/console/jobs", &session).await;
    let shown = |page: &Page| {
        ids.iter()
            .filter(|id| page.body.contains(&id.to_string()))
            .count()
    };
    assert_eq!(shown(&first), 50);
    assert!(first.body.contains(&ids[52].to_string()), "newest first");
    assert!(!first.body.contains(&ids[2].to_string()));
    let older = format!("/console/jobs?after={}", ids[3]);
    assert!(
        first.body.contains(&format!("href=\"{older}\"")),
        "{}",
        first.body
    );
    let second = console.get(&older, &session).await;
    assert_eq!(shown(&second), 3);
    assert!(!second.body.contains("Older jobs"));
    let none = console
        .get("/console/jobs?status=succeeded", &session)
        .await;
    assert_eq!(shown(&none), 0);
    assert!(none.body.contains("No jobs match."));
    assert!(none.body.contains("<option value=\"succeeded\" selected>"));
    let pending = console.get("/console/jobs?status=pending", &session).await;
    assert_eq!(shown(&pending), 50);
    assert!(pending
        .body
        .contains(&format!("href=\"{older}&amp;status=pending\"")));
    let by_id = console
        .get(&format!("/console/jobs?id={}", ids[7]), &session)
        .await;
    assert_eq!(by_id.location(), format!("/console/jobs/{}", ids[7]));
    let bad_id = console.get("/console/jobs?id=nope", &session).await;
    assert_eq!(bad_id.status, StatusCode::NOT_FOUND);
    let bad_query = console.get("/console/jobs?after=nope", &session).await;
    assert_eq!(bad_query.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cancel_needs_the_sessions_token_and_has_the_apis_semantics() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "later", true).await;
    let session = console.sign_in(&console.bob).await;
    let page = console.get(&format!("/console/jobs/{job}"), &session).await;
    assert!(page.body.contains("Cancel job"));
    let cancel = format!("/console/jobs/{job}/cancel");
    for fields in [
        "csrf=".to_owned(),
        format!("csrf={}", "0".repeat(64)),
        "x=1".to_owned(),
    ] {
        let refused = console.post(&cancel, &session, &fields).await;
        assert!(
            [StatusCode::FORBIDDEN, StatusCode::UNPROCESSABLE_ENTITY].contains(&refused.status),
            "{fields}: {}",
            refused.status
        );
    }
    // Without a session, even with a token of another session.
    let alice = console.sign_in(&console.alice).await;
    let alice_token = console.get("/console/jobs", &alice).await.csrf();
    let refused = console
        .post(&cancel, "", &format!("csrf={alice_token}"))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // Carol's own session and token: bob's job is not hers, confirmed or not.
    let carol = console
        .sign_in(
            &console
                .key_for("carol", durable_etl::service::api_keys::Role::Owner)
                .await,
        )
        .await;
    let carol_token = console.get("/console/jobs", &carol).await.csrf();
    for confirm in ["", "&confirm=yes"] {
        let not_hers = console
            .post(&cancel, &carol, &format!("csrf={carol_token}{confirm}"))
            .await;
        assert_eq!(not_hers.status, StatusCode::NOT_FOUND);
    }
    // The first POST asks to confirm and changes nothing.
    let asked = console
        .post(&cancel, &session, &format!("csrf={}", page.csrf()))
        .await;
    assert_eq!(asked.status, StatusCode::OK);
    assert!(
        asked.body.contains("This will cancel job"),
        "{}",
        asked.body
    );
    assert!(asked.body.contains("name=\"confirm\" value=\"yes\""));
    assert!(console
        .get(&format!("/console/jobs/{job}"), &session)
        .await
        .body
        .contains("pending"));
    let done = console
        .post(
            &cancel,
            &session,
            &format!("csrf={}&confirm=yes", page.csrf()),
        )
        .await;
    assert_eq!(
        (done.status, done.location()),
        (
            StatusCode::SEE_OTHER,
            format!("/console/jobs/{job}").as_str()
        )
    );
    let after = console.get(&format!("/console/jobs/{job}"), &session).await;
    assert!(after.body.contains("status-cancelled"));
    assert!(after.body.contains("Cancelled by its owner."));
    assert!(!after.body.contains("Cancel job"));
    // Cancelling again changes nothing.
    let again = console
        .post(
            &cancel,
            &session,
            &format!("csrf={}&confirm=yes", page.csrf()),
        )
        .await;
    assert_eq!(again.status, StatusCode::SEE_OTHER);
}

/// A cancel of a running job whose row another session holds, as its commit does while the
/// job's effects apply: the console answers at once and the job's page says that the cancel is
/// recorded and the job may still succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_commit_holds_the_job_says_it_may_still_succeed() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "committing", false).await;
    let client = console.db.client().await;
    let claimant = crate::support::stalled_claimant("committing", Duration::from_secs(60));
    let claimed = durable_etl::worker::claimer::claim(&client, claimant, 1)
        .await
        .unwrap();
    assert_eq!(claimed[0].id(), job);
    let holder = crate::support::hold_job_row(&console.db, job).await;
    let session = console.sign_in(&console.bob).await;
    let page = console.get(&format!("/console/jobs/{job}"), &session).await;
    assert!(!page.body.contains("may still succeed"));
    let done = console
        .post(
            &format!("/console/jobs/{job}/cancel"),
            &session,
            &format!("csrf={}&confirm=yes", page.csrf()),
        )
        .await;
    let shown = format!("/console/jobs/{job}?cancel=deferred");
    assert_eq!(
        (done.status, done.location()),
        (StatusCode::SEE_OTHER, shown.as_str())
    );
    let after = console.get(&shown, &session).await;
    assert!(after.body.contains("status-running"), "{}", after.body);
    assert!(
        after.body.contains("which may still succeed"),
        "{}",
        after.body
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    drop(claimed);
}

#[tokio::test]
async fn sign_out_needs_the_token_and_clears_the_cookie() {
    let console = Console::start().await;
    let session = console.sign_in(&console.bob).await;
    let page = console.get("/console/jobs", &session).await;
    let forged = console.post("/console/sign-out", &session, "csrf=x").await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    // A session signed out long ago, whose cookie has expired since: the next sign-out purges it.
    let client = console.db.client().await;
    client
        .execute(
            "INSERT INTO etl_console_ended_sessions (session_id, expires_at)
             VALUES (gen_random_uuid(), now() - interval '1 second')",
            &[],
        )
        .await
        .unwrap();
    let token = format!("csrf={}", page.csrf());
    let out = console.post("/console/sign-out", &session, &token).await;
    assert_eq!(
        (out.status, out.location()),
        (StatusCode::SEE_OTHER, "/console/sign-in")
    );
    assert_eq!(out.cookie("detl_session").as_deref(), Some(""));
    // A copy of the cookie taken before the sign-out is refused from then on: the session ended
    // on the server, not only in the browser.
    let replayed = console.get("/console/jobs", &session).await;
    assert_eq!(
        (replayed.status, replayed.location()),
        (StatusCode::SEE_OTHER, "/console/sign-in?ended=1"),
        "a signed-out session's cookie replayed"
    );
    let again = console.post("/console/sign-out", &session, &token).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "its forms too");
    assert_eq!(
        crate::support::count(&client, "etl_console_ended_sessions").await,
        1,
        "this session's row only: the expired one was purged, the refused form wrote none"
    );
    assert_eq!(
        crate::support::count(
            &client,
            "etl_console_ended_sessions WHERE expires_at > now() + interval '29 minutes'"
        )
        .await,
        1,
        "kept until the cookie's own expiry"
    );
    // Another session of the same key lives on.
    let other = console.sign_in(&console.bob).await;
    assert_eq!(
        console.get("/console/jobs", &other).await.status,
        StatusCode::OK
    );
    let css = console.get("/console/console.css", "").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    let root = console.get("/console", "").await;
    assert_eq!(root.location(), "/console/jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_view_shows_reporting_replicas_and_the_last_hour_to_operators_only() {
    let console = Console::start().await;
    let replica = console.replica("rep-1").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            console
                .submit(&console.bob, &format!("ok-{i}"), false)
                .await,
        );
    }
    // One that fails: its record does not cast.
    let failing = json!({"dataset": "d", "key": "id", "records": [{"id": 1, "n": "abc"}],
                         "transform": {"cast": {"n": "integer"}}});
    let response = console
        .http
        .post(format!("{}/v1/etl-jobs", console.base))
        .bearer_auth(&console.bob)
        .header("Idempotency-Key", "bad")
        .json(&failing)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let client = console.db.client().await;
    crate::support::eventually("the report of four ended jobs", || async {
        crate::support::count(
            &client,
            "etl_replica_minutes WHERE owner_id = 'rep-1' AND succeeded = 3 AND failed = 1",
        )
        .await
            == 1
    })
    .await;
    let alice = console.sign_in(&console.alice).await;
    let view = console.get("/console/operator", &alice).await;
    assert_eq!(view.status, StatusCode::OK);
    assert_secured(&view);
    assert!(view.body.contains("<code>rep-1</code>"));
    assert_eq!(view.body.matches("<svg").count(), 6);
    // Per-minute time series: succeeded and failed by queue, and failures by code.
    for legend in [
        "Jobs succeeded per minute by queue: <span class=\"series series-0\">default 3 in the hour, at most 3 jobs a minute",
        "Jobs failed per minute by queue: <span class=\"series series-0\">default 1 in the hour, at most 1 jobs a minute",
        "record_invalid 1 in the hour, at most 1 jobs a minute",
    ] {
        assert!(view.body.contains(legend), "{legend}: {}", view.body);
    }
    assert!(view.body.contains(">now</text>") && view.body.contains(">59 minutes ago</text>"));
    assert!(view.body.contains("<code>record_invalid</code>"));
    assert!(
        view.body
            .contains("<a href=\"/console/failures/record_invalid\">"),
        "a failure code leads to its jobs"
    );
    assert!(view.body.contains("<dt>Due</dt><dd>0</dd>"));
    for id in &ids {
        assert!(!view.body.contains(&id.to_string()), "aggregates only");
    }
    for secret in [CANARY, "bob", console.bob.as_str()] {
        assert!(!view.body.contains(secret), "{secret}");
    }
    let bob = console.sign_in(&console.bob).await;
    assert_eq!(
        console.get("/console/operator", &bob).await.status,
        StatusCode::NOT_FOUND
    );
    replica.stop().await;
    assert_eq!(
        crate::support::count(&client, "etl_replicas").await,
        0,
        "a stopped replica deletes its row"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_view_has_empty_states_and_lists_recovery_events() {
    let console = Console::start().await;
    let alice = console.sign_in(&console.alice).await;
    let empty = console.get("/console/operator", &alice).await;
    assert_eq!(empty.status, StatusCode::OK);
    for state in [
        "No replica has reported in the last hour.",
        "No job failed in the last hour.",
        "No job was recovered in the last hour.",
    ] {
        assert!(empty.body.contains(state), "{state}");
    }
    assert_eq!(empty.body.matches("<svg").count(), 6, "empty charts");
    assert_eq!(empty.body.matches("nothing in this hour").count(), 4);
    assert_eq!(
        empty.body.matches("no data in this hour").count(),
        2,
        "no latency and no backlog without a report, not zeros"
    );

    // A replica that died holding a job: its lease has already expired.
    let job = console.submit(&console.bob, "orphan", false).await;
    let client = console.db.client().await;
    let claimant = crate::support::stalled_claimant("gone", Duration::from_millis(1));
    let claimed = durable_etl::worker::claimer::claim(&client, claimant, 1)
        .await
        .unwrap();
    assert_eq!(claimed[0].ctx.id, job);
    let replica = console.replica("rescuer").await;
    crate::support::eventually("the report of a recovered job", || async {
        crate::support::count(
            &client,
            "etl_replica_minutes WHERE owner_id = 'rescuer' AND recovered = 1 AND succeeded = 1",
        )
        .await
            == 1
    })
    .await;
    let view = console.get("/console/operator", &alice).await;
    replica.stop().await;
    assert!(
        view.body
            .contains("<td><code>rescuer</code></td><td>1</td></tr>"),
        "{}",
        view.body
    );
    assert!(!view.body.contains("No job was recovered"));
    assert!(!view.body.contains(&job.to_string()), "aggregates only");
}

#[tokio::test]
async fn the_operator_view_lists_each_queue_with_its_cap_and_pause() {
    let console = Console::start().await;
    let client = console.db.client().await;
    console.submit(&console.bob, "queued-1", false).await;
    console.submit(&console.bob, "queued-2", true).await;
    durable_etl::queue::set_cap(&client, "default", Some(4))
        .await
        .unwrap();
    durable_etl::queue::set_paused(&client, "mail", true)
        .await
        .unwrap();
    let alice = console.sign_in(&console.alice).await;
    let view = console.get("/console/operator", &alice).await;
    assert_eq!(view.status, StatusCode::OK);
    let body = &view.body;
    assert!(
        body.contains(
            "<td><a href=\"/console/queues/default\"><code>default</code></a></td>\
             <td>1</td><td class=\"unserved\">1</td><td>1</td><td>0</td>"
        ),
        "{body}"
    );
    assert!(body.contains("0 of 4 held"), "{body}");
    assert!(
        body.contains("<code>mail</code></a></td><td>0</td><td>0</td>"),
        "{body}"
    );
    assert!(body.contains("<td>paused</td>"), "{body}");
    // The queues page is job metadata only.
    assert!(
        !body.contains(CANARY) && !body.contains("queued-1"),
        "{body}"
    );
}

/// The schedules pages show the viewer's schedules (and none of another owner's), pause and
/// resume them only with the session's token, and show a schedule's fires linking to its jobs.
#[tokio::test]
async fn the_schedules_pages_show_and_switch_only_the_viewers_schedules() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let alice = console.sign_in(&console.alice).await;
    let bob = console.sign_in(&console.bob).await;
    let body = json!({"cron": "0 6 * * *", "request":
        {"dataset": "d", "key": "id", "records": [{"id": 1, "note": CANARY}]}});
    let stored = console
        .http
        .put(format!("{}/v1/schedules/morning", console.base))
        .bearer_auth(&console.alice)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), StatusCode::OK);
    // A fire already made, so the page links a job.
    client
        .execute(
            "UPDATE etl_schedules SET next_fire_at = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let mut fire = console.db.client().await;
    assert_eq!(
        durable_etl::worker::scheduler::fire_due(&mut fire)
            .await
            .unwrap()
            .jobs,
        1
    );

    let list = console.get("/console/schedules", &alice).await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(list.body.contains("href=\"/console/schedules/morning\""));
    assert!(list.body.contains("<code>0 6 * * *</code>") && list.body.contains("active"));
    let page = console.get("/console/schedules/morning", &alice).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("enqueued") && page.body.contains("href=\"/console/jobs/"));
    for body in [&list.body, &page.body] {
        assert!(!body.contains(CANARY), "no argument of a schedule is shown");
    }
    // Bob sees none of it and can change none of it.
    let theirs = console.get("/console/schedules", &bob).await;
    assert!(!theirs.body.contains("morning") && theirs.body.contains("No schedules"));
    let not_theirs = console.get("/console/schedules/morning", &bob).await;
    assert_eq!(not_theirs.status, StatusCode::NOT_FOUND);
    let token = theirs.csrf();
    let refused = console
        .post(
            "/console/schedules/morning/pause",
            &bob,
            &format!("csrf={token}"),
        )
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    // Without the session's token, nothing changes.
    let forged = console
        .post("/console/schedules/morning/pause", &alice, "csrf=forged")
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(!schedule_paused(&client).await);
    let token = list.csrf();
    let done = console
        .post(
            "/console/schedules/morning/pause",
            &alice,
            &format!("csrf={token}"),
        )
        .await;
    assert_eq!(
        (done.status, done.location()),
        (StatusCode::SEE_OTHER, "/console/schedules")
    );
    assert!(schedule_paused(&client).await);
    assert!(console
        .get("/console/schedules", &alice)
        .await
        .body
        .contains("Resume"));
    let done = console
        .post(
            "/console/schedules/morning/resume",
            &alice,
            &format!("csrf={token}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert!(!schedule_paused(&client).await);
}

/// The operators' page lists every owner's schedules, overdue ones first, with each one's last
/// fire and its lateness, and counts the paused and the overdue; it names no owner, shows no
/// argument and links to no job, and is no other key's.
#[tokio::test]
async fn operators_see_every_owners_schedules_and_which_are_overdue_but_not_whose() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let alice = console.sign_in(&console.alice).await;
    let bob = console.sign_in(&console.bob).await;
    let body = json!({"cron": "0 6 * * *", "request":
        {"dataset": "d", "key": "id", "records": [{"id": 1, "note": CANARY}]}});
    for (key, name) in [
        (&console.alice, "morning"),
        (&console.alice, "quiet"),
        (&console.bob, "stuck"),
        (&console.bob, "evening"),
    ] {
        let stored = console
            .http
            .put(format!("{}/v1/schedules/{name}", console.base))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(stored.status(), StatusCode::OK);
    }
    client
        .batch_execute(
            "UPDATE etl_schedules SET next_fire_at = clock_timestamp() - interval '20 ms'
              WHERE name = 'morning';
             UPDATE etl_schedules SET paused = true WHERE name = 'quiet';",
        )
        .await
        .unwrap();
    let mut fire = console.db.client().await;
    let fired = durable_etl::worker::scheduler::fire_due(&mut fire)
        .await
        .unwrap();
    assert_eq!(fired.jobs, 1);
    // Bob's `stuck` should have fired a minute ago: no replica fires it.
    client
        .execute(
            "UPDATE etl_schedules SET next_fire_at = now() - interval '1 minute'
              WHERE name = 'stuck'",
            &[],
        )
        .await
        .unwrap();
    let page = console.get("/console/operator/schedules", &alice).await;
    assert_eq!(page.status, StatusCode::OK);
    let body = &page.body;
    assert!(
        body.contains("4 schedules of every owner, 1 paused, 1 overdue"),
        "{body}"
    );
    let at = |name: &str| {
        body.find(&format!("<td>{name}</td>"))
            .unwrap_or_else(|| panic!("{name}: {body}"))
    };
    assert!(at("stuck") < at("morning"), "overdue first: {body}");
    assert!(at("evening") < at("quiet"), "paused last: {body}");
    assert!(
        body.contains("(enqueued)") && body.contains(" ms</td>"),
        "{body}"
    );
    assert!(body.contains("<td>overdue</td>") && body.contains("<td>paused</td>"));
    assert!(!body.contains(CANARY), "no argument is shown");
    assert!(
        !body.contains("href=\"/console/jobs/"),
        "no owner's job is linked"
    );
    let owners: Vec<Vec<u8>> =
        crate::support::first_column(&client, "SELECT DISTINCT owner_key FROM etl_schedules").await;
    for owner in owners {
        let hex: String = owner.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!body.contains(&hex[..12]), "no owner digest is shown");
    }
    assert!(console
        .get("/console/jobs", &alice)
        .await
        .body
        .contains("href=\"/console/operator/schedules\""));
    // Not bob's (no operator), and nobody's without a session.
    let refused = console.get("/console/operator/schedules", &bob).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    assert!(!refused.body.contains("stuck"));
    let anonymous = console.get("/console/operator/schedules", "").await;
    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
    // The owner's own page shows each fire's lateness.
    let own = console.get("/console/schedules/morning", &alice).await;
    assert!(
        own.body.contains("Lateness") && own.body.contains(" ms</td>"),
        "{}",
        own.body
    );
}

/// Whether the one schedule is paused.
async fn schedule_paused(client: &tokio_postgres::Client) -> bool {
    client
        .query_one("SELECT paused FROM etl_schedules", &[])
        .await
        .unwrap()
        .get(0)
}
