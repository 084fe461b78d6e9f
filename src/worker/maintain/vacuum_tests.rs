//! Tests of the vacuum role: when it looks, when it vacuums, that it never waits for another
//! VACUUM, and that vacuuming while jobs are claimed and completed loses and repeats none.

use super::*;
use crate::test_db::TestDb;
use crate::worker::claim::claimer::{self, Claimant};
use crate::worker::complete::completer;
use crate::worker::lease::Lease;
use std::time::Instant;
use tokio_postgres::Client;

/// The claimant of these tests.
const CLAIMANT: Claimant<'static> = Claimant {
    owner_id: "vacuum",
    owner_locked: false,
    lease: Duration::from_secs(60),
    heartbeat_interval: Duration::from_secs(4),
    alive_locked: false,
    kinds: &["test"],
};

/// Enqueues `n` due jobs of kind `test` (intake and live rows, as an enqueue writes them).
async fn enqueue(client: &Client, n: usize) {
    let payloads = vec![serde_json::json!({}); n];
    crate::test_db::insert_jobs(client, "test", &payloads, 5).await;
}

/// The live table's manual vacuums so far, and its live rows, by the statistics (flushed first
/// for this session).
async fn vacuums_and_rows(client: &Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT pg_stat_get_vacuum_count('etl_job_records'::regclass),
                    (SELECT count(*) FROM etl_job_records)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Sends this session's pending statistics now, so `due` reads its writes.
async fn flush_stats(client: &Client) {
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    // The flush happens at the end of the next transaction.
    client.batch_execute("SELECT 1").await.unwrap();
}

/// Deletes `n` live rows (the first by id), leaving as many dead versions, and sends the
/// statistics.
async fn delete_oldest(client: &Client, n: i64) {
    client
        .execute(
            "DELETE FROM etl_job_records
              WHERE id IN (SELECT id FROM etl_job_records ORDER BY id LIMIT $1)",
            &[&n],
        )
        .await
        .unwrap();
    flush_stats(client).await;
}

#[test]
fn a_replica_looks_only_after_it_claimed_jobs() {
    assert!(!churned(5, 5));
    assert!(churned(5, 6));
    assert!(!churned(0, 0));
}

/// Below the bound a look sends the question only; at the bound it vacuums, the dead versions
/// are gone and every live job is still there; then the table is no longer due.
#[tokio::test]
async fn a_look_vacuums_the_live_table_once_its_dead_versions_reach_the_bound() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let shared = crate::worker::shared::for_tests(&db.config, "vacuum").await;
    let before = shared.stats.snapshot().round_trips;

    enqueue(&client, 60_000).await;
    // 40,000 dead versions and 20,000 live rows: below 50,000 + 20,000 / 5.
    delete_oldest(&client, 40_000).await;
    let (vacuums, rows) = vacuums_and_rows(&client).await;
    assert!(!look(&shared).await.unwrap(), "not due yet");
    assert_eq!(vacuums_and_rows(&client).await, (vacuums, rows));
    assert_eq!(shared.stats.snapshot().round_trips - before, 1);

    // 55,000 dead versions and 5,000 live rows: due (51,000).
    delete_oldest(&client, 15_000).await;
    assert!(look(&shared).await.unwrap(), "due");
    assert_eq!(vacuums_and_rows(&client).await, (vacuums + 1, 5_000));
    assert_eq!(shared.stats.snapshot().round_trips - before, 3);
    let reloptions: Vec<String> = client
        .query_one(
            "SELECT reloptions FROM pg_class WHERE oid = 'etl_job_records'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        reloptions.contains(&"vacuum_truncate=false".to_owned()),
        "no VACUUM, autovacuum's either, truncates the table (migration 0040): {reloptions:?}"
    );
    let dead: i64 = client
        .query_one(
            "SELECT pg_stat_get_dead_tuples('etl_job_records'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, 0, "every dead version removed");
    assert!(!look(&shared).await.unwrap(), "no longer due");
}

/// While another transaction holds the lock a VACUUM takes, the role's VACUUM skips the table
/// at once instead of waiting, and does nothing.
#[tokio::test]
async fn a_vacuum_never_waits_for_another() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut holder = db.client().await;
    let (vacuums, _) = vacuums_and_rows(&client).await;
    let tx = holder.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE etl_job_records IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), vacuum(&client, "etl_job_records"))
        .await
        .expect("skipped, not waiting")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    tx.rollback().await.unwrap();
    assert_eq!(
        vacuums_and_rows(&client).await.0,
        vacuums,
        "nothing vacuumed"
    );
    vacuum(&client, "etl_job_records").await.unwrap();
    assert_eq!(vacuums_and_rows(&client).await.0, vacuums + 1);
}

/// VACUUMs back to back while jobs are claimed and succeeded in batches: every job ends
/// `succeeded` exactly once, no live row is left and none is claimed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuuming_while_jobs_are_claimed_and_completed_loses_and_repeats_none() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    enqueue(&client, 3_000).await;
    let stop = CancellationToken::new();
    let vacuumer = {
        let (client, stop) = (db.client().await, stop.clone());
        tokio::spawn(async move {
            let mut runs = 0_u32;
            while !stop.is_cancelled() {
                vacuum(&client, "etl_job_records").await.unwrap();
                runs += 1;
            }
            runs
        })
    };
    let mut seen = std::collections::HashSet::new();
    loop {
        let jobs = claimer::claim(&client, CLAIMANT, 50).await.unwrap();
        if jobs.is_empty() {
            break;
        }
        let entries: Vec<(Lease, Option<crate::job::handler::Output>)> =
            jobs.iter().map(|j| (j.lease(), None)).collect();
        for job in &jobs {
            assert!(seen.insert(job.id()), "claimed twice");
        }
        let fenced = completer::succeed_many(&client, &entries).await.unwrap();
        assert_eq!(fenced.len(), jobs.len(), "every fence held");
    }
    stop.cancel();
    assert!(vacuumer.await.unwrap() >= 1);
    assert_eq!(seen.len(), 3_000);
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM etl_job_records),
                    (SELECT count(*) FROM etl_job_outcomes WHERE status = 'succeeded'),
                    (SELECT count(DISTINCT job_id) FROM etl_job_outcomes)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2)
        ),
        (0, 3_000, 3_000)
    );
}

/// Where `etl_job_records` names a view over one table (as a cell's node view on a Citus node
/// reads its shard), the look reads and vacuums that table; a view over several stays the view,
/// never judged due (nothing to size or vacuum).
#[tokio::test]
async fn a_view_over_one_table_is_looked_through_and_one_over_several_is_not() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA through;
             CREATE VIEW through.etl_job_records AS SELECT * FROM public.etl_job_records;
             SET search_path = through, public",
        )
        .await
        .unwrap();
    assert_eq!(
        due(&client).await.unwrap(),
        None,
        "an empty table is not due"
    );
    let named: String = client.query_one(DUE_SQL, &[&-1i64]).await.unwrap().get(0);
    assert_eq!(named, "public.etl_job_records");
    vacuum(&client, &named).await.unwrap();
    client
        .batch_execute(
            "CREATE OR REPLACE VIEW through.etl_job_records AS
                 SELECT j.* FROM public.etl_job_records j
                  WHERE EXISTS (SELECT 1 FROM public.etl_queues q WHERE q.queue = j.queue)",
        )
        .await
        .unwrap();
    let named: String = client.query_one(DUE_SQL, &[&-1i64]).await.unwrap().get(0);
    assert_eq!(named, "etl_job_records", "the view itself");
}
