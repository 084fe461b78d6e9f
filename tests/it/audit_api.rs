//! The audit log of the HTTP API's operator actions: each dead-letter replay or discard an
//! operator's key takes (one letter, or every letter matching a filter) writes exactly one
//! entry from source `api`, with the key's id, the action, its target and its count; an owner's
//! key acting on its own letters writes none, and neither does a refused action; no entry holds
//! an owner or a payload. Migration 0039 gives the entries written before it the source
//! `console`.

use crate::dead_letters_api::{failing, Api, CANARY, SECRET};
use crate::etl::{etl_worker, new_job, req};
use crate::support::{count, TestDb};
use durable_etl::digest::DigestKind;
use durable_etl::kinds::etl::enqueue::enqueue;
use durable_etl::{schema, Secret};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

/// The audit log's entries, oldest first: key id, action, target, how many, source.
async fn audit_log(client: &Client) -> Vec<(Uuid, String, String, i64, String)> {
    client
        .query(
            "SELECT key_id, action, target, affected, source FROM etl_audit_log ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

#[tokio::test]
async fn api_operator_actions_each_write_one_entry_and_nothing_else_does() {
    let api = Api::start().await;
    let client = api.db.client().await;
    // Alice's and bob's failing jobs come through the API (their requests retained), and one
    // more of bob's through the library (not retained).
    let a1 = api.submit(&api.alice, "a-1", &failing("a-1")).await;
    let a2 = api.submit(&api.alice, "a-2", &failing("a-2")).await;
    let b1 = api.submit(&api.bob, "b-1", &failing("b-1")).await;
    let b2 = api.submit(&api.bob, "b-2", &failing("b-2")).await;
    let b3 = api.submit(&api.bob, "b-3", &failing("b-3")).await;
    let secret = Secret::new(SECRET).unwrap();
    let bob_owner = secret.digest(DigestKind::Principal, b"bob");
    let alice_owner = secret.digest(DigestKind::Principal, b"alice");
    let b4_request = req(failing("b-4"));
    let b4 = enqueue(&client, &secret, &bob_owner, new_job("b-4", &b4_request, 1))
        .await
        .unwrap()
        .id;
    let worker = etl_worker(&api.db, "audit-api", Duration::from_secs(5)).await;
    while count(&client, "etl_job_records").await > 0 {
        worker.step().await.unwrap();
    }
    assert_eq!(count(&client, "etl_dead_letters").await, 6);
    let letter = |id: &str| format!("/v1/dead-letters/{id}");
    let replay = |id: &str| format!("/v1/dead-letters/{id}/replay");

    // An owner's key acting on its own letters takes no operator action: nothing is written.
    let (status, _, _) = api
        .send(Method::DELETE, &letter(&a1), &api.alice, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, done) = api.send(Method::POST, &replay(&a2), &api.alice, None).await;
    assert_eq!(
        (status, &done["made"]),
        (StatusCode::ACCEPTED, &json!(true))
    );
    for bulk in ["/v1/dead-letters/replay", "/v1/dead-letters/discard"] {
        let (status, _, _) = api
            .send(Method::POST, bulk, &api.alice, Some(&json!({})))
            .await;
        assert_eq!(status, StatusCode::OK, "{bulk}");
    }
    assert!(audit_log(&client).await.is_empty());

    // An operator's action that is refused, or finds nothing to do, writes nothing either.
    let nil = Uuid::nil().to_string();
    for (method, path, body, refused) in [
        (Method::DELETE, letter(&a1), None, StatusCode::NOT_FOUND),
        (Method::DELETE, letter(&nil), None, StatusCode::NOT_FOUND),
        (Method::POST, replay(&nil), None, StatusCode::NOT_FOUND),
        (
            Method::POST,
            replay(&b4.to_string()),
            None,
            StatusCode::CONFLICT,
        ),
        (
            Method::POST,
            replay(&b4.to_string()),
            Some(failing("other")),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            "/v1/dead-letters/replay".to_owned(),
            Some(json!({"limit": 5})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            "/v1/dead-letters/discard".to_owned(),
            Some(json!({"queue": "Not a queue"})),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, _, problem) = api.send(method, &path, &api.ops, body.as_ref()).await;
        assert_eq!(status, refused, "{path}: {problem}");
    }
    // Alice's letter was replayed already: the operator's replay makes nothing.
    let (status, _, again) = api.send(Method::POST, &replay(&a2), &api.ops, None).await;
    assert_eq!(
        (status, &again["made"]),
        (StatusCode::ACCEPTED, &json!(false))
    );
    assert!(audit_log(&client).await.is_empty());

    // Each of the operator's actions on bob's letters writes one entry from the API.
    let (status, _, _) = api.send(Method::DELETE, &letter(&b1), &api.ops, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, done) = api
        .send(Method::POST, &replay(&b2), &api.ops, Some(&failing("b-2")))
        .await;
    assert_eq!(
        (status, &done["made"]),
        (StatusCode::ACCEPTED, &json!(true))
    );
    let (status, _, bulk) = api
        .send(
            Method::POST,
            "/v1/dead-letters/replay",
            &api.ops,
            Some(&json!({"owner": "bob"})),
        )
        .await;
    assert_eq!(
        (status, bulk),
        (
            StatusCode::OK,
            json!({"made": 1, "not_retained": 1, "unreadable": 0})
        )
    );
    let (status, _, discarded) = api
        .send(
            Method::POST,
            "/v1/dead-letters/discard",
            &api.ops,
            Some(&json!({"owner": "bob", "code": "record_invalid"})),
        )
        .await;
    assert_eq!(
        (status, &discarded["discarded"]),
        (StatusCode::OK, &json!(1))
    );
    let ops_id: Uuid = client
        .query_one("SELECT id FROM etl_api_clients WHERE operator", &[])
        .await
        .unwrap()
        .get(0);
    let entry = |action: &str, target: &str| {
        (
            ops_id,
            action.to_owned(),
            target.to_owned(),
            1,
            "api".to_owned(),
        )
    };
    assert_eq!(
        audit_log(&client).await,
        [
            entry("letter_discard", &b1),
            entry("letter_replay", &b2),
            entry("letters_replay", "one owner"),
            entry("letters_discard", "code=record_invalid one owner"),
        ]
    );
    // Bob's retained letter was the one the bulk replay made; none is left open.
    let (_, replayed) = api.get(&letter(&b3), &api.ops).await;
    assert!(replayed["replayed_job_id"].is_string(), "{replayed}");
    let (_, open) = api.get("/v1/dead-letters", &api.ops).await;
    assert_eq!(open["letters"], json!([]));

    // No entry holds an owner (a principal or its digest) or anything of a payload.
    let text: String = client
        .query_one("SELECT string_agg(t::text, ' ') FROM etl_audit_log t", &[])
        .await
        .unwrap()
        .get(0);
    for hidden in [
        CANARY.to_owned(),
        "alice".to_owned(),
        "bob".to_owned(),
        hex::encode(bob_owner),
        hex::encode(alice_owner),
    ] {
        assert!(!text.contains(&hidden), "{hidden} in {text}");
    }
}

/// Appends an entry as a release before 0039 writes one: no source.
async fn entry_without_source(client: &Client) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            "INSERT INTO etl_audit_log (key_id, action, target, affected)
             VALUES (gen_random_uuid(), 'queue_pause', 'mail', 1)",
            &[],
        )
        .await
}

#[tokio::test]
async fn migration_0039_gives_earlier_entries_the_console_as_source_and_checks_it() {
    let db = TestDb::empty().await;
    let mut client = db.client().await;
    schema::migrate_up(&mut client).await.unwrap();
    schema::migrate_down_to(&mut client, 37).await.unwrap();
    entry_without_source(&client).await.unwrap();
    schema::migrate_up(&mut client).await.unwrap();
    // The entry before it, and one a release before it writes after it, are the console's.
    entry_without_source(&client).await.unwrap();
    assert_eq!(
        count(&client, "etl_audit_log WHERE source = 'console'").await,
        2
    );
    let refused = client
        .execute(
            "INSERT INTO etl_audit_log (key_id, action, target, affected, source)
             VALUES (gen_random_uuid(), 'queue_pause', 'mail', 1, 'cli')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
}
