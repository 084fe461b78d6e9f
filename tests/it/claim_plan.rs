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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_uses_the_pending_index_even_when_the_table_was_analyzed_empty() {
    let db = TestDb::migrated().await;
    let config: tokio_postgres::Config = db.config.url.parse().unwrap();
    let (session, mut connection) = config.connect(NoTls).await.unwrap();
    let (notices, mut plans) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(notice) = message {
                let _ = notices.send(notice.message().to_owned());
            }
        }
    });
    // auto_explain reports the plan each statement of this session actually ran with.
    session
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_level = 'notice';
             SET auto_explain.log_format = 'json';
             ANALYZE etl_job_records",
        )
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
    while plans.try_recv().is_ok() {}

    let claimed = claimer::claim(&session, PLANNER, 10).await.unwrap();
    assert_eq!(claimed.len(), 10);
    let plan = tokio::time::timeout(Duration::from_secs(10), plans.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        plan.contains("\"Index Name\": \"etl_job_records_pending_due_idx\""),
        "the claim must walk the pending index:\n{plan}"
    );
    assert!(
        !plan.contains("\"Node Type\": \"Seq Scan\""),
        "the claim must not scan the table:\n{plan}"
    );
    assert!(
        !plan.contains("\"Node Type\": \"Sort\""),
        "index order needs no sort:\n{plan}"
    );
}
