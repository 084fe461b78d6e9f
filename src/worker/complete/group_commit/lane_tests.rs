//! The lanes' gathering, through [`GroupCommit`] itself: while one lane commits, the other
//! forms its batch from everything that arrives until that commit ends; with no other commit
//! running, a job commits at once.

use super::super::tests::{ready, Scratch, Scripted, SUCCEEDED};
use super::super::GroupCommit;
use crate::worker::complete::completer::Transition;
use crate::worker::stats::WorkerStats;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_one_lane_commits_the_other_gathers_what_arrives_into_one_batch() {
    let (db, jobs) = Scratch::waiting_for_locks(5, Duration::from_secs(60)).await;
    // Another session inserted target row `k` and has not committed: job 0's effects wait for
    // it, so its lane is committing until the test lets it go.
    let mut holder = crate::db::connect(&db.db.config, "test").await.unwrap();
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
         VALUES (decode(repeat('ab', 32), 'hex'), 'd', 'k', '{}', $1)",
        &[&jobs[0].0],
    )
    .await
    .unwrap();
    let stats = Arc::new(WorkerStats::default());
    // A gather limit far longer than the test: only the end of the other commit ends the
    // gathering here.
    let lanes = GroupCommit::gathering(
        db.pool.clone(),
        Arc::clone(&stats),
        16,
        Duration::from_secs(600),
    );
    let minute = Duration::from_secs(60);
    let commit = |job: (uuid::Uuid, uuid::Uuid), effects: Box<dyn crate::job::handler::Effects>| {
        let lanes = lanes.clone();
        tokio::spawn(async move { lanes.commit(ready(job, effects, minute)).await })
    };
    let blocked = commit(jobs[0], Box::new(Scripted::Write(jobs[0].0, "k")));
    while stats.snapshot().commit_batches < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Three jobs arrive one by one while job 0's lane commits: one batch of three, not three.
    let mut gathered = Vec::new();
    for job in &jobs[1..4] {
        gathered.push(commit(*job, Box::new(crate::job::handler::NoEffects)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats.snapshot().commit_batches, 1, "nothing committed yet");
    tx.rollback().await.unwrap();
    assert!(matches!(blocked.await.unwrap(), Ok(Transition::Succeeded)));
    for job in gathered {
        assert!(matches!(job.await.unwrap(), Ok(Transition::Succeeded)));
    }
    assert_eq!(stats.snapshot().commit_batches, 2);
    // With no other commit running, a lone job commits at once, not after the gather limit.
    let alone = commit(jobs[4], Box::new(crate::job::handler::NoEffects));
    let settled = tokio::time::timeout(Duration::from_secs(30), alone).await;
    assert!(matches!(
        settled.unwrap().unwrap(),
        Ok(Transition::Succeeded)
    ));
    assert_eq!(stats.snapshot().commit_batches, 3);
    assert_eq!(db.count(SUCCEEDED).await, 5);
}

#[tokio::test(flavor = "current_thread")]
async fn a_job_queued_by_a_task_that_runs_just_after_the_first_joins_its_batch() {
    use super::{Committing, Gather};
    use tokio::sync::{mpsc, Mutex};
    let (sender, receiver) = mpsc::unbounded_channel();
    let gather = Gather {
        receiver: Arc::new(Mutex::new(receiver)),
        max_batch: 16,
        gather_limit: Duration::from_secs(600),
        committing: Committing::default(),
    };
    let lane = tokio::spawn(async move { gather.next_batch().await });
    // The lane now waits for its first job.
    tokio::task::yield_now().await;
    // One claim's two jobs end together: the first wakes the lane, and the task of the second
    // is scheduled after the lane (one thread: in that order).
    sender.send(1).unwrap();
    let second = sender.clone();
    tokio::spawn(async move { second.send(2).unwrap() });
    assert_eq!(lane.await.unwrap(), Some(vec![1, 2]), "one batch, not two");
}
