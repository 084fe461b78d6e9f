//! The console's pages, server time: the whole app (`durable_etl::app`, every layer) driven in
//! process with `tower::ServiceExt::oneshot`, no socket, from the request to the last byte of the
//! rendered page, with a history of [`FEW`] ended jobs and of 1,000,000, all of them the
//! signed-in owner's own (UUIDv7 ids, one every 20 ms, two days old). Timed pages:
//!
//! - `operator`: the operator page (`GET /console/operator`), as an operator key. It reads the
//!   replicas' reports and backlog rows (migrations 0011 and 0038) and the active-job sample,
//!   never the history. Target (#17): under 50 ms with 1,000,000 ended jobs.
//! - `list`: the owner's job list, first page (`/console/jobs`, 50 jobs and a next-page link).
//! - `succeeded`: the list of one ended status (`/console/jobs?status=succeeded`).
//! - `window`: a one-second submission window around the middle job of the history
//!   (`/console/jobs?from=..&to=..`, 50 jobs, half the history newer than it).
//! - `job`: the middle job's page (`/console/jobs/{id}`), with three attempts in its history.
//!
//! Each owner page shows the same at both sizes: its time should not grow with the history.
//! Both sizes also hold the same recent activity, filled outside the timed region: a backlog of
//! due, deferred and running jobs, failed jobs that ended within the last hour, and
//! [`REPLICAS`] live replicas with two hours of minute reports and backlog rows (all the reports
//! keep). Every request carries the session cookie of its key, signed in once through the
//! sign-in form; each page is checked once, before it is timed, to answer `200` and show what it
//! should.
// `criterion_group!` and `criterion_main!` generate functions that cannot carry doc comments.
// A bench aborts on a failed setup step: `expect` names the step.
#![allow(
    missing_docs,
    clippy::missing_docs_in_private_items,
    clippy::expect_used
)]

mod common;

use axum::body::{self, Body};
use axum::http::{header, Request, Response, StatusCode};
use axum::Router;
use chrono::DateTime;
use common::history::{add_owned_history, HISTORY, SPACING_MS};
use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use durable_etl::config::ApiConfig;
use durable_etl::db::Pool;
use durable_etl::digest::{DigestKind, Secret};
use durable_etl::service::api_keys::{self, Role};
use durable_etl::service::{self, AppState};
use durable_etl::worker::claimer::{self, Claimant};
use std::time::Duration;
use tower::ServiceExt;
use uuid::Uuid;

/// The bench's digest secret.
const SECRET: &str = "console-bench-secret-0123456789";

/// Live replicas reporting.
const REPLICAS: i64 = 4;

/// Active jobs in the backlog: a tenth of them running, a tenth deferred, the rest due.
const LIVE: usize = 1_000;

/// Jobs that ended failed within the last hour.
const RECENT_FAILURES: i64 = 30;

/// The owner whose history the owner pages show.
const OWNER: &str = "console-bench-owner";

/// The smaller history: the fewest ended jobs that fill every owner page as the larger one does
/// (a full first page and a next one, and a whole second of 50 jobs around the middle job).
const FEW: i64 = 100;

/// Job rows of a full page of the list.
const PAGE_ROWS: usize = 50;

/// Job rows of a one-second submission window (the history's jobs are [`SPACING_MS`] apart).
const WINDOW_ROWS: usize = (1000 / SPACING_MS) as usize;

/// What marks a job row (a link to the job's page) in a page.
const JOB_ROW: &str = "class=\"id\" href=\"/console/jobs/";

/// The largest page body read, in bytes.
const BODY_LIMIT: usize = 1 << 20;

/// The value that response `response` sets cookie `name` to.
fn set_cookie(response: &Response<Body>, name: &str) -> String {
    response
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.split(';').next())
        .expect("cookie set")
        .to_owned()
}

/// `request` sent to `app`; its status and body.
async fn send(app: &Router, request: Request<Body>) -> (Response<Body>, String) {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = body::to_bytes(body, BODY_LIMIT).await.expect("body");
    let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
    (Response::from_parts(parts, Body::empty()), text)
}

/// Signs in to `app` with `key` through the sign-in form, as a browser does; returns the
/// session's `Cookie` header.
async fn sign_in(app: &Router, key: &str) -> String {
    let form = Request::get("/console/sign-in")
        .body(Body::empty())
        .expect("request");
    let (form, page) = send(app, form).await;
    assert_eq!(form.status(), StatusCode::OK, "sign-in form");
    let nonce = set_cookie(&form, "detl_sign_in");
    let field = "name=\"csrf\" value=\"";
    let at = page.find(field).expect("csrf field") + field.len();
    let csrf = &page[at..at + page[at..].find('"').expect("csrf value")];
    let post = Request::post("/console/sign-in")
        .header(header::COOKIE, format!("detl_sign_in={nonce}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("api_key={key}&csrf={csrf}")))
        .expect("request");
    let (signed, _) = send(app, post).await;
    assert_eq!(signed.status(), StatusCode::SEE_OTHER, "sign-in");
    format!("detl_session={}", set_cookie(&signed, "detl_session"))
}

/// A page the bench times, and what it must show.
struct Page<'a> {
    /// Its name in the benchmark id.
    name: &'static str,
    /// Its path and query.
    uri: String,
    /// The session cookie it is read with.
    cookie: &'a str,
    /// How many job rows it shows.
    rows: usize,
    /// Texts it shows.
    shows: Vec<String>,
}

impl<'a> Page<'a> {
    /// Page `name` at `uri`, read with `cookie`, showing `rows` job rows.
    fn new(name: &'static str, uri: &str, cookie: &'a str, rows: usize) -> Page<'a> {
        Page {
            name,
            uri: uri.to_owned(),
            cookie,
            rows,
            shows: Vec::new(),
        }
    }

    /// This page, showing `texts` too.
    fn showing(self, texts: &[&str]) -> Page<'a> {
        let shows = texts.iter().map(|text| (*text).to_owned()).collect();
        Page { shows, ..self }
    }

    /// Its request.
    fn request(&self) -> Request<Body> {
        Request::get(self.uri.as_str())
            .header(header::COOKIE, self.cookie)
            .body(Body::empty())
            .expect("request")
    }

    /// Asserts that it answers `200` and shows what it should: a bench that timed a redirect to
    /// sign-in, an error or an empty list would time nothing useful.
    async fn check(&self, app: &Router) {
        let (response, body) = send(app, self.request()).await;
        assert_eq!(response.status(), StatusCode::OK, "{}", self.uri);
        assert_eq!(
            body.matches(JOB_ROW).count(),
            self.rows,
            "{} rows",
            self.uri
        );
        for text in &self.shows {
            assert!(body.contains(text.as_str()), "{} shows {text}", self.uri);
        }
    }
}

/// The middle job of `owner_key`'s history of `ended` jobs, given three attempts that did not
/// end it (retried, recovered, released) before the one that succeeded.
async fn middle_job(db: &BenchDb, owner_key: &[u8], ended: i64) -> Uuid {
    let id: Uuid = db
        .client
        .query_one(
            "SELECT id FROM etl_job_intake WHERE owner_key = $1 ORDER BY id OFFSET $2 LIMIT 1",
            &[&owner_key, &(ended / 2)],
        )
        .await
        .expect("middle job")
        .get(0);
    db.client
        .execute(
            "WITH job AS (
                 SELECT id, created_at AS at FROM etl_job_intake WHERE id = $1
             ), attempts AS (
                 INSERT INTO etl_job_attempts (job_id, attempt, started_at, ended_at, ending, due_at)
                 SELECT id, a, at + a * interval '1 second', at + (a + 0.5) * interval '1 second',
                        ending, at + (a + 0.5 + wait) * interval '1 second'
                   FROM job, (VALUES (1, 'retried', 0.25), (2, 'recovered', 0),
                                     (3, 'released', 0)) v(a, ending, wait)
             )
             UPDATE etl_job_outcomes o
                SET attempts = 3, started_at = at + interval '4 seconds',
                    finished_at = at + interval '4.5 seconds'
               FROM job
              WHERE o.job_id = job.id",
            &[&id],
        )
        .await
        .expect("attempts");
    id
}

/// The one-second submission window, in the job list's query, that holds job `id`: the
/// millisecond its UUIDv7 begins with, to the second.
fn window_of(id: Uuid) -> String {
    let millis = i64::try_from(id.as_u128() >> 80).expect("millisecond");
    let from = DateTime::from_timestamp(millis.div_euclid(1000), 0).expect("time");
    let to = from + Duration::from_secs(1);
    let field = "%Y-%m-%dT%H:%M:%S";
    format!("from={}&to={}", from.format(field), to.format(field))
}

/// The recent activity the page aggregates: [`LIVE`] active jobs (due, deferred, running),
/// [`RECENT_FAILURES`] jobs failed within the last hour, and [`REPLICAS`] replicas' reports of
/// the last two hours; then analyzes the tables.
async fn add_activity(db: &BenchDb, pool: &Pool) {
    db.fill(LIVE).await;
    let conn = pool.get().await.expect("conn");
    let claimant = Claimant {
        owner_id: "console-bench-0",
        owner_locked: false,
        lease: Duration::from_secs(3600),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: &["noop"],
    };
    let running = claimer::claim(&*conn, claimant, LIVE / 10)
        .await
        .expect("claim");
    assert_eq!(running.len(), LIVE / 10);
    db.client
        .batch_execute(&format!(
            "UPDATE etl_job_records SET run_at = now() + interval '1 hour', sort_at = now() + interval '1 hour'
              WHERE id IN (SELECT id FROM etl_job_records WHERE status = 'pending' LIMIT {deferred});

             WITH ids AS (
                 SELECT gen_random_uuid() AS id, g FROM generate_series(1, {RECENT_FAILURES}) g
             ), intake AS (
                 INSERT INTO etl_job_intake
                        (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                         max_attempts, run_at, created_at)
                 SELECT id, sha256('recent'::bytea), sha256(id::text::bytea),
                        sha256(g::text::bytea), 'noop', 5, now() - g * interval '1 minute',
                        now() - g * interval '1 minute'
                   FROM ids
             )
             INSERT INTO etl_job_outcomes
                    (job_id, owner_key, status, attempts, run_at, failure_code, started_at,
                     finished_at)
             SELECT id, sha256('recent'::bytea), 'failed', 5, now() - g * interval '1 minute',
                    CASE WHEN g % 3 = 0 THEN 'record_invalid' ELSE 'handler_failed' END,
                    now() - g * interval '1 minute', now() - g * interval '1 minute' + interval '1 second'
               FROM ids;

             TRUNCATE etl_replicas, etl_replica_minutes, etl_backlog_minutes;
             INSERT INTO etl_replicas
                    (owner_id, incarnation, started_at, reported_at, held, claimed, claim_rate)
             SELECT 'console-bench-' || r, md5('console-bench-' || r)::uuid,
                    now() - interval '3 hours', now(), 25, 100000 * r, 150.0
               FROM generate_series(0, {REPLICAS} - 1) r;
             INSERT INTO etl_replica_minutes
                    (minute, owner_id, incarnation, started_at, succeeded, failed, failed_by_code,
                     recovered, pickups, pickup_seconds, by_queue, pickup_buckets)
             SELECT date_trunc('minute', now()) - m * interval '1 minute', 'console-bench-' || r,
                    md5('console-bench-' || r)::uuid, now() - interval '3 hours', (120 - m) * 600, (120 - m) * 2,
                    jsonb_build_object('handler_failed', 120 - m, 'record_invalid', 120 - m),
                    (120 - m) / 10, (120 - m) * 600, (120 - m) * 600 * 0.0007,
                    (SELECT jsonb_object_agg('queue_' || q, jsonb_build_array((120 - m) * 100, 120 - m))
                       FROM generate_series(1, 6) q),
                    (SELECT array_agg((120 - m) * 40 * (b % 4)) FROM generate_series(0, 14) b)
               FROM generate_series(0, {REPLICAS} - 1) r, generate_series(0, 119) m;
             INSERT INTO etl_backlog_minutes (minute, due, deferred, running, by_queue)
             SELECT date_trunc('minute', now()) - m * interval '1 minute', 1000 + m, 100, 25,
                    (SELECT jsonb_object_agg('queue_' || q, jsonb_build_array(100, 10, 4))
                       FROM generate_series(1, 20) q)
               FROM generate_series(0, 119) m;

             ANALYZE etl_job_intake, etl_job_outcomes, etl_job_records, etl_job_attempts,
                     etl_replicas, etl_replica_minutes, etl_backlog_minutes",
            deferred = LIVE / 10,
        ))
        .await
        .expect("activity");
}

/// Every page, with [`FEW`] and [`HISTORY`] ended jobs of the owner.
fn pages(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_console");
    let pool = rt.block_on(db.pool(4));
    let secret = Secret::new(SECRET).expect("secret");
    let owner_key = secret.digest(DigestKind::Principal, OWNER.as_bytes());
    let (operator_key, key) = rt.block_on(async {
        let operator = api_keys::create_as(&db.client, &secret, "operator", Role::Operator);
        let owner = api_keys::create(&db.client, &secret, OWNER);
        (
            operator.await.expect("key").key,
            owner.await.expect("key").key,
        )
    });
    let app = service::app(AppState::new(pool.clone(), secret, ApiConfig::default()));
    let operator_cookie = rt.block_on(sign_in(&app, &operator_key));
    let cookie = rt.block_on(sign_in(&app, &key));
    let mut group = c.benchmark_group("console_pages");
    for ended in [FEW, HISTORY] {
        let middle = rt.block_on(async {
            db.reset().await;
            add_owned_history(&db, ended, &owner_key).await;
            let middle = middle_job(&db, &owner_key, ended).await;
            add_activity(&db, &pool).await;
            middle
        });
        let (id, window) = (middle.to_string(), window_of(middle));
        let pages = [
            Page::new("operator", "/console/operator", &operator_cookie, 0)
                .showing(&["console-bench-0", "handler_failed"]),
            Page::new("list", "/console/jobs", &cookie, PAGE_ROWS).showing(&["Older jobs"]),
            Page::new(
                "succeeded",
                "/console/jobs?status=succeeded",
                &cookie,
                PAGE_ROWS,
            )
            .showing(&["Older jobs"]),
            Page::new(
                "window",
                &format!("/console/jobs?{window}"),
                &cookie,
                WINDOW_ROWS,
            )
            .showing(&[&id]),
            Page::new("job", &format!("/console/jobs/{id}"), &cookie, 0).showing(&[
                &id,
                "failed transiently",
                "recovered after",
                "released as",
            ]),
        ];
        for page in pages {
            rt.block_on(page.check(&app));
            group.bench_with_input(BenchmarkId::new(page.name, ended), &ended, |b, _| {
                b.to_async(&rt)
                    .iter(|| async { send(&app, page.request()).await });
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = pages
}
criterion_main!(benches);
