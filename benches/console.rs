//! The console's operator page (`GET /console/operator`), server time: the whole app
//! (`durable_etl::app`, every layer) driven in process with `tower::ServiceExt::oneshot`, no
//! socket, from the request to the last byte of the rendered page, with an empty history and
//! with 1,000,000 ended jobs (two days old, as the retention runbook leaves them). The page reads
//! the replicas' reports (migration 0011) and the active-job sample, never the history: its time
//! should not grow with it. Target (#17): under 50 ms with 1,000,000 ended jobs.
//!
//! Both sizes also hold the same recent activity, filled outside the timed region: a backlog of
//! due, deferred and running jobs, failed jobs that ended within the last hour, and
//! [`REPLICAS`] live replicas with two hours of minute reports (all the reporter keeps). Every
//! request carries the session cookie of an operator key, signed in once through the sign-in
//! form; the page is checked to answer `200` before it is timed.
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
use common::history::{add_history, HISTORY};
use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use durable_etl::api::{self, AppState};
use durable_etl::api_keys::{self, Role};
use durable_etl::config::ApiConfig;
use durable_etl::db::Pool;
use durable_etl::digest::Secret;
use durable_etl::worker::claimer::{self, Claimant};
use std::time::Duration;
use tower::ServiceExt;

/// The bench's digest secret.
const SECRET: &str = "console-bench-secret-0123456789";

/// Live replicas reporting.
const REPLICAS: i64 = 4;

/// Active jobs in the backlog: a tenth of them running, a tenth deferred, the rest due.
const LIVE: usize = 1_000;

/// Jobs that ended failed within the last hour.
const RECENT_FAILURES: i64 = 30;

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

/// The operator page's request with `cookie`.
fn operator_page(cookie: &str) -> Request<Body> {
    Request::get("/console/operator")
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .expect("request")
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
    };
    let running = claimer::claim(&*conn, claimant, LIVE / 10)
        .await
        .expect("claim");
    assert_eq!(running.len(), LIVE / 10);
    db.client
        .batch_execute(&format!(
            "UPDATE etl_job_records SET run_at = now() + interval '1 hour'
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

             TRUNCATE etl_replicas, etl_replica_minutes;
             INSERT INTO etl_replicas (owner_id, started_at, reported_at, held, claimed, claim_rate)
             SELECT 'console-bench-' || r, now() - interval '3 hours', now(), 25, 100000 * r, 150.0
               FROM generate_series(0, {REPLICAS} - 1) r;
             INSERT INTO etl_replica_minutes
                    (minute, owner_id, started_at, succeeded, failed, failed_by_code, recovered,
                     pickups, pickup_seconds)
             SELECT date_trunc('minute', now()) - m * interval '1 minute', 'console-bench-' || r,
                    now() - interval '3 hours', (120 - m) * 600, (120 - m) * 2,
                    jsonb_build_object('handler_failed', 120 - m, 'record_invalid', 120 - m),
                    (120 - m) / 10, (120 - m) * 600, (120 - m) * 600 * 0.0007
               FROM generate_series(0, {REPLICAS} - 1) r, generate_series(0, 119) m;

             ANALYZE etl_job_intake, etl_job_outcomes, etl_job_records, etl_replicas,
                     etl_replica_minutes",
            deferred = LIVE / 10,
        ))
        .await
        .expect("activity");
}

/// `GET /console/operator` as an operator, with no history and with [`HISTORY`] ended jobs.
fn operator(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_console");
    let pool = rt.block_on(db.pool(4));
    let secret = Secret::new(SECRET).expect("secret");
    let key = rt.block_on(async {
        api_keys::create_as(&db.client, &secret, "operator", Role::Operator)
            .await
            .expect("key")
            .key
    });
    let app = api::app(AppState::new(pool.clone(), secret, ApiConfig::default()));
    let cookie = rt.block_on(sign_in(&app, &key));
    let mut group = c.benchmark_group("operator_page");
    for ended in [0, HISTORY] {
        rt.block_on(async {
            db.reset().await;
            add_history(&db, ended).await;
            add_activity(&db, &pool).await;
            // A bench that timed a redirect to sign-in, or an error, would time nothing useful.
            let (page, body) = send(&app, operator_page(&cookie)).await;
            assert_eq!(page.status(), StatusCode::OK, "operator page");
            assert!(body.contains("console-bench-0"), "a replica shown");
            assert!(
                body.contains("handler_failed"),
                "failures of the last hour shown"
            );
        });
        group.bench_with_input(BenchmarkId::from_parameter(ended), &ended, |b, _| {
            b.to_async(&rt)
                .iter(|| async { send(&app, operator_page(&cookie)).await });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = operator
}
criterion_main!(benches);
