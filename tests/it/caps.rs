//! Concurrency caps: a capped queue never has more running jobs than its cap, every statement
//! that moves a claim out of `running` frees that claim's permit and no other, a stale finisher
//! frees nothing, and a lowered cap is never exceeded again once the permits above it are freed.

use crate::support::{count, TestDb};
use durable_etl::codes::Code;
use durable_etl::queue;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer::{self, Transition};
use durable_etl::worker::lease::{ClaimedJob, Lease};
use durable_etl::{EnqueueOptions, Job, Jobs, Secret};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A job of the capped queue `capped`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Capped {
    /// Which job.
    n: i64,
}

impl Job for Capped {
    const KIND: &'static str = "test.capped";
    const QUEUE: &'static str = "capped";
}

/// A replica-like claimant of `capped` jobs with a lease of `lease`.
fn claimant(owner_id: &str, lease: Duration) -> Claimant<'_> {
    Claimant {
        owner_id,
        owner_locked: false,
        lease,
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: &["test.capped"],
    }
}

/// A test database with `jobs` jobs in queue `capped`, capped at `cap`.
async fn capped_queue(jobs: i64, cap: i32) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "capped", Some(cap)).await.unwrap();
    let handle = Jobs::new(
        Secret::new(b"caps-secret-0123456789".to_vec()).unwrap(),
        "t",
    );
    let all: Vec<Capped> = (0..jobs).map(|n| Capped { n }).collect();
    handle.enqueue_many(&client, &all).await.unwrap();
    (db, client)
}

/// Claims up to `n` capped jobs as `who`.
async fn claim(client: &tokio_postgres::Client, who: Claimant<'_>, n: usize) -> Vec<ClaimedJob> {
    claimer::claim_from(client, who, &[("capped", n)])
        .await
        .unwrap()
}

/// `(running jobs of the queue, permits held, permits held by a claim that is not running)`.
async fn held(client: &tokio_postgres::Client) -> (i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM etl_job_records WHERE queue = 'capped' AND status = 'running'),
                    (SELECT count(*) FROM etl_queue_permits WHERE claim_id IS NOT NULL),
                    (SELECT count(*) FROM etl_queue_permits p
                      WHERE p.claim_id IS NOT NULL AND NOT EXISTS (
                            SELECT FROM etl_job_records j
                             WHERE j.lease_claim_id = p.claim_id AND j.status = 'running'
                               AND j.permit_slot = p.slot))",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn a_capped_queue_claims_only_its_free_permits_and_every_exit_frees_its_own() {
    let (_db, client) = capped_queue(10, 2).await;
    let who = claimant("capper", Duration::from_secs(60));
    let first = claim(&client, who, 5).await;
    assert_eq!(first.len(), 2, "no more than the cap");
    assert!(claim(&client, who, 5).await.is_empty(), "no permit is free");
    assert_eq!(held(&client).await, (2, 2, 0));
    // A failure frees its permit: one more job may run.
    let lease = first[0].lease();
    let failed = completer::fail(&client, lease, Code::HandlerFailed, None).await;
    assert!(matches!(failed.unwrap(), Transition::Failed(_)));
    assert_eq!(held(&client).await, (1, 1, 0));
    let second = claim(&client, who, 5).await;
    assert_eq!(second.len(), 1);
    // A retry frees it too (the job waits, its permit does not).
    let retried = completer::retry(&client, second[0].lease(), Duration::ZERO).await;
    assert_eq!(retried.unwrap(), Transition::Retried);
    assert_eq!(held(&client).await, (1, 1, 0));
    // A release (shutdown), a success and a recovery each free theirs.
    let third = claim(&client, who, 5).await;
    assert_eq!(third.len(), 1);
    let released = completer::release(&client, &[third[0].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    let fourth = claim(&client, who, 5).await;
    assert_eq!(fourth.len(), 1);
    let succeeded = completer::succeed_many(&client, &[(fourth[0].lease(), None)]).await;
    assert_eq!(succeeded.unwrap().len(), 1);
    assert_eq!(held(&client).await, (1, 1, 0));
    // The first claim's other job: its lease expires and recovery gives it back.
    assert_eq!(crate::support::expire_and_recover(&client).await, 1);
    assert_eq!(
        held(&client).await,
        (0, 0, 0),
        "every permit free once nothing runs"
    );
    assert_eq!(
        claim(&client, who, 5).await.len(),
        2,
        "the cap again, no more"
    );
}

#[tokio::test]
async fn a_stale_finisher_frees_nothing_and_the_cap_holds() {
    let (_db, client) = capped_queue(3, 1).await;
    let stale_owner = claimant("stalled", Duration::from_secs(60));
    let [stale] = &claim(&client, stale_owner, 1).await[..] else {
        unreachable!()
    };
    let stale: Lease = stale.lease();
    // Its lease runs out while it is paused: recovery gives the job back and frees the permit;
    // another replica claims the job again, and its claim holds the permit.
    assert_eq!(crate::support::expire_and_recover(&client).await, 1);
    let fresh = claim(&client, claimant("fresh", Duration::from_secs(60)), 1).await;
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0].id(), stale.job_id, "the same job, claimed again");
    // The stale replica wakes and finishes in every way it could: none moves a row, none frees
    // the new claim's permit.
    let lost = completer::fail(&client, stale, Code::HandlerFailed, None).await;
    assert_eq!(lost.unwrap(), Transition::LeaseLost);
    let lost = completer::retry(&client, stale, Duration::ZERO).await;
    assert_eq!(lost.unwrap(), Transition::LeaseLost);
    assert_eq!(completer::release(&client, &[stale], &[]).await.unwrap(), 0);
    let none = completer::succeed_many(&client, &[(stale, None)]).await;
    assert!(none.unwrap().is_empty());
    assert_eq!(
        held(&client).await,
        (1, 1, 0),
        "the new claim still holds the one permit"
    );
    assert!(
        claim(&client, claimant("third", Duration::from_secs(60)), 3)
            .await
            .is_empty(),
        "cap 1: nothing else runs"
    );
}

#[tokio::test]
async fn a_lowered_cap_is_never_exceeded_once_the_permits_above_it_are_freed() {
    let (_db, client) = capped_queue(10, 3).await;
    let who = claimant("lowering", Duration::from_secs(60));
    let running = claim(&client, who, 5).await;
    assert_eq!(running.len(), 3);
    queue::set_cap(&client, "capped", Some(1)).await.unwrap();
    // The held permits stay held; each one freed above the cap is never taken again.
    assert!(claim(&client, who, 5).await.is_empty());
    let mut slots: Vec<(i32, uuid::Uuid)> = client
        .query(
            "SELECT permit_slot, lease_claim_id FROM etl_job_records WHERE status = 'running'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    slots.sort();
    let job_of = |claim: uuid::Uuid| running.iter().find(|j| j.claim_id() == claim).unwrap();
    // Slot 3 then 2 end: still nothing to claim, slot 1 is held.
    for (_, claim_id) in slots.iter().rev().take(2) {
        let lease = job_of(*claim_id).lease();
        completer::fail(&client, lease, Code::HandlerFailed, None)
            .await
            .unwrap();
        assert!(claim(&client, who, 5).await.is_empty());
    }
    // Slot 1 ends: one job runs again, never more.
    let lease = job_of(slots[0].1).lease();
    completer::fail(&client, lease, Code::HandlerFailed, None)
        .await
        .unwrap();
    assert_eq!(claim(&client, who, 5).await.len(), 1);
    assert_eq!(
        count(&client, "etl_queue_permits").await,
        3,
        "held ones are kept to be freed"
    );
    queue::set_cap(&client, "capped", Some(1)).await.unwrap();
    assert_eq!(
        count(&client, "etl_queue_permits").await,
        1,
        "free ones above the cap go"
    );
    // Uncapped, the queue claims as it comes; a bad cap is refused.
    queue::set_cap(&client, "capped", None).await.unwrap();
    assert_eq!(claim(&client, who, 10).await.len(), 6);
    for bad in [0, 10_001] {
        assert!(matches!(
            queue::set_cap(&client, "capped", Some(bad)).await,
            Err(durable_etl::Error::Config(_))
        ));
    }
}

#[tokio::test]
async fn an_enqueue_into_a_capped_queue_names_it_like_any_other() {
    let (_db, client) = capped_queue(1, 1).await;
    let handle = Jobs::new(
        Secret::new(b"caps-secret-0123456789".to_vec()).unwrap(),
        "t",
    );
    let elsewhere = EnqueueOptions {
        queue: Some("default"),
        ..EnqueueOptions::default()
    };
    handle
        .enqueue(&client, &Capped { n: 9 }, elsewhere)
        .await
        .unwrap();
    let both = claimer::claim_from(
        &client,
        claimant("both", Duration::from_secs(60)),
        &[("capped", 5), ("default", 5)],
    )
    .await
    .unwrap();
    assert_eq!(
        both.len(),
        2,
        "one of the capped queue, one of the uncapped"
    );
    let slots: Vec<Option<i32>> = client
        .query(
            "SELECT permit_slot FROM etl_job_records WHERE status = 'running' ORDER BY queue",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        slots,
        vec![Some(1), None],
        "only the capped queue's job holds a permit"
    );
}

/// A job of the queue `gauged`, which its handler counts while it runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gauged {
    /// How long it computes, in milliseconds.
    ms: u64,
}

impl Job for Gauged {
    const KIND: &'static str = "test.gauged";
    const QUEUE: &'static str = "gauged";
}

/// Counts the jobs it runs at once, across every replica of the test, and the most it saw.
#[derive(Clone, Default)]
struct Gauge {
    /// Running now.
    now: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The most at once.
    most: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl durable_etl::Perform for Gauge {
    type Job = Gauged;
    type Effects = ();

    async fn compute(
        &self,
        job: Gauged,
        _ctx: &durable_etl::handler::JobContext,
    ) -> Result<(), durable_etl::handler::JobError> {
        use std::sync::atomic::Ordering::SeqCst;
        let running = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(running, SeqCst);
        tokio::time::sleep(Duration::from_millis(job.ms)).await;
        self.now.fetch_sub(1, SeqCst);
        Ok(())
    }
}

/// Two replicas of 8 slots on a queue capped at 3, polling once a minute: the handler-side count
/// never passes the cap and reaches it, and the jobs flow only because every freed permit wakes a
/// replica (a poll would take a minute per round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_never_run_more_than_the_cap_and_a_freed_permit_wakes_them() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "gauged", Some(3)).await.unwrap();
    let gauge = Gauge::default();
    let replicas = crate::support::start_queue_replicas(&db, "gauged", 2, || {
        durable_etl::handler::Registry::new().perform(gauge.clone())
    })
    .await;
    let handle = Jobs::new(
        Secret::new(b"caps-secret-0123456789".to_vec()).unwrap(),
        "t",
    );
    let jobs: Vec<Gauged> = (0..30).map(|_| Gauged { ms: 20 }).collect();
    handle.enqueue_many(&client, &jobs).await.unwrap();
    crate::support::eventually("the 30 capped jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 30 }
    })
    .await;
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    let most = gauge.most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, 3, "the cap, reached and never passed");
    assert_eq!(
        count(&client, "etl_queue_permits WHERE claim_id IS NOT NULL").await,
        0
    );
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE attempts = 1").await,
        30,
        "each ran once"
    );
}
