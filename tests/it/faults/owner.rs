//! A replica restarted with the same owner id after its node was lost: the old node's session
//! backend still holds the owner lock (the server has not noticed the loss yet), silent.

use super::{replica, until_sessions};
use crate::support::{count, eventually, insert_jobs, signal, Processes, TestDb};
use durable_etl::job::handler::NOOP_KIND;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_after_a_node_loss_takes_over_the_silent_session_a_twin_stops() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut replicas = Processes(vec![replica(&db, "node-a", &[])]);
    until_sessions(&client, 1).await;
    // The node is lost: the process makes no more progress, its session backend lives on.
    signal(&replicas.0[0], "STOP");
    replicas.0.push(replica(&db, "node-a", &[]));
    // The restarted replica neither exits nor runs as a twin: it waits until the holder has been
    // silent long enough, ends it, and takes the owner id.
    let ids = insert_jobs(&client, NOOP_KIND, &[json!({})], 3).await;
    eventually("the restarted replica to run the job", || {
        let client = &client;
        async move { count(client, "etl_jobs WHERE status = 'succeeded'").await == 1 }
    })
    .await;
    assert_eq!(ids.len(), 1);
    assert!(
        replicas.0[1].try_wait().unwrap().is_none(),
        "the restarted replica exited"
    );
    // The old process comes back: its session is gone and the owner id is taken, so it stops
    // with owner_id_in_use instead of running beside the new one.
    signal(&replicas.0[0], "CONT");
    let mut old = replicas.0.remove(0);
    let status = tokio::task::spawn_blocking(move || old.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(replicas.0[0].try_wait().unwrap().is_none());
}

/// When the restarted replica takes the owner id over from the lost node's silent session, that
/// node may still be running its jobs, cut off and trusting their leases: only the rows past the
/// old incarnation's trust window are released; a job it still trusts stays `running` under its
/// claim (left to its lease) instead of running a second time at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_owner_id_releases_only_the_rows_the_lost_node_no_longer_trusts() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let args = ["--lease", "60s"];
    let mut replicas = Processes(vec![replica(&db, "node-b", &args)]);
    until_sessions(&client, 1).await;
    let [trusted] = insert_jobs(&client, NOOP_KIND, &[json!({"pause_ms": 600_000})], 3).await[..]
    else {
        unreachable!()
    };
    eventually("the lost node to run its job", || {
        let client = &client;
        async move { count(client, "etl_job_records WHERE status = 'running'").await == 1 }
    })
    .await;
    let claim: uuid::Uuid = client
        .query_one(
            "SELECT lease_claim_id FROM etl_job_records WHERE id = $1",
            &[&trusted],
        )
        .await
        .unwrap()
        .get(0);
    // The node is lost (its session backend lives on, silent). Beside its job, a row of its own
    // that it stopped trusting long ago (renewed 500 s ago, of a 600 s lease; trusted for 480 s).
    signal(&replicas.0[0], "STOP");
    let [untrusted] = insert_jobs(&client, NOOP_KIND, &[json!({})], 3).await[..] else {
        unreachable!()
    };
    client
        .execute(
            "UPDATE etl_job_records
                SET status = 'running', attempts = 1, lease_owner_id = 'node-b',
                    lease_claim_id = gen_random_uuid(), lease_owner_locked = true,
                    lease_renewed_at = now() - interval '500 seconds',
                    lease_expires_at = now() + interval '100 seconds',
                    started_at = now() - interval '500 seconds'
              WHERE id = $1",
            &[&untrusted],
        )
        .await
        .unwrap();
    replicas.0.push(replica(&db, "node-b", &args));
    eventually("the restarted replica to run the untrusted row", || {
        let client = &client;
        async move {
            count(
                client,
                &format!("etl_jobs WHERE id = '{untrusted}' AND status = 'succeeded'"),
            )
            .await
                == 1
        }
    })
    .await;
    let row = client
        .query_one(
            "SELECT status, lease_claim_id, attempts FROM etl_job_records WHERE id = $1",
            &[&trusted],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, Option<uuid::Uuid>>(1),
            row.get::<_, i32>(2)
        ),
        ("running".to_owned(), Some(claim), 1),
        "the job the lost node still trusts was left to its lease"
    );
    signal(&replicas.0[0], "KILL");
}
