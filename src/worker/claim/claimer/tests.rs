//! Claim sessions against databases of the shared template harness: the prepared claim, its
//! plan check, and the fallback when the check fails.

use super::capped::CappedQueues;
use super::next_due::{NEXT_DUE_SQL, NEXT_DUE_WINDOW};
use super::plan_check::*;
use super::session::*;
use super::statement::*;
use crate::db;
use crate::queue::DEFAULT_QUEUE;
use crate::test_db::TestDb;
use crate::worker::lease::ClaimedJob;
use crate::worker::stats::WorkerStats;
use bb8::ManageConnection;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// The claimant of these tests.
pub(super) const CLAIMANT: Claimant<'static> = Claimant {
    owner_id: "claim-session",
    owner_locked: false,
    lease: Duration::from_secs(30),
    heartbeat_interval: std::time::Duration::from_secs(4),
    alive_locked: false,
    kinds: &["test"],
};

/// A claim of `n` jobs of the default queue.
fn ask(n: usize) -> [Ask<'static>; 1] {
    [(DEFAULT_QUEUE, n)]
}

/// The time until the next deferred job of the default queue and the kind `test` is due.
async fn next_due_of(session: &ClaimSession) -> Option<Duration> {
    session.next_due(&[DEFAULT_QUEUE], &["test"]).await.unwrap()
}

/// A fresh database with `due` due jobs and one deferred an hour, and the claim sessions'
/// configuration on it.
pub(super) async fn with_jobs(due: i32) -> (TestDb, tokio_postgres::Config) {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .execute(
            "WITH intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at)
                 SELECT gen_random_uuid(), decode(repeat('ab', 32), 'hex'),
                        sha256(g::text::bytea), sha256(g::text::bytea), 'test', 5,
                        CASE WHEN g > $1 THEN now() + interval '1 hour' ELSE now() END
                   FROM generate_series(1, $1 + 1) g
                 RETURNING id, owner_key, kind, max_attempts, run_at
             )
             INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, max_attempts, run_at, sort_at)
             SELECT id, owner_key, kind, '{}', max_attempts, run_at, run_at FROM intake",
            &[&due],
        )
        .await
        .unwrap();
    let config = super::claim_pg_config(&db.config).unwrap();
    (db, config)
}

/// A claim session on a new connection of `config`.
pub(super) async fn session(config: &tokio_postgres::Config, stats: &WorkerStats) -> ClaimSession {
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    ClaimSession::open(client, stats, crate::config::Pooler::None)
        .await
        .unwrap()
}

/// `(generic plans, custom plans)` the session has built for the claim `sql` so far.
pub(super) async fn plans_built(session: &ClaimSession, sql: &str) -> (i64, i64) {
    let row = session
        .client
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements
              WHERE statement = $1",
            &[&sql],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_claim_session_runs_the_checked_generic_plan_of_its_prepared_claim() {
    let (_db, config) = with_jobs(3).await;
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    assert!(session.is_prepared());
    assert_eq!(
        session
            .claim(CLAIMANT, &ask(2), &CappedQueues::default())
            .await
            .unwrap()
            .jobs
            .len(),
        2
    );
    assert_eq!(
        session
            .claim(CLAIMANT, &ask(5), &CappedQueues::default())
            .await
            .unwrap()
            .jobs
            .len(),
        1
    );
    assert!(session
        .claim(CLAIMANT, &ask(5), &CappedQueues::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
    // Every claim of the uncapped queue ran the one generic plan of the claim without permits
    // that was checked; none was planned for its values, and the claim with permits never ran.
    let (generic, custom) = plans_built(&session, CLAIM_UNCAPPED_SQL).await;
    assert!(generic >= 1, "generic plans {generic}");
    assert_eq!(custom, 0);
    assert_eq!(
        plans_built(&session, CLAIM_SQL).await,
        (1, 0),
        "only its plan check"
    );
    let due = next_due_of(&session).await.unwrap();
    assert!(due > Duration::from_secs(3000) && due <= Duration::from_secs(3600));
    assert_eq!(stats.snapshot().claim_plan_fallbacks, 0);
    // Its switched-off sort costs ten billion: compiled, each claim took 450 ms.
    let jit: String = session
        .client
        .query_one("SHOW jit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jit, "off");
}

#[tokio::test]
async fn on_a_full_analyzed_queue_the_generic_claim_probes_the_primary_key_per_claimed_row() {
    // A generic plan does not know the LIMIT: with hash joins allowed it hashed every job row
    // on each claim.
    let (db, config) = with_jobs(5_000).await;
    db.client()
        .await
        .batch_execute("ANALYZE etl_job_records")
        .await
        .unwrap();
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    assert!(session.is_prepared());
    for sql in [CLAIM_SQL, CLAIM_UNCAPPED_SQL] {
        let plan = explain_prepared(&session.client, sql)
            .await
            .unwrap()
            .to_string();
        assert!(plan.contains("\"Nested Loop\""), "{plan}");
        assert!(plan.contains("\"etl_job_records_pkey\""), "{plan}");
        assert!(
            !plan.contains("Seq Scan on etl_job_records") && !plan.contains("Hash"),
            "{plan}"
        );
    }
    assert_eq!(
        session
            .claim(CLAIMANT, &ask(100), &CappedQueues::default())
            .await
            .unwrap()
            .jobs
            .len(),
        100
    );
}

#[tokio::test]
async fn on_an_empty_vacuumed_queue_a_failed_plan_check_is_no_alarm_and_is_checked_again_later() {
    let (db, config) = with_jobs(0).await;
    let client = db.client().await;
    for sql in ["DELETE FROM etl_job_records", "VACUUM etl_job_records"] {
        client.batch_execute(sql).await.unwrap();
    }
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    // An empty table's generic plan scans it: right, and not what the check wants.
    assert!(!session.is_prepared());
    assert_eq!(stats.snapshot().claim_plan_fallbacks, 0);
    assert!(session
        .claim(CLAIMANT, &ask(5), &CappedQueues::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
    let now = Instant::now();
    assert!(!session.due_for_recheck(now));
    assert!(session.due_for_recheck(now + RECHECK_AFTER));
}

#[tokio::test]
async fn a_session_whose_claim_plan_fails_its_check_plans_every_claim_and_says_so() {
    // Enough jobs for the table to be judged (JUDGED_FROM_PAGES on disk).
    let (db, config) = with_jobs(2_000).await;
    // Without the claim index no plan can walk it: the check must fail.
    db.client()
        .await
        .batch_execute("DROP INDEX etl_job_records_claim_idx")
        .await
        .unwrap();
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    assert!(!session.is_prepared());
    assert_eq!(stats.snapshot().claim_plan_fallbacks, 1);
    let mode: String = session
        .client
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "force_custom_plan");
    // It still claims, exactly what is due, and reads the next due time; it is never replaced
    // for a recheck (its failure was judged).
    assert_eq!(
        session
            .claim(CLAIMANT, &ask(5), &CappedQueues::default())
            .await
            .unwrap()
            .jobs
            .len(),
        5
    );
    assert!(next_due_of(&session).await.is_some());
    assert!(!session.due_for_recheck(Instant::now() + RECHECK_AFTER));
}

#[tokio::test]
async fn the_pool_opens_checked_sessions_and_knows_a_closed_one() {
    let (db, config) = with_jobs(1).await;
    let stats = Arc::new(WorkerStats::default());
    let manager = ClaimSessions {
        connections: db::Manager::new(db::Connector::new(&db.config, config).unwrap()),
        stats: Arc::clone(&stats),
        alive: None,
        pooler: crate::config::Pooler::None,
    };
    let mut session = manager.connect().await.unwrap();
    assert!(session.is_prepared());
    manager.is_valid(&mut session).await.unwrap();
    assert!(!manager.has_broken(&mut session));
    assert!(!db::Session::is_closed(&session));
    // A terminated backend (this database's only claim session) is a broken session, once its
    // connection has seen the end.
    db.client()
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name = 'durable-etl/claimer' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    assert!(manager.is_valid(&mut session).await.is_err());
    for _ in 0..500 {
        if manager.has_broken(&mut session) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(manager.has_broken(&mut session));
    // The replica's pool is made of such sessions.
    let pool = connect_claim_pool(&db.config, stats, None).await.unwrap();
    let pooled = db::checkout(&pool).await.unwrap();
    assert_eq!(
        pooled
            .claim(CLAIMANT, &ask(1), &CappedQueues::default())
            .await
            .unwrap()
            .jobs
            .len(),
        1
    );
}

#[test]
fn the_plan_check_wants_the_claim_index_and_no_sort_below_a_row_lock() {
    let index = json!({"Node Type": "Index Scan", "Index Name": "etl_job_records_claim_idx"});
    let walk =
        |plan: serde_json::Value| walks_the_pending_index_in_order(&json!([{ "Plan": plan }]));
    let locked = |below: serde_json::Value| json!({"Node Type": "Limit", "Plans": [{"Node Type": "LockRows", "Plans": [below]}]});
    // The probes' locked rows merged by a sort above their locks: the claim's own plan.
    assert!(walk(json!({"Node Type": "Update", "Plans": [
        {"Node Type": "Sort", "Plans": [{"Node Type": "Nested Loop", "Plans": [
            {"Node Type": "Function Scan"}, locked(index.clone())]}]}]})));
    // A probe that sorts what it locks walks no index in order.
    assert!(!walk(locked(
        json!({"Node Type": "Sort", "Plans": [index.clone()]})
    )));
    assert!(!walk(locked(
        json!({"Node Type": "Incremental Sort", "Plans": [index.clone()]})
    )));
    let whole = json!({"Node Type": "Seq Scan", "Relation Name": "etl_job_records"});
    assert!(!walk(locked(whole)));
    // A scan of the small settings table is no growth.
    let queues = json!({"Node Type": "Seq Scan", "Relation Name": "etl_queues"});
    assert!(walk(
        json!({"Node Type": "Nested Loop", "Plans": [queues, locked(index.clone())]})
    ));
    assert!(!walk(
        json!({"Node Type": "Hash Join", "Plans": [locked(index)]})
    ));
    let other = json!({"Node Type": "Index Scan", "Index Name": "etl_job_records_pkey"});
    assert!(!walk(locked(other)), "not the claim index");
    // On a Citus node the plan names the shard's index and table (the name, `_`, the shard id).
    let shard_index =
        json!({"Node Type": "Index Scan", "Index Name": "etl_job_records_claim_idx_102039"});
    assert!(walk(locked(shard_index)));
    let shard = json!({"Node Type": "Seq Scan", "Relation Name": "etl_job_records_102039"});
    assert!(!walk(json!({"Node Type": "Nested Loop", "Plans": [
        shard, locked(json!({"Node Type": "Index Scan", "Index Name": "etl_job_records_claim_idx"}))]})));
    for not_it in [
        "etl_job_records_claim_idx_",
        "etl_job_records_claim_idx_x1",
        "etl_job_records_claim",
    ] {
        let index = json!({"Node Type": "Index Scan", "Index Name": not_it});
        assert!(!walk(locked(index)), "{not_it}");
    }
}

#[test]
fn the_next_due_window_is_the_one_the_statement_reads() {
    assert!(NEXT_DUE_SQL.contains(&format!("LIMIT {NEXT_DUE_WINDOW}\n")));
}

/// Enqueues one job of `kind` per `(queue, priority, run_at)`, through the one enqueue path
/// every kind uses; returns their ids in order.
pub(super) async fn enqueue_into(
    client: &tokio_postgres::Client,
    kind: &str,
    jobs: &[(&str, i16, Option<chrono::DateTime<chrono::Utc>>)],
) -> Vec<uuid::Uuid> {
    let secret = crate::digest::Secret::new("claim-tests-secret-0123").unwrap();
    let submissions = jobs
        .iter()
        .map(
            |&(queue, priority, run_at)| crate::jobs::enqueue::Submission {
                payload: json!({}),
                idempotency_key: None,
                max_attempts: 3,
                run_at,
                replaces: None,
                queue: Some(queue),
                priority,
                concurrency_key: None,
                dated: false,
                retain: None,
            },
        )
        .collect();
    crate::jobs::enqueue::submit(client, &secret, &[7; 32], kind, submissions)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect()
}

#[tokio::test]
async fn a_claim_takes_only_the_queues_it_asks_and_the_kinds_it_runs() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mail = enqueue_into(&client, "test", &[("mail", 0, None); 3]).await;
    let reports = enqueue_into(&client, "test", &[("reports", 0, None); 3]).await;
    let other_kind = enqueue_into(&client, "test.other", &[("mail", 0, None); 2]).await;
    // No job of a queue it was not asked for, nor of a kind it does not run.
    assert!(claim(&client, CLAIMANT, 10).await.unwrap().is_empty());
    let claimed = claim_from(&client, CLAIMANT, &[("mail", 2), ("reports", 5)])
        .await
        .unwrap();
    let mut by_ask: Vec<(usize, uuid::Uuid)> =
        claimed.iter().map(|j| (j.asked_of, j.id())).collect();
    by_ask.sort();
    assert_eq!(
        by_ask,
        vec![
            (0, mail[0]),
            (0, mail[1]),
            (1, reports[0]),
            (1, reports[1]),
            (1, reports[2])
        ],
        "each queue gave at most its count, oldest first, and said which ask it filled"
    );
    // Each job is named after the queue of its ask (its span and logs carry it).
    assert!(claimed
        .iter()
        .all(|j| &*j.queue == ["mail", "reports"][j.asked_of]));
    let runs_both = Claimant {
        kinds: &["test", "test.other"],
        ..CLAIMANT
    };
    let rest = claim_from(&client, runs_both, &[("mail", 10)])
        .await
        .unwrap();
    let mut ids: Vec<uuid::Uuid> = rest.iter().map(ClaimedJob::id).collect();
    ids.sort();
    let mut expected = vec![mail[2], other_kind[0], other_kind[1]];
    expected.sort();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn a_paused_queue_gives_nothing_until_it_is_resumed() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    enqueue_into(&client, "test", &[("mail", 0, None), ("reports", 0, None)]).await;
    client
        .batch_execute("INSERT INTO etl_queues (queue, paused) VALUES ('mail', true)")
        .await
        .unwrap();
    let both = [("mail", 5), ("reports", 5)];
    let claimed = claim_from(&client, CLAIMANT, &both).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].asked_of, 1, "only the queue that is not paused");
    assert!(claim_from(&client, CLAIMANT, &both)
        .await
        .unwrap()
        .is_empty());
    client
        .batch_execute("UPDATE etl_queues SET paused = false")
        .await
        .unwrap();
    assert_eq!(claim_from(&client, CLAIMANT, &both).await.unwrap().len(), 1);
}

#[tokio::test]
async fn priorities_order_a_queue_and_a_job_passed_long_enough_goes_first() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let low = enqueue_into(&client, "test", &[("default", 9, None); 2]).await;
    let high = enqueue_into(&client, "test", &[("default", 0, None); 2]).await;
    let offsets: Vec<f64> = client
        .query(
            "SELECT extract(epoch FROM sort_at - run_at)::float8 FROM etl_job_records
              WHERE id = ANY($1) ORDER BY id",
            &[&[low[0], high[0]].as_slice()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        offsets,
        vec![90.0, 0.0],
        "sort_at = run_at + priority × 10 s"
    );
    // The first low-priority job was due 91 s before the urgent ones (as if it had waited
    // that long behind them): it now goes first; the second still waits for them.
    client
        .execute(
            "UPDATE etl_job_records SET run_at = run_at - interval '91 seconds',
                    sort_at = sort_at - interval '91 seconds'
              WHERE id = $1",
            &[&low[0]],
        )
        .await
        .unwrap();
    let mut one_by_one = Vec::new();
    for _ in 0..4 {
        one_by_one.push(claim(&client, CLAIMANT, 1).await.unwrap()[0].id());
    }
    assert_eq!(one_by_one, vec![low[0], high[0], high[1], low[1]]);
}

#[tokio::test]
async fn the_next_due_time_is_the_earliest_whatever_the_priorities() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let now = chrono::Utc::now();
    let at = |secs: i64| Some(now + chrono::Duration::seconds(secs));
    // The low-priority job is due first but sorts after the urgent one.
    enqueue_into(
        &client,
        "test",
        &[("default", 9, at(600)), ("default", 0, at(630))],
    )
    .await;
    let stats = WorkerStats::default();
    let config = super::claim_pg_config(&db.config).unwrap();
    let session = session(&config, &stats).await;
    let due = next_due_of(&session).await.unwrap();
    assert!(
        due > Duration::from_secs(590) && due <= Duration::from_secs(600),
        "{due:?}"
    );
    // Jobs of another queue or kind are not this replica's to wait for.
    assert!(session
        .next_due(&["mail"], &["test"])
        .await
        .unwrap()
        .is_none());
    assert!(session
        .next_due(&[DEFAULT_QUEUE], &["test.other"])
        .await
        .unwrap()
        .is_none());
}
