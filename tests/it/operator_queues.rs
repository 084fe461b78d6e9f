//! Queues for operators, over a real socket: `GET /v1/queues` and `GET /v1/queues/{name}` count
//! each queue's live jobs by state as inserted, with its cap usage and pause, bounded to
//! `QUEUES_SHOWN`; the console's queues page and its drill-downs from a queue and from a failure
//! code list exactly the jobs behind them, as metadata only, with relative times; and neither
//! exists for a key that is not an operator's.

use crate::console::{Console, Page};
use crate::support::{count, end_job, insert_ended_jobs};
use chrono::{Duration as Span, Utc};
use durable_etl::queue;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::{EnqueueOptions, Job, Jobs, Secret};
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

/// In every payload: no answer may show it.
const PAYLOAD_MARKER: &str = "payload-marker-5d1f";

/// The jobs' owner: no answer may show it.
const OWNER_MARKER: &str = "owner-marker-principal";

/// In every idempotency key: no answer may show it.
const IDEM_MARKER: &str = "idem-marker";

/// A job whose payload carries the marker, of queue `mail` unless its enqueue says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Marked {
    /// The marker.
    note: String,
}

impl Job for Marked {
    const KIND: &'static str = "test.marked";
    const QUEUE: &'static str = "mail";
}

/// What [`populate`] inserted.
struct Populated {
    /// `mail`'s pending jobs, due now.
    mail_due: Vec<Uuid>,
    /// `mail`'s pending jobs, due in an hour.
    mail_deferred: Vec<Uuid>,
    /// `mail`'s running job.
    mail_running: Uuid,
    /// `reports.nightly`'s one job, due now.
    report: Uuid,
    /// Jobs that ended `handler_failed` (accepted just now).
    handler_failed: Vec<Uuid>,
    /// A job that ended `record_invalid`.
    record_invalid: Uuid,
    /// A job that ended with its kind's own code, `quota_exceeded`.
    kind_code: Uuid,
    /// A job that ended `handler_failed`, accepted two days ago.
    old_failure: Uuid,
}

/// Enqueues `n` marked jobs in `queue`, due at `run_at`, as the marker owner, with keys `idem`-i.
async fn enqueue(
    client: &tokio_postgres::Client,
    n: usize,
    queue: &str,
    run_at: Option<chrono::DateTime<Utc>>,
    idem: &str,
) -> Vec<Uuid> {
    let jobs = Jobs::new(
        Secret::new(b"operator-queues-secret-0123".to_vec()).unwrap(),
        OWNER_MARKER,
    );
    let marked = Marked {
        note: PAYLOAD_MARKER.to_owned(),
    };
    let mut ids = Vec::new();
    for i in 0..n {
        let key = format!("{IDEM_MARKER}-{idem}-{i}");
        let options = EnqueueOptions {
            run_at,
            idempotency_key: Some(&key),
            queue: Some(queue),
            priority: Some(3),
            ..EnqueueOptions::default()
        };
        ids.push(jobs.enqueue(client, &marked, options).await.unwrap().id);
    }
    ids
}

/// Queue `mail` (capped at 4): three due jobs, one of which is then claimed (running, holding a
/// permit), and two deferred; `reports.nightly`: one due job; `idle`: paused, no job; `batch`:
/// four jobs that ended (two `handler_failed`, one `record_invalid`, one with its kind's own code
/// `quota_exceeded`), and one more
/// `handler_failed` accepted two days ago.
async fn populate(console: &Console) -> Populated {
    let client = console.db.client().await;
    queue::set_cap(&client, "mail", Some(4)).await.unwrap();
    queue::set_paused(&client, "idle", true).await.unwrap();
    let mut mail_due = enqueue(&client, 3, "mail", None, "due").await;
    let later = Some(Utc::now() + Span::hours(1));
    let mail_deferred = enqueue(&client, 2, "mail", later, "deferred").await;
    let report = enqueue(&client, 1, "reports.nightly", None, "report").await[0];
    let claimant = Claimant {
        owner_id: "operator-queues",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: &["test.marked"],
    };
    let claimed = claimer::claim_from(&client, claimant, &[("mail", 1)])
        .await
        .unwrap();
    let mail_running = claimed[0].ctx.id;
    mail_due.retain(|id| *id != mail_running);
    let batch = enqueue(&client, 4, "batch", None, "batch").await;
    end_job(&client, batch[0], "failed", Some("handler_failed"), None).await;
    end_job(&client, batch[1], "failed", Some("handler_failed"), None).await;
    end_job(&client, batch[2], "failed", Some("record_invalid"), None).await;
    end_job(&client, batch[3], "failed", Some("quota_exceeded"), None).await;
    let two_days_ago = Utc::now() - Span::days(2);
    let old_id = Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        u64::try_from(two_days_ago.timestamp()).unwrap(),
        0,
    ));
    let old = insert_ended_jobs(
        &client,
        "SELECT $1::uuid AS id, decode(repeat('ab', 32), 'hex') AS owner_key,
                'failed' AS status, 'handler_failed' AS failure_code,
                now() - interval '1 day' AS finished_at, NULL::uuid AS replaces_job_id",
        &[&old_id],
    )
    .await;
    Populated {
        mail_due,
        mail_deferred,
        mail_running,
        report,
        handler_failed: batch[..2].to_vec(),
        record_invalid: batch[2],
        kind_code: batch[3],
        old_failure: old[0],
    }
}

/// GETs `path` of the API as `key` (none: no credentials); returns the status and the JSON.
async fn api_get(console: &Console, key: Option<&str>, path: &str) -> (StatusCode, Value) {
    let mut request = console.http.get(format!("{}{path}", console.base));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_no_marker(&text);
    (status, serde_json::from_str(&text).unwrap())
}

/// Asserts that `text` shows no payload, owner or idempotency key.
fn assert_no_marker(text: &str) {
    for marker in [PAYLOAD_MARKER, OWNER_MARKER, IDEM_MARKER] {
        assert!(!text.contains(marker), "{marker} in {text}");
    }
}

/// The job ids a drill-down page shows, in order.
fn shown_ids(page: &Page) -> Vec<Uuid> {
    page.body
        .split("<a class=\"id\" href=\"/console/jobs/")
        .skip(1)
        .map(|rest| Uuid::parse_str(&rest[..36]).unwrap())
        .collect()
}

#[tokio::test]
async fn the_queues_api_counts_each_queues_live_jobs_by_state_for_operators_only() {
    let console = Console::start().await;
    populate(&console).await;
    let (status, list) = api_get(&console, Some(&console.alice), "/v1/queues").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["truncated"], json!(false));
    let queues = list["queues"].as_array().unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["mail", "reports.nightly", "idle"],
        "the deepest first; an ended job counts nowhere"
    );
    let mail = &queues[0];
    for (field, value) in [
        ("pending_due", json!(2)),
        ("pending_deferred", json!(2)),
        ("running", json!(1)),
        ("cap", json!(4)),
        ("permits_held", json!(1)),
        ("cap_usage", json!(0.25)),
        ("paused", json!(false)),
    ] {
        assert_eq!(mail[field], value, "mail's {field}");
    }
    assert!(mail["oldest_due_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(queues[1]["pending_due"], json!(1));
    assert_eq!(queues[1]["cap"], Value::Null);
    assert_eq!(queues[1]["cap_usage"], Value::Null);
    assert_eq!(queues[2]["paused"], json!(true));
    assert_eq!(queues[2]["pending_due"], json!(0));
    // The counts add up to the live table, state by state.
    let client = console.db.client().await;
    let sum = |field: &str| {
        queues
            .iter()
            .map(|q| q[field].as_i64().unwrap())
            .sum::<i64>()
    };
    let due = "etl_job_records WHERE status = 'pending' AND run_at <= now()";
    assert_eq!(sum("pending_due"), count(&client, due).await);
    let deferred = "etl_job_records WHERE status = 'pending' AND run_at > now()";
    assert_eq!(sum("pending_deferred"), count(&client, deferred).await);
    let running = "etl_job_records WHERE status = 'running'";
    assert_eq!(sum("running"), count(&client, running).await);

    let (status, one) = api_get(&console, Some(&console.alice), "/v1/queues/mail").await;
    assert_eq!(status, StatusCode::OK);
    let without_age = |q: &Value| {
        let mut q = q.clone();
        q.as_object_mut().unwrap().remove("oldest_due_seconds");
        q
    };
    assert_eq!(without_age(&one), without_age(mail), "the listing's row");
    for path in [
        "/v1/queues/batch",
        "/v1/queues/no.such",
        "/v1/queues/Not%20a%20queue",
        "/v1/queues/%FF",
        // Another cell is a routed API's to name: this one serves one cell.
        "/v1/queues?cell=cell_a",
        "/v1/queues/mail?cell=cell_a",
    ] {
        let (status, problem) = api_get(&console, Some(&console.alice), path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(problem["code"], "no_such_route", "{path}");
        assert!(
            !problem.to_string().contains("no.such"),
            "never echoed: {problem}"
        );
    }

    // To an owner's key the routes do not exist: the answer of a path that names nothing.
    let (_, nothing) = api_get(&console, Some(&console.bob), "/v1/nothing").await;
    for path in ["/v1/queues", "/v1/queues/mail", "/v1/queues/no.such"] {
        let (status, problem) = api_get(&console, Some(&console.bob), path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(problem, nothing, "{path}");
        for key in [None, Some("detl_not-a-key")] {
            let (status, problem) = api_get(&console, key, path).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(problem["code"], "unauthorized");
        }
    }
    // The cells are a routed API's (`serve --directory`): to this one-cell API's operator, the
    // route does not exist either.
    let (status, problem) = api_get(&console, Some(&console.alice), "/v1/cells").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(problem, nothing);
}

#[tokio::test]
async fn the_queue_listings_stop_at_queues_shown_and_say_so() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let shown = durable_etl::service::metrics::QUEUES_SHOWN;
    client
        .execute(
            "INSERT INTO etl_queues (queue, paused)
             SELECT 'q' || lpad(g::text, 3, '0'), true FROM generate_series(0, $1::int8) AS g",
            &[&shown],
        )
        .await
        .unwrap();
    let (status, list) = api_get(&console, Some(&console.alice), "/v1/queues").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["truncated"], json!(true));
    let queues = list["queues"].as_array().unwrap();
    assert_eq!(i64::try_from(queues.len()).unwrap(), shown);
    assert_eq!(queues[0]["name"], "q000", "by name among equals");
    let alice = console.sign_in(&console.alice).await;
    let page = console.get("/console/queues", &alice).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("Only the 100 deepest queues are shown."));
    assert_eq!(
        page.body.matches("<tr>").count(),
        101,
        "a header and 100 rows"
    );
    assert!(!page.body.contains("q100"));
}

#[tokio::test]
async fn the_queues_page_and_its_drill_downs_show_exactly_the_jobs_behind_them_as_metadata() {
    let console = Console::start().await;
    let jobs = populate(&console).await;
    let alice = console.sign_in(&console.alice).await;

    let view = console.get("/console/operator", &alice).await;
    assert!(
        view.body.contains("href=\"/console/queues\""),
        "{}",
        view.body
    );
    assert!(view.body.contains("href=\"/console/queues/mail\""));

    let queues = console.get("/console/queues", &alice).await;
    assert_eq!(queues.status, StatusCode::OK);
    let body = &queues.body;
    assert!(
        body.contains(
            "<td><a href=\"/console/queues/mail\"><code>mail</code></a></td>\
             <td>2</td><td class=\"unserved\">2</td><td>2</td><td>1</td>"
        ),
        "{body}"
    );
    assert!(
        body.contains("<td>1 of 4 held (25%)</td><td>none</td><td>served</td>"),
        "{body}"
    );
    assert!(
        body.contains("<code>idle</code></a></td><td>0</td><td>0</td><td>0</td><td>0</td><td>none due</td><td>none</td><td>none</td><td>paused</td>"),
        "{body}"
    );
    assert!(!body.contains("Only the"), "not truncated");
    assert_no_marker(body);

    let mail = console.get("/console/queues/mail", &alice).await;
    assert_eq!(mail.status, StatusCode::OK);
    let mut expected = vec![jobs.mail_running];
    expected.extend(&jobs.mail_due);
    expected.extend(&jobs.mail_deferred);
    assert_eq!(
        shown_ids(&mail),
        expected,
        "running first, then pending in claim order"
    );
    assert!(mail.body.contains("status-running"));
    assert_eq!(mail.body.matches(" (deferred)").count(), 2);
    assert!(mail
        .body
        .contains("<td><code>test.marked</code></td><td><code>mail</code></td><td>3</td>"));
    // Relative times, each keeping its absolute instant.
    assert!(mail.body.contains("<time datetime=\""), "{}", mail.body);
    assert!(mail.body.contains("in 59 min</time>"), "{}", mail.body);
    assert!(mail.body.contains(" ago</time>") || mail.body.contains(">now</time>"));
    assert_no_marker(&mail.body);

    let report = console.get("/console/queues/reports.nightly", &alice).await;
    assert_eq!(shown_ids(&report), [jobs.report]);
    let idle = console.get("/console/queues/idle", &alice).await;
    assert_eq!(idle.status, StatusCode::OK);
    assert!(idle
        .body
        .contains("No job of this queue is pending or running."));
    for path in ["/console/queues/batch", "/console/queues/Bad%20name"] {
        assert_eq!(
            console.get(path, &alice).await.status,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }

    let failed = console
        .get("/console/failures/handler_failed", &alice)
        .await;
    assert_eq!(failed.status, StatusCode::OK);
    let mut newest_first = jobs.handler_failed.clone();
    newest_first.reverse();
    assert_eq!(
        shown_ids(&failed),
        newest_first,
        "the code's jobs of the last day only, never {} (two days old)",
        jobs.old_failure
    );
    assert!(failed
        .body
        .contains("The handler reported a permanent failure."));
    assert!(failed.body.contains("<td><code>handler_failed</code></td>"));
    assert!(failed.body.contains("status-failed"));
    assert_no_marker(&failed.body);
    let invalid = console
        .get("/console/failures/record_invalid", &alice)
        .await;
    assert_eq!(shown_ids(&invalid), [jobs.record_invalid]);
    // A kind's own code is no code of the crate's: its page exists while a job ended with it.
    let own = console
        .get("/console/failures/quota_exceeded", &alice)
        .await;
    assert_eq!(own.status, StatusCode::OK);
    assert_eq!(shown_ids(&own), [jobs.kind_code]);
    let none = console
        .get("/console/failures/execution_timeout", &alice)
        .await;
    assert_eq!(none.status, StatusCode::OK);
    assert!(none
        .body
        .contains("No job accepted in the last 24 hours ended with this code."));
    for made_up in ["Not-a-code", "made_up_code"] {
        let page = console
            .get(&format!("/console/failures/{made_up}"), &alice)
            .await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{made_up}");
        assert!(!page.body.contains(made_up), "never echoed");
    }
}

#[tokio::test]
async fn the_queues_pages_do_not_exist_for_an_owner_and_need_a_session() {
    let console = Console::start().await;
    populate(&console).await;
    let bob = console.sign_in(&console.bob).await;
    let jobs = console.get("/console/jobs", &bob).await;
    assert!(
        !jobs.body.contains("href=\"/console/queues\""),
        "no link for an owner"
    );
    for path in [
        "/console/queues",
        "/console/queues/mail",
        "/console/failures/handler_failed",
    ] {
        let page = console.get(path, &bob).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{path}");
        assert!(page.body.contains("There is no such page"), "{path}");
        let signed_out = console.get(path, "").await;
        assert_eq!(signed_out.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(signed_out.headers["location"], "/console/sign-in");
    }
}

#[tokio::test]
async fn the_owners_pages_show_times_relative_to_now_keeping_the_instant() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "relative-1", true).await;
    let bob = console.sign_in(&console.bob).await;
    let list = console.get("/console/jobs", &bob).await;
    assert!(list.body.contains("<td><time datetime=\""), "{}", list.body);
    let page = console.get(&format!("/console/jobs/{job}"), &bob).await;
    let at = page.body.find("Accepted <time datetime=\"").unwrap();
    let accepted = &page.body[at..];
    assert!(
        accepted.contains("</time>") && accepted.contains("title=\""),
        "{accepted}"
    );
    assert!(
        page.body.contains("Due <time") && page.body.contains(">in 59 min</time>"),
        "the deferred job is due in an hour: {}",
        page.body
    );
}
