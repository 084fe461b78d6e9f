//! The console's privacy, proven with canaries: an owner whose principal, idempotency keys,
//! payloads and record values are canaries runs jobs to every state a page shows (succeeded,
//! failed on a record, waiting to retry, cancelled, deferred), then every console page and form
//! answer, and its HTML source and headers, are searched for the canaries, the key, our SQL and
//! PostgreSQL's error texts.

use crate::console::{Console, Page};
use crate::privacy::leak;
use crate::support::{count, eventually};
use durable_etl::service::api_keys::Role;
use durable_etl::worker::completer::{self, Transition};
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

/// The canary owner's principal.
const PRINCIPAL: &str = "canary-principal-console";

/// What a page leaks, if anything: a forbidden string of the privacy test's list (the HTML
/// element `<select` is not SQL, so it is renamed before the search), the key, or a header that
/// carries either.
fn page_leak(page: &Page, key: &str) -> Option<String> {
    let body = page
        .body
        .replace("<select ", "<choice ")
        .replace("</select>", "</choice>");
    if let Some(found) = leak(&body) {
        return Some(found.to_owned());
    }
    if page.body.contains(key) {
        return Some("the API key".to_owned());
    }
    page.headers.iter().find_map(|(name, value)| {
        let value = value.to_str().unwrap_or_default();
        (value.contains(key) || value.to_lowercase().contains("canary"))
            .then(|| format!("header {name}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_console_page_or_form_answer_leaks_a_canary_the_key_sql_or_a_database_message() {
    let console = Console::start().await;
    let key = console.key_for(PRINCIPAL, Role::Operator).await;
    let client = console.db.client().await;
    let records = |value: &str| json!([{"id": 1, "n": value}]);
    let plain = |value: &str| json!({"dataset": "d", "key": "id", "records": records(value)});
    let succeeded = console
        .submit_body(&key, "canary-idem-ok", &plain("canary-value-ok"))
        .await;
    let failing = json!({"dataset": "d", "key": "id", "records": records("canary-value-bad"),
                         "transform": {"cast": {"n": "integer"}}});
    let failed = console.submit_body(&key, "canary-idem-bad", &failing).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut deferred_body = plain("canary-value-deferred");
    deferred_body["run_at"] = json!(later);
    let deferred = console
        .submit_body(&key, "canary-idem-deferred", &deferred_body)
        .await;
    deferred_body["run_at"] = json!((chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339());
    let cancelled = console
        .submit_body(&key, "canary-idem-cancel", &deferred_body)
        .await;

    // A replica runs the due jobs and reports them for the operator view.
    let replica = console.replica("privacy-console").await;
    eventually("both due jobs reported ended", || async {
        count(
            &client,
            "etl_replica_minutes WHERE succeeded = 1 AND failed = 1",
        )
        .await
            == 1
    })
    .await;
    replica.stop().await;

    // One job waits to retry after a transient failure.
    let retrying = console
        .submit_body(&key, "canary-idem-retry", &plain("canary-value-retry"))
        .await;
    let lease = crate::console_history::claim(&client).await;
    assert_eq!(lease.job_id, retrying);
    let retried = completer::retry(&client, lease, Duration::from_secs(3600)).await;
    assert_eq!(retried.unwrap(), Transition::Retried);

    let mut pages = Vec::new();
    pages.push(("sign-in", console.get("/console/sign-in", "").await));
    let refused = console.post_sign_in("canary-not-a-key").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    pages.push(("refused sign-in", refused));
    let signed = console.post_sign_in(&key).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    let session = format!("detl_session={}", signed.cookie("detl_session").unwrap());
    pages.push(("signed in", signed));

    let list = console.get("/console/jobs", &session).await;
    let token = list.csrf();
    let cancel = format!("/console/jobs/{cancelled}/cancel");
    let forged = console.post(&cancel, &session, "csrf=canary-token").await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    pages.push(("forged cancel", forged));
    let asked = console
        .post(&cancel, &session, &format!("csrf={token}"))
        .await;
    assert_eq!(asked.status, StatusCode::OK);
    pages.push(("cancel confirmation", asked));
    let done = console
        .post(&cancel, &session, &format!("csrf={token}&confirm=yes"))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    pages.push(("cancel", done));
    pages.push(("list", list));
    let job_pages = [succeeded, failed, deferred, cancelled, retrying];
    for (path, status) in [
        ("/console/jobs?status=failed".to_owned(), StatusCode::OK),
        (
            "/console/jobs?status=pending&from=2000-01-01T00:00".to_owned(),
            StatusCode::OK,
        ),
        (
            "/console/jobs?to=canary-time".to_owned(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/console/jobs?id=canary-id".to_owned(),
            StatusCode::NOT_FOUND,
        ),
        ("/console/jobs/canary-id".to_owned(), StatusCode::NOT_FOUND),
        (
            format!("/console/jobs/{}", Uuid::now_v7()),
            StatusCode::NOT_FOUND,
        ),
        ("/console/operator".to_owned(), StatusCode::OK),
        ("/console/queues".to_owned(), StatusCode::OK),
        ("/console/queues/default".to_owned(), StatusCode::OK),
        ("/console/queues/canary".to_owned(), StatusCode::NOT_FOUND),
        (
            "/console/failures/record_invalid".to_owned(),
            StatusCode::OK,
        ),
        ("/console/failures/canary".to_owned(), StatusCode::NOT_FOUND),
        ("/console/console.css".to_owned(), StatusCode::OK),
        ("/console/console.js".to_owned(), StatusCode::OK),
    ]
    .into_iter()
    .chain(
        job_pages
            .iter()
            .map(|id| (format!("/console/jobs/{id}"), StatusCode::OK)),
    ) {
        let page = console.get(&path, &session).await;
        assert_eq!(page.status, status, "{path}");
        pages.push(("page", page));
    }
    // The dead-letter pages and the previews of their actions, as the canary owner's operator
    // key sees them: the owner filter, typed as the principal, is answered by its digest.
    for path in [
        "/console/dead-letters".to_owned(),
        "/console/dead-letters?code=record_invalid&since=2000-01-01T00:00".to_owned(),
        format!("/console/dead-letters?owner={PRINCIPAL}"),
        "/console/dead-letters?queue=Canary%20Queue".to_owned(),
    ] {
        let page = console.get(&path, &session).await;
        assert_ne!(page.status, StatusCode::NOT_FOUND, "{path}");
        if let Some(location) = page.headers.get("location") {
            let narrowed = console.get(location.to_str().unwrap(), &session).await;
            assert_eq!(narrowed.status, StatusCode::OK);
            assert!(
                narrowed.body.contains(&failed.to_string()),
                "{}",
                narrowed.body
            );
            pages.push(("narrowed letters", narrowed));
        }
        pages.push(("letters", page));
    }
    for (path, fields, status) in [
        (
            format!("/console/dead-letters/{failed}/discard"),
            format!("csrf={token}"),
            StatusCode::OK,
        ),
        (
            format!("/console/dead-letters/{failed}/replay"),
            format!("csrf={token}"),
            StatusCode::CONFLICT,
        ),
        (
            "/console/dead-letters/replay".to_owned(),
            format!("csrf={token}&code=record_invalid"),
            StatusCode::OK,
        ),
        (
            "/console/dead-letters/discard".to_owned(),
            format!("csrf={token}&owner_key={}", "ab".repeat(32)),
            StatusCode::OK,
        ),
        (
            "/console/dead-letters/discard".to_owned(),
            "csrf=canary-token".to_owned(),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let answer = console.post(&path, &session, &fields).await;
        assert_eq!(answer.status, status, "{path} {fields}");
        pages.push(("letter action preview", answer));
    }

    let audit = console.get("/console/operator/audit", &session).await;
    assert_eq!(audit.status, StatusCode::OK);
    assert!(audit.body.contains("job_cancel"), "{}", audit.body);
    pages.push(("audit", audit));

    let signed_out = console
        .post("/console/sign-out", &session, &format!("csrf={token}"))
        .await;
    assert_eq!(signed_out.status, StatusCode::SEE_OTHER);
    pages.push(("sign-out", signed_out));

    // The pages do show what they are for: each job, its failure code, its retry.
    let bodies: String = pages.iter().map(|(_, p)| p.body.as_str()).collect();
    for id in job_pages {
        assert!(bodies.contains(&id.to_string()), "{id}");
    }
    for shown in [
        "record_invalid",
        "This will discard",
        "<h2>Dead letter</h2>",
        "retry scheduled at",
        "status-cancelled",
        "rows inserted",
    ] {
        assert!(bodies.contains(shown), "{shown}");
    }
    for (what, page) in &pages {
        assert_eq!(page_leak(page, &key), None, "{what}: {}", page.body);
    }
}
