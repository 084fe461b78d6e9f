//! The operators' console actions over HTTP: a queue's pause, resume, cap and key cap from its
//! page, each needing the session's token and an operator's key, acting only on a queue the
//! console shows, and written to the audit log; job ids link to job pages an operator opens and
//! cancels for any owner.

use crate::console::Console;
use durable_etl::service::api_keys::Role;
use reqwest::StatusCode;
use tokio_postgres::Client;

/// The default queue's settings: paused, cap, key cap (`None` without a row).
async fn settings(client: &Client) -> Option<(bool, Option<i32>, Option<i32>)> {
    client
        .query_opt(
            "SELECT paused, cap, key_cap FROM etl_queues WHERE queue = 'default'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
}

#[tokio::test]
async fn console_operators_pause_resume_and_cap_a_queue_and_each_change_is_audited() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let job = console.submit(&console.bob, "queued", true).await;
    let alice = console.sign_in(&console.alice).await;
    let page = console.get("/console/queues/default", &alice).await;
    assert!(page.body.contains("Pause queue") && page.body.contains("Set cap"));
    assert!(
        page.body.contains(&format!("href=\"/console/jobs/{job}\"")),
        "a job id links to its page"
    );
    let csrf = page.csrf();
    let post = |path: &'static str, cookies: &str, fields: String| {
        let console = &console;
        let cookies = cookies.to_owned();
        async move {
            console
                .post(&format!("/console/queues/{path}"), &cookies, &fields)
                .await
        }
    };

    // Refused: a wrong token, no session, an owner's key, a queue the console does not show.
    let forged = post("default/pause", &alice, format!("csrf={}", "0".repeat(64))).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let anonymous = post("default/pause", "", format!("csrf={csrf}")).await;
    assert_eq!(anonymous.status, StatusCode::FORBIDDEN);
    let bob = console.sign_in(&console.bob).await;
    let bob_csrf = console.get("/console/jobs", &bob).await.csrf();
    let owner = post("default/pause", &bob, format!("csrf={bob_csrf}")).await;
    assert_eq!(owner.status, StatusCode::NOT_FOUND);
    for path in ["nothing_here/pause", "Not%20A%20Queue/pause"] {
        let none = post(path, &alice, format!("csrf={csrf}")).await;
        assert_eq!(none.status, StatusCode::NOT_FOUND, "{path}");
    }
    let bad_cap = post("default/cap", &alice, format!("csrf={csrf}&cap=0")).await;
    assert_eq!(bad_cap.status, StatusCode::BAD_REQUEST);
    assert_eq!(settings(&client).await, None, "nothing was written");
    assert_eq!(
        crate::support::count(&client, "etl_audit_log").await,
        0,
        "nothing was audited"
    );

    // Each control acts, shows the queue's page again, and is audited.
    let steps = [
        ("default/pause", "", Some((true, None, None))),
        ("default/cap", "&cap=3", Some((true, Some(3), None))),
        ("default/key-cap", "&cap=2", Some((true, Some(3), Some(2)))),
        ("default/resume", "", Some((false, Some(3), Some(2)))),
        ("default/cap", "&cap=", Some((false, None, Some(2)))),
    ];
    for (path, fields, after) in steps {
        let done = post(path, &alice, format!("csrf={csrf}{fields}")).await;
        assert_eq!(done.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(done.location(), "/console/queues/default");
        assert_eq!(settings(&client).await, after, "{path}{fields}");
    }
    let shown = console.get("/console/queues/default", &alice).await;
    assert!(shown.body.contains("Pause queue"), "resumed");
    assert!(shown.body.contains("2 per key, 0 held"), "{}", shown.body);
    let entries: Vec<(String, String)> = client
        .query("SELECT action, target FROM etl_audit_log ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let entry = |a: &str, t: &str| (a.to_owned(), t.to_owned());
    assert_eq!(
        entries,
        [
            entry("queue_pause", "default"),
            entry("queue_cap", "default cap=3"),
            entry("queue_key_cap", "default key_cap=2"),
            entry("queue_resume", "default"),
            entry("queue_cap", "default cap=none"),
        ]
    );

    // The operator opens bob's job from the queue's page and cancels it once confirmed; another
    // owner's key finds no such job.
    let theirs = console.get(&format!("/console/jobs/{job}"), &alice).await;
    assert_eq!(theirs.status, StatusCode::OK);
    assert!(!theirs.body.contains("bob"), "no principal");
    let cancel = format!("/console/jobs/{job}/cancel");
    let asked = console.post(&cancel, &alice, &format!("csrf={csrf}")).await;
    assert_eq!(asked.status, StatusCode::OK);
    let carol = console.key_for("carol", Role::Owner).await;
    let carol = console.sign_in(&carol).await;
    let carol_csrf = console.get("/console/jobs", &carol).await.csrf();
    let refused = console
        .post(&cancel, &carol, &format!("csrf={carol_csrf}&confirm=yes"))
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let done = console
        .post(&cancel, &alice, &format!("csrf={csrf}&confirm=yes"))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let after = console.get(&format!("/console/jobs/{job}"), &bob).await;
    assert!(after.body.contains("status-cancelled"));
    let last: String = client
        .query_one(
            "SELECT action FROM etl_audit_log ORDER BY id DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(last, "job_cancel");
}
