//! The operator view across incarnations of one owner id: a replica restarted with the same
//! owner id after `kill -9` adds its minutes to the dead incarnation's instead of overwriting
//! them, and a replica stopped because another process took its owner id leaves that holder's
//! row of `etl_replicas` in place.

use crate::console::Console;
use crate::proxy::{Mode, Proxy};
use crate::support::{count, eventually};
use chrono::{DateTime, Utc};
use durable_etl::config::DatabaseConfig;
use durable_etl::Error;
use reqwest::StatusCode;
use serde_json::json;

/// Submits, as bob, one job that succeeds and one whose record does not cast (`record_invalid`).
async fn one_success_one_failure(console: &Console, idem: &str) {
    console
        .submit(&console.bob, &format!("{idem}-ok"), false)
        .await;
    let failing = json!({"dataset": "d", "key": "id", "records": [{"id": 1, "n": "abc"}],
                         "transform": {"cast": {"n": "integer"}}});
    console
        .submit_body(&console.bob, &format!("{idem}-bad"), &failing)
        .await;
}

/// When the replica reporting as `owner` started, as its row of `etl_replicas` says (once it
/// has one).
async fn started_at(client: &tokio_postgres::Client, owner: &str) -> DateTime<Utc> {
    eventually("the replica's row", || async {
        count(client, &format!("etl_replicas WHERE owner_id = '{owner}'")).await == 1
    })
    .await;
    client
        .query_one(
            "SELECT started_at FROM etl_replicas WHERE owner_id = $1",
            &[&owner],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until the incarnation of `owner` started at `started` has reported one success and
/// one failure.
async fn reported(client: &tokio_postgres::Client, owner: &str, started: DateTime<Utc>) {
    eventually("the report of one success and one failure", || async {
        let row = client
            .query_one(
                "SELECT count(*) FROM etl_replica_minutes
                  WHERE owner_id = $1 AND started_at = $2 AND succeeded = 1 AND failed = 1",
                &[&owner, &started],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_incarnations_of_one_owner_id_add_up_in_the_operator_view() {
    let console = Console::start().await;
    let client = console.db.client().await;
    let first = console.replica("twin").await;
    let first_started = started_at(&client, "twin").await;
    one_success_one_failure(&console, "first").await;
    reported(&client, "twin", first_started).await;
    // Killed: no last report, its rows stay as they were.
    first.kill().await;

    let second = console.replica("twin").await;
    eventually("the second incarnation's row", || async {
        started_at(&client, "twin").await > first_started
    })
    .await;
    let second_started = started_at(&client, "twin").await;
    one_success_one_failure(&console, "second").await;
    reported(&client, "twin", second_started).await;

    assert_eq!(
        count(
            &client,
            "etl_replica_minutes WHERE owner_id = 'twin' AND succeeded = 1 AND failed = 1"
        )
        .await,
        2,
        "each incarnation keeps its own totals, in the same minute too"
    );
    let alice = console.sign_in(&console.alice).await;
    let view = console.get("/console/operator", &alice).await;
    assert_eq!(view.status, StatusCode::OK);
    assert!(
        view.body
            .contains("<code>record_invalid</code></a></td><td>2</td>"),
        "both incarnations' failures: {}",
        view.body
    );
    assert_eq!(
        view.body.matches("default 2 in the hour").count(),
        2,
        "both incarnations' jobs by queue, succeeded and failed"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_its_owner_id_leaves_the_new_holders_row() {
    let console = Console::start().await;
    let client = console.db.client().await;
    // The first replica reaches the server through a proxy, the holder-to-be directly.
    let proxy = Proxy::in_front_of_test_server().await;
    let via_proxy = DatabaseConfig {
        url: proxy.url_for(&console.db.config.url),
        ..console.db.config.clone()
    };
    let first = console.try_replica_on(&via_proxy, "twin").await.unwrap();
    let first_started = started_at(&client, "twin").await;
    // Its network goes: its connections close (so its session and owner lock end on the
    // server), and its reconnects hang until the network is back.
    proxy.set_mode(Mode::Blackhole);
    proxy.drop_all();
    let holder = console.replica("twin").await;
    eventually("the holder's row", || async {
        started_at(&client, "twin").await > first_started
    })
    .await;
    let holder_started = started_at(&client, "twin").await;
    // The network is back: the first replica finds its owner id taken and stops.
    proxy.set_mode(Mode::Pass);
    assert!(
        matches!(first.ended().await, Err(Error::OwnerIdInUse)),
        "the first replica stops: its owner id is taken"
    );
    let row = client
        .query_opt(
            "SELECT started_at FROM etl_replicas WHERE owner_id = 'twin'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, DateTime<Utc>>(0));
    assert_eq!(
        row,
        Some(holder_started),
        "the stopped replica deleted only its own row"
    );
    holder.stop().await;
    assert_eq!(count(&client, "etl_replicas").await, 0, "the holder's own");
}
