//! A replica restarted with the same owner id after its node was lost: the old node's session
//! backend still holds the owner lock (the server has not noticed the loss yet), silent.

use super::{replica, until_sessions};
use crate::support::{count, eventually, insert_jobs, signal, Processes, TestDb};
use durable_etl::handler::NOOP_KIND;
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
