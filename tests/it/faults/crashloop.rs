//! A job that crashes its replica on every attempt: it must stop at `max_attempts` while the
//! other jobs keep flowing.

use super::{locked_update_with, replica, until_all_terminal};
use crate::support::{count, enqueue_loads, job_row, signal, Processes, TestDb, LEDGERS};
use std::time::{Duration, Instant};

/// The owner ids of the two replicas.
const OWNERS: [&str; 2] = ["crashy-a", "crashy-b"];

/// Whichever replica runs the poisoned job (under a claim not yet punished) is SIGKILLed and
/// restarted with its owner id, until the job ends. Its load blocks on a row lock the test
/// holds, so "running" lasts until the kill. The job must end `failed` with
/// `lease_expired_exhausted` after exactly `max_attempts` (3) attempts, its payload cleared and
/// nothing written; every other job, enqueued before and during the crashes, succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_crashes_its_replica_every_time_stops_at_max_attempts() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (holder, poisoned) = locked_update_with(&db, &client, 3).await;
    // Each other job can lose at most one attempt per crash (three), so five always suffice.
    enqueue_loads(&client, "before", 30, 2, 5).await;
    let args = [
        "--lock-timeout",
        "60s",
        "--lease",
        "3s",
        "--heartbeat-interval",
        "500ms",
    ];
    let mut replicas = Processes(OWNERS.iter().map(|o| replica(&db, o, &args)).collect());
    let mut punished: Vec<uuid::Uuid> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the poisoned job never ended");
        let row = client
            .query_one(
                "SELECT status, lease_owner_id, lease_claim_id FROM etl_jobs WHERE id = $1",
                &[&poisoned],
            )
            .await
            .unwrap();
        let (status, owner, claim): (String, Option<String>, Option<uuid::Uuid>) =
            (row.get(0), row.get(1), row.get(2));
        if !matches!(status.as_str(), "pending" | "running") {
            break;
        }
        if let (Some(owner), Some(claim)) = (owner, claim) {
            if !punished.contains(&claim) {
                punished.push(claim);
                let slot = OWNERS.iter().position(|o| *o == owner).unwrap();
                signal(&replicas.0[slot], "KILL");
                replicas.0[slot].wait().unwrap();
                if punished.len() == 2 {
                    enqueue_loads(&client, "during", 30, 2, 5).await;
                }
                replicas.0[slot] = replica(&db, &owner, &args);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = job_row(&client, poisoned).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.failure_code.as_deref(),
            row.attempts,
            row.live
        ),
        ("failed", Some("lease_expired_exhausted"), 3, false)
    );
    assert_eq!(punished.len(), 3, "one crash per attempt");
    holder.batch_execute("ROLLBACK").await.unwrap();
    until_all_terminal(&client).await;
    assert_eq!(
        count(
            &client,
            "etl_jobs v WHERE status = 'succeeded' AND attempts <= max_attempts
                          AND NOT EXISTS (SELECT 1 FROM etl_job_records j WHERE j.id = v.id)"
        )
        .await,
        60
    );
    assert_eq!(
        count(
            &client,
            &format!("{LEDGERS} AND (output ->> 'rows_inserted')::int = 2")
        )
        .await,
        60
    );
    assert_eq!(count(&client, LEDGERS).await, 60);
    assert_eq!(
        count(&client, "etl_target_rows WHERE record_key <> 'k'").await,
        120
    );
    assert_eq!(
        count(
            &client,
            "etl_target_rows WHERE record_key = 'k' AND record->>'v' = '0'"
        )
        .await,
        1,
        "the poisoned load never committed"
    );
    for replica in &mut replicas.0 {
        signal(replica, "TERM");
        assert_eq!(replica.wait().unwrap().code(), Some(0));
    }
}
