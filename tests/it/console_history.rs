//! The console's view of history: a job's timeline over a real attempt history (every way an
//! attempt can end without ending its job, a retry, a recovery or a shutdown release, is recorded
//! by the statement that ends it, under its fence, and the job page shows each attempt in
//! order), and the list's window of submission times.

use crate::console::Console;
use crate::support::first_column;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer::{self, Transition};
use durable_etl::worker::lease::Lease;
use durable_etl::worker::rescuer;
use durable_etl::Code;
use reqwest::StatusCode;
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

/// Claims the one due job as a replica would; returns its lease.
pub(crate) async fn claim(client: &Client) -> Lease {
    let claimant = Claimant {
        owner_id: "timeline-replica",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: crate::support::TEST_KINDS,
    };
    let claimed = claimer::claim(client, claimant, 1).await.unwrap();
    assert_eq!(claimed.len(), 1, "one job is due");
    let ctx = &claimed[0].ctx;
    Lease {
        job_id: ctx.id,
        claim_id: ctx.lease_claim_id,
        fencing_token: ctx.fencing_token,
    }
}

/// The job's recorded attempts, as `(attempt, ending)`, oldest first.
async fn history(client: &Client, job: Uuid) -> Vec<(i32, String)> {
    client
        .query(
            "SELECT attempt, ending FROM etl_job_attempts WHERE job_id = $1 ORDER BY ended_at",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn each_attempt_that_did_not_end_its_job_is_recorded_under_its_fence_and_shown_in_order() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "timeline", false).await;
    let client = console.db.client().await;

    // Attempt 1 fails transiently; a stale claim's retry changes nothing and records nothing.
    let first = claim(&client).await;
    let stale = Lease {
        claim_id: Uuid::new_v4(),
        ..first
    };
    let lost = completer::retry(&client, stale, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(lost, Transition::LeaseLost);
    assert!(history(&client, job).await.is_empty());
    let retried = completer::retry(&client, first, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(retried, Transition::Retried);

    // Attempt 2's lease expires; recovery gives the job back.
    let second = claim(&client).await;
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
            &[&second.job_id],
        )
        .await
        .unwrap();
    let recovered = rescuer::recover(
        &client,
        rescuer::Judgement {
            heartbeat_interval: Duration::from_secs(60),
            reachable_for: Duration::MAX,
        },
    )
    .await
    .unwrap();
    assert_eq!(recovered.expired, 1);

    // Attempt 3 is released at shutdown (not charged), so the next attempt is attempt 3 again;
    // a stale release records nothing.
    let third = claim(&client).await;
    let stale = Lease {
        claim_id: Uuid::new_v4(),
        ..third
    };
    let started = [stale.claim_id, third.claim_id];
    assert_eq!(
        completer::release(&client, &[stale], &started)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        completer::release(&client, &[third], &started)
            .await
            .unwrap(),
        1
    );

    // Attempt 3, again, ends the job.
    let last = claim(&client).await;
    let failed = completer::fail(&client, last, Code::HandlerFailed, None)
        .await
        .unwrap();
    assert_eq!(failed, Transition::Failed(Code::HandlerFailed));

    assert_eq!(
        history(&client, job).await,
        [
            (1, "retried".to_owned()),
            (2, "recovered".to_owned()),
            (3, "released".to_owned())
        ]
    );
    // Each was due again at once (the retry had no delay; recovery and release give back now),
    // not at the job's first due time, which had passed.
    let due_at_once: Vec<bool> = first_column(
        &client,
        "SELECT a.due_at = a.ended_at AND a.ended_at > a.started_at AND a.due_at > i.run_at
           FROM etl_job_attempts a JOIN etl_job_intake i ON i.id = a.job_id",
    )
    .await;
    assert_eq!(due_at_once, [true, true, true]);

    let session = console.sign_in(&console.bob).await;
    let page = console.get(&format!("/console/jobs/{job}"), &session).await;
    assert_eq!(page.status, StatusCode::OK);
    let steps = [
        "Accepted ",
        "Attempt 1 started ",
        "Attempt 1 failed transiently ",
        "; retry scheduled at ",
        "Attempt 2 started ",
        "Attempt 2 recovered after its lease expired or its replica stopped ",
        "Attempt 3 started ",
        "Attempt 3 released as its replica shut down (not charged) ",
        "Attempt 3 started ",
        "Finished ",
    ];
    let mut from = 0;
    for step in steps {
        let at = page.body[from..]
            .find(step)
            .unwrap_or_else(|| panic!("{step:?} after byte {from} in {}", page.body));
        from += at + step.len();
    }
    assert!(page.body.contains("handler_failed"));

    // To another owner's key the job shows no timeline: it is not found. An operator's key
    // opens it, timeline and all.
    let carol = console
        .key_for("carol", durable_etl::service::api_keys::Role::Owner)
        .await;
    let carol = console.sign_in(&carol).await;
    let theirs = console.get(&format!("/console/jobs/{job}"), &carol).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert!(!theirs.body.contains("Attempt"));
    let alice = console.sign_in(&console.alice).await;
    let operator = console.get(&format!("/console/jobs/{job}"), &alice).await;
    assert_eq!(operator.status, StatusCode::OK);
    assert!(operator
        .body
        .contains("Attempt 3 released as its replica shut down"));
}

#[tokio::test]
async fn a_job_waiting_to_retry_shows_its_last_attempt_once_and_when_it_is_due() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "waiting", false).await;
    let client = console.db.client().await;
    let lease = claim(&client).await;
    let retried = completer::retry(&client, lease, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(retried, Transition::Retried);
    let delay: Vec<f64> = first_column(
        &client,
        "SELECT extract(epoch FROM due_at - ended_at)::float8 FROM etl_job_attempts",
    )
    .await;
    assert_eq!(delay, [3600.0], "due when the retry is");
    let session = console.sign_in(&console.bob).await;
    let page = console.get(&format!("/console/jobs/{job}"), &session).await;
    assert_eq!(page.body.matches("Attempt 1 started ").count(), 1);
    assert!(page.body.contains("; retry scheduled at "));
    assert!(page.body.contains("<li>Due "));
    assert!(!page.body.contains("Finished "));
}

/// The second a job was submitted in (its UUIDv7 id begins with the millisecond), as a
/// `datetime-local` value.
fn second_of(id: Uuid) -> String {
    let millis = i64::try_from(id.as_u128() >> 80).unwrap();
    let at = chrono::DateTime::from_timestamp_millis(millis / 1000 * 1000).unwrap();
    at.format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// Submits a job as bob in a later second than `previous` was (submitting again, with a new
/// idempotency key, until one lands there); returns its id.
async fn submit_in_a_new_second(console: &Console, idem: &str, previous: Option<Uuid>) -> Uuid {
    for n in 0.. {
        let id = console
            .submit(&console.bob, &format!("{idem}-{n}"), false)
            .await;
        if previous.is_none_or(|p| second_of(p) < second_of(id)) {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    unreachable!("the loop returns")
}

#[tokio::test]
async fn the_list_shows_the_jobs_submitted_in_a_window_and_refuses_a_time_that_is_not_one() {
    let console = Console::start().await;
    let early = submit_in_a_new_second(&console, "early", None).await;
    let middle = submit_in_a_new_second(&console, "middle", Some(early)).await;
    let late = submit_in_a_new_second(&console, "late", Some(middle)).await;
    let session = console.sign_in(&console.bob).await;
    let shown = |body: &str| {
        [early, middle, late]
            .iter()
            .map(|id| body.contains(&id.to_string()))
            .collect::<Vec<_>>()
    };
    let (from, to) = (second_of(middle), second_of(late));
    let window = console
        .get(&format!("/console/jobs?from={from}&to={to}"), &session)
        .await;
    assert_eq!(window.status, StatusCode::OK);
    assert_eq!(shown(&window.body), [false, true, false]);
    assert!(
        window.body.contains(&format!("value=\"{from}\"")),
        "the form keeps the window"
    );
    let since = console
        .get(
            &format!("/console/jobs?from={from}&status=pending"),
            &session,
        )
        .await;
    assert_eq!(shown(&since.body), [false, true, true]);
    let before = console
        .get(&format!("/console/jobs?to={to}"), &session)
        .await;
    assert_eq!(shown(&before.body), [true, true, false]);
    // The window over ended jobs (their own listing statement): the middle one succeeded.
    let client = console.db.client().await;
    crate::support::end_job(&client, middle, "succeeded", None, Some((1, 0, 0))).await;
    let ended = console
        .get(
            &format!("/console/jobs?from={from}&status=succeeded"),
            &session,
        )
        .await;
    assert_eq!(shown(&ended.body), [false, true, false]);
    let ended_before = console
        .get(
            &format!("/console/jobs?to={from}&status=succeeded"),
            &session,
        )
        .await;
    assert!(ended_before.body.contains("No jobs match."));

    for bad in ["from=yesterday", "to=2026-13-01T00:00"] {
        let refused = console.get(&format!("/console/jobs?{bad}"), &session).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(refused.body.contains("Write times as"), "{bad}");
        assert_eq!(shown(&refused.body), [false, false, false], "{bad}");
    }
}

#[tokio::test]
async fn a_replaced_job_links_to_its_replacement_and_back() {
    let console = Console::start().await;
    let old = console.submit(&console.bob, "old", true).await;
    let body = serde_json::json!({"dataset": "d", "key": "id", "records": [{"id": 2}],
                                  "replaces": old.to_string()});
    let new = console.submit_body(&console.bob, "new", &body).await;
    let session = console.sign_in(&console.bob).await;
    let old_page = console.get(&format!("/console/jobs/{old}"), &session).await;
    assert!(old_page.body.contains("<code>replaced</code>"));
    let link = |id: Uuid| format!("<a class=\"id\" href=\"/console/jobs/{id}\">{id}</a>");
    assert!(
        old_page
            .body
            .contains(&format!("<dt>Replaced by</dt><dd>{}</dd>", link(new))),
        "{}",
        old_page.body
    );
    let new_page = console.get(&format!("/console/jobs/{new}"), &session).await;
    assert!(new_page
        .body
        .contains(&format!("<dt>Replaces</dt><dd>{}</dd>", link(old))));
    assert!(!new_page.body.contains("Replaced by"));
}

#[tokio::test]
async fn a_live_row_without_an_intake_row_never_blocks_recovery_or_its_history() {
    let console = Console::start().await;
    let job = console.submit(&console.bob, "kept", false).await;
    let client = console.db.client().await;
    let lease = claim(&client).await;
    assert_eq!(lease.job_id, job);
    // A row no release writes: live and running, with no intake row; both leases expired.
    client
        .batch_execute(
            "INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, status, attempts, lease_owner_id,
                  lease_claim_id, lease_expires_at, lease_renewed_at, started_at)
             VALUES (gen_random_uuid(), sha256('o'::bytea), 'noop', '{}', 'running', 1, 'o',
                     gen_random_uuid(), now() - interval '1 second', now(), now());
             UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second';",
        )
        .await
        .unwrap();
    let recovered = rescuer::recover(
        &client,
        rescuer::Judgement {
            heartbeat_interval: Duration::from_secs(60),
            reachable_for: Duration::MAX,
        },
    )
    .await
    .unwrap();
    assert_eq!(recovered.expired, 2, "both go back");
    assert_eq!(history(&client, job).await, [(1, "recovered".to_owned())]);
    assert_eq!(crate::support::count(&client, "etl_job_attempts").await, 1);
}
