//! Claim sessions against databases of the shared template harness: the prepared claim, its
//! plan check, and the fallback when the check fails.

use super::*;
use crate::test_db::TestDb;
use serde_json::json;

/// The claimant of these tests.
const CLAIMANT: Claimant<'static> = Claimant {
    owner_id: "claim-session",
    owner_locked: false,
    lease: Duration::from_secs(30),
    heartbeat_interval: std::time::Duration::from_secs(4),
    alive_locked: false,
};

/// A fresh database with `due` due jobs and one deferred an hour, and the claim sessions'
/// configuration on it.
async fn with_jobs(due: i32) -> (TestDb, tokio_postgres::Config) {
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
             INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
             SELECT id, owner_key, kind, '{}', max_attempts, run_at FROM intake",
            &[&due],
        )
        .await
        .unwrap();
    let config = db::claim_pg_config(&db.config).unwrap();
    (db, config)
}

/// A claim session on a new connection of `config`.
async fn session(config: &tokio_postgres::Config, stats: &WorkerStats) -> ClaimSession {
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    ClaimSession::open(client, stats).await.unwrap()
}

/// `(generic plans, custom plans)` the session has built for the claim so far.
async fn plans_built(session: &ClaimSession) -> (i64, i64) {
    let row = session
        .client
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements
              WHERE statement = $1",
            &[&CLAIM_SQL],
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
    assert_eq!(session.claim(CLAIMANT, 2).await.unwrap().len(), 2);
    assert_eq!(session.claim(CLAIMANT, 5).await.unwrap().len(), 1);
    assert!(session.claim(CLAIMANT, 5).await.unwrap().is_empty());
    // Every claim ran the one generic plan that was checked; none was planned for its values.
    let (generic, custom) = plans_built(&session).await;
    assert!(generic >= 1, "generic plans {generic}");
    assert_eq!(custom, 0);
    let due = session.next_due().await.unwrap().unwrap();
    assert!(due > Duration::from_secs(3000) && due <= Duration::from_secs(3600));
    assert_eq!(stats.snapshot().claim_plan_fallbacks, 0);
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
    let plan = explain_prepared_claim(&session.client)
        .await
        .unwrap()
        .to_string();
    assert!(plan.contains("\"Nested Loop\""), "{plan}");
    assert!(plan.contains("\"etl_job_records_pkey\""), "{plan}");
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("Hash"),
        "{plan}"
    );
    assert_eq!(session.claim(CLAIMANT, 100).await.unwrap().len(), 100);
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
    assert!(session.claim(CLAIMANT, 5).await.unwrap().is_empty());
    let now = Instant::now();
    assert!(!session.due_for_recheck(now));
    assert!(session.due_for_recheck(now + RECHECK_AFTER));
}

#[tokio::test]
async fn a_session_whose_claim_plan_fails_its_check_plans_every_claim_and_says_so() {
    // Enough jobs for the table to be judged (JUDGED_FROM_PAGES on disk).
    let (db, config) = with_jobs(2_000).await;
    // Without the pending index no plan can walk it: the check must fail.
    db.client()
        .await
        .batch_execute("DROP INDEX etl_job_records_pending_due_idx")
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
    assert_eq!(session.claim(CLAIMANT, 5).await.unwrap().len(), 5);
    assert!(session.next_due().await.unwrap().is_some());
    assert!(!session.due_for_recheck(Instant::now() + RECHECK_AFTER));
}

#[tokio::test]
async fn the_pool_opens_checked_sessions_and_knows_a_closed_one() {
    let (db, config) = with_jobs(1).await;
    let stats = Arc::new(WorkerStats::default());
    let manager = ClaimSessions {
        connections: PostgresConnectionManager::new(config, NoTls),
        stats: Arc::clone(&stats),
        alive: None,
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
    assert_eq!(pooled.claim(CLAIMANT, 1).await.unwrap().len(), 1);
}

#[test]
fn the_plan_check_wants_the_pending_index_and_no_sort() {
    let index = json!({"Node Type": "Index Scan", "Index Name": "etl_job_records_pending_due_idx"});
    let walk =
        |plan: serde_json::Value| walks_the_pending_index_in_order(&json!([{ "Plan": plan }]));
    assert!(walk(
        json!({"Node Type": "Update", "Plans": [{"Node Type": "Limit", "Plans": [index]}]})
    ));
    assert!(!walk(
        json!({"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [index]}]})
    ));
    assert!(!walk(
        json!({"Node Type": "Limit", "Plans": [{"Node Type": "Seq Scan"}]})
    ));
    assert!(!walk(
        json!({"Node Type": "Incremental Sort", "Plans": [index]})
    ));
}
