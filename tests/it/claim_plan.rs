//! The claim's query plan: it walks the pending partial index, even on a table full of terminal
//! rows that was analyzed while empty, because every claim is planned with its real parameters.

use crate::support::{insert_jobs, TestDb};
use durable_etl::worker::claimer;
use futures::StreamExt;
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

/// The claimant of this test.
const PLANNER: claimer::Claimant<'static> = claimer::Claimant {
    owner_id: "planner",
    owner_locked: false,
    lease: Duration::from_secs(30),
};

/// A session with `config` that reports, through the returned channel, the plan of every
/// statement it runs (`auto_explain` at notice level).
async fn explained(
    config: tokio_postgres::Config,
) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<String>) {
    let (session, mut connection) = config.connect(NoTls).await.unwrap();
    let (notices, plans) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(notice) = message {
                let _ = notices.send(notice.message().to_owned());
            }
        }
    });
    session
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_level = 'notice';
             SET auto_explain.log_format = 'json';",
        )
        .await
        .unwrap();
    (session, plans)
}

/// Claims 10 jobs on `session` and asserts the plan walked the pending index in order.
async fn claim_walks_the_pending_index(
    session: &tokio_postgres::Client,
    plans: &mut mpsc::UnboundedReceiver<String>,
) {
    while plans.try_recv().is_ok() {}
    let claimed = claimer::claim(session, PLANNER, 10).await.unwrap();
    assert_eq!(claimed.len(), 10);
    let plan = tokio::time::timeout(Duration::from_secs(10), plans.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        plan.contains("\"Index Name\": \"etl_job_records_pending_due_idx\""),
        "the claim must walk the pending index:\n{plan}"
    );
    for node in ["Seq Scan", "Bitmap Heap Scan", "Sort"] {
        assert!(
            !plan.contains(&format!("\"Node Type\": \"{node}\"")),
            "index order needs no {node}:\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_uses_the_pending_index_even_when_the_table_was_analyzed_empty() {
    let db = TestDb::migrated().await;
    let (session, mut plans) = explained(db.config.url.parse().unwrap()).await;
    session
        .batch_execute("ANALYZE etl_job_records")
        .await
        .unwrap();
    // Claims on the empty table: a cached generic plan would be born here.
    for _ in 0..10 {
        assert!(claimer::claim(&session, PLANNER, 10)
            .await
            .unwrap()
            .is_empty());
    }
    // The table fills: 100,000 terminal rows and 10,000 pending rows, never analyzed since.
    let filler = db.client().await;
    filler
        .batch_execute(
            "SET auto_explain.log_min_duration = -1;
             INSERT INTO etl_job_records
                 (id, owner_key, idempotency_key_digest, request_fingerprint, kind, status,
                  failure_code, finished_at, run_at)
             SELECT gen_random_uuid(), decode(repeat('ab', 32), 'hex'), sha256(g::text::bytea),
                    sha256(g::text::bytea), 'test.noop', 'failed', 'handler_failed', now(),
                    now() - interval '1 day'
               FROM generate_series(1, 100000) g",
        )
        .await
        .unwrap();
    let payloads = vec![json!({}); 10_000];
    insert_jobs(&filler, "test.noop", &payloads, 3).await;
    claim_walks_the_pending_index(&session, &mut plans).await;
}

/// A table never analyzed (new, or truncated) that receives a bulk insert has no statistics:
/// the planner then guesses a handful of pending rows and, on a plain session, prefers a bitmap
/// scan plus a sort of every pending row. Worker sessions plan with sorts and bitmap scans
/// discouraged, so the claim still walks the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_session_claims_through_the_index_on_a_never_analyzed_table() {
    let db = TestDb::migrated().await;
    let config = durable_etl::db::pg_config(&db.config, "worker").unwrap();
    let (session, mut plans) = explained(config).await;
    let filler = db.client().await;
    filler
        .batch_execute("TRUNCATE etl_job_records CASCADE")
        .await
        .unwrap();
    insert_jobs(&filler, "test.noop", &vec![json!({}); 5_000], 3).await;
    claim_walks_the_pending_index(&session, &mut plans).await;
}
