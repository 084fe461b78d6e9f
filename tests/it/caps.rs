//! Concurrency caps: a capped queue never has more running jobs than its cap, every statement
//! that moves a claim out of `running` frees that claim's permit and no other, a stale finisher
//! frees nothing, and a lowered cap is never exceeded again once the permits above it are freed.

use crate::support::{count, versions_above, TestDb};
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

/// A listener on the enqueue channel (and `test_sentinel`), with a replica `other` registered as
/// waiting for queue `capped`.
async fn waited_for(db: &TestDb, client: &tokio_postgres::Client) -> crate::support::Listener {
    let listener =
        crate::support::Listener::start(db, &["durable_etl_jobs", "test_sentinel"]).await;
    client
        .batch_execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues) VALUES ('other', '{capped}')",
        )
        .await
        .unwrap();
    listener
}

/// The notifications `listener` received until now (a sentinel sent on `client` ends them).
async fn wakes(
    client: &tokio_postgres::Client,
    listener: &mut crate::support::Listener,
) -> Vec<(String, String)> {
    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    listener.drain_until("test_sentinel").await
}

/// The handle the tests enqueue with.
fn handle() -> Jobs {
    Jobs::new(
        Secret::new(b"caps-secret-0123456789".to_vec()).unwrap(),
        "t",
    )
}

/// A test database with `jobs` jobs in queue `capped`, capped at `cap`.
async fn capped_queue(jobs: i64, cap: i32) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "capped", Some(cap)).await.unwrap();
    let handle = handle();
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

/// The `(permit slot, claim id)` of every running job, by slot.
async fn running_by_slot(client: &tokio_postgres::Client) -> Vec<(i32, uuid::Uuid)> {
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
    slots
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
    let slots = running_by_slot(&client).await;
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

/// A cap lowered while more jobs run than the new cap claims nothing while the queue's running
/// jobs are at or above the new cap, whichever of them ends first (here the lowest slots, while
/// a permit above the new cap stays held); running jobs finish.
#[tokio::test]
async fn a_lowered_cap_is_never_exceeded_by_a_claim_while_a_permit_above_it_is_held() {
    let (_db, client) = capped_queue(10, 3).await;
    let who = claimant("lowered-under", Duration::from_secs(60));
    let running = claim(&client, who, 5).await;
    assert_eq!(running.len(), 3);
    queue::set_cap(&client, "capped", Some(2)).await.unwrap();
    let slots = running_by_slot(&client).await;
    let job_of = |claim: uuid::Uuid| running.iter().find(|j| j.claim_id() == claim).unwrap();
    for (slot, claim_id) in slots.iter().take(2) {
        let done = completer::succeed_many(&client, &[(job_of(*claim_id).lease(), None)]).await;
        assert_eq!(done.unwrap().len(), 1, "slot {slot} ends");
        let before = held(&client).await.0;
        let claimed = claim(&client, who, 5).await.len();
        let after = held(&client).await.0;
        crate::support::assert_within_lowered_cap(*slot, 2, (before, claimed, after));
    }
    assert_eq!(held(&client).await.0, 2, "the new cap, no more");
}

#[tokio::test]
async fn an_enqueue_into_a_capped_queue_names_it_like_any_other() {
    let (_db, client) = capped_queue(1, 1).await;
    let handle = handle();
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
        _ctx: &durable_etl::job::handler::JobContext,
    ) -> Result<(), durable_etl::job::handler::JobError> {
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
        durable_etl::job::handler::Registry::new().perform(gauge.clone())
    })
    .await;
    let handle = handle();
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

/// A permit freed by its holder's completion (success, retry, failure) wakes nobody, even while
/// a replica waits for its queue (migration 0023: the holder claims next, or wakes the others
/// itself); a permit freed by a release or by recovery wakes the waiting replica in its own
/// statement.
#[tokio::test]
async fn a_completion_frees_its_permit_without_a_wake_and_a_release_or_recovery_wakes_the_waiting()
{
    let (db, client) = capped_queue(6, 6).await;
    let mut listener = waited_for(&db, &client).await;
    let jobs = claim(&client, claimant("holder", Duration::from_secs(60)), 6).await;
    assert_eq!(jobs.len(), 6);
    assert!(
        jobs.iter().all(|j| j.held_permit),
        "each claim holds a permit"
    );
    let succeeded = completer::succeed_many(&client, &[(jobs[0].lease(), None)]).await;
    assert_eq!(succeeded.unwrap().len(), 1);
    let retried = completer::retry(&client, jobs[1].lease(), Duration::ZERO).await;
    assert_eq!(retried.unwrap(), Transition::Retried);
    let failed = completer::fail(&client, jobs[2].lease(), Code::HandlerFailed, None).await;
    assert_eq!(failed.unwrap(), Transition::Failed(Code::HandlerFailed));
    assert_eq!(held(&client).await, (3, 3, 0), "three permits freed");
    assert_eq!(
        wakes(&client, &mut listener).await,
        vec![],
        "no completion woke anyone"
    );
    let released = completer::release(&client, &[jobs[3].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    let wake = ("durable_etl_jobs".to_owned(), "q capped".to_owned());
    assert_eq!(
        wakes(&client, &mut listener).await,
        vec![wake.clone()],
        "the release woke the waiting replica"
    );
    assert_eq!(crate::support::expire_and_recover(&client).await, 2);
    assert_eq!(
        wakes(&client, &mut listener).await,
        vec![wake.clone()],
        "recovery woke it"
    );
    assert_eq!(held(&client).await, (0, 0, 0));
    // What a completer that will not claim again sends after its commit.
    completer::wake_waiting(&client, &["capped"]).await.unwrap();
    assert_eq!(wakes(&client, &mut listener).await, vec![wake]);
}

/// One replica of 8 slots on a queue capped at 2, polling once a minute, with a backlog of 20
/// short jobs: it claims each freed permit's next job itself, so the jobs flow with no poll and
/// (no other replica being there to race it) its completions wake nobody until the queue runs
/// dry: at most one wake per permit then, where every completion woke the waiting replicas
/// before migration 0023.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_that_frees_a_permit_claims_its_next_job_without_waking_anyone() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "gauged", Some(2)).await.unwrap();
    let handle = handle();
    let jobs: Vec<Gauged> = (0..20).map(|_| Gauged { ms: 15 }).collect();
    handle.enqueue_many(&client, &jobs).await.unwrap();
    let mut listener =
        crate::support::Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let gauge = Gauge::default();
    let replicas = crate::support::start_queue_replicas(&db, "gauged", 1, || {
        durable_etl::job::handler::Registry::new().perform(gauge.clone())
    })
    .await;
    crate::support::eventually("the 20 capped jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 20 }
    })
    .await;
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    let woken = wakes(&client, &mut listener).await.len();
    assert!(
        woken <= 2,
        "{woken} wakes: one per permit at most, once dry"
    );
    assert_eq!(gauge.most.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE attempts = 1").await,
        20
    );
}

/// A job of the queue `gauged` of a second kind, which only the other replica runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Other {
    /// How long it computes, in milliseconds.
    ms: u64,
}

impl Job for Other {
    const KIND: &'static str = "test.gauged_other";
    const QUEUE: &'static str = "gauged";
}

/// The handler of [`Other`] jobs, counting them with the same [`Gauge`].
#[derive(Clone)]
struct OtherGauge(Gauge);

impl durable_etl::Perform for OtherGauge {
    type Job = Other;
    type Effects = ();

    async fn compute(
        &self,
        job: Other,
        ctx: &durable_etl::job::handler::JobContext,
    ) -> Result<(), durable_etl::job::handler::JobError> {
        durable_etl::Perform::compute(&self.0, Gauged { ms: job.ms }, ctx).await
    }
}

/// Two replicas polling once a minute on a queue capped at 1, each running a kind the other does
/// not, with the two kinds' jobs alternating: a replica whose freed permit's next job is of the
/// other kind claims nothing of it, and wakes the other replica, so the jobs flow with no poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_permit_whose_next_job_its_replica_does_not_run_wakes_the_others() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "gauged", Some(1)).await.unwrap();
    let handle = handle();
    // Before the replicas start, so only the wakes of freed permits can move them.
    for _ in 0..6 {
        let options = EnqueueOptions::default;
        handle
            .enqueue(&client, &Gauged { ms: 10 }, options())
            .await
            .unwrap();
        handle
            .enqueue(&client, &Other { ms: 10 }, options())
            .await
            .unwrap();
    }
    let gauge = Gauge::default();
    let mut replicas = crate::support::start_queue_replicas(&db, "gauged", 1, || {
        durable_etl::job::handler::Registry::new().perform(gauge.clone())
    })
    .await;
    let registry = durable_etl::job::handler::Registry::new().perform(OtherGauge(gauge.clone()));
    replicas
        .push(crate::support::start_queue_replica(&db, "gauged", "gauged-other", registry).await);
    crate::support::eventually("the 12 jobs of both kinds to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 12 }
    })
    .await;
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    assert_eq!(gauge.most.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A replica that drains at shutdown claims nothing more: the permit its last job frees wakes the
/// replica waiting for the queue (polling once a minute), which runs the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_replica_wakes_the_waiting_for_the_permits_its_last_jobs_free() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "gauged", Some(1)).await.unwrap();
    let gauge = Gauge::default();
    let registry = || durable_etl::job::handler::Registry::new().perform(gauge.clone());
    let mut first = crate::support::start_queue_replicas(&db, "gauged", 1, registry).await;
    let handle = handle();
    let mut jobs = vec![Gauged { ms: 400 }];
    jobs.extend((0..3).map(|_| Gauged { ms: 5 }));
    handle.enqueue_many(&client, &jobs).await.unwrap();
    crate::support::eventually("the long job to run", || {
        let client = &client;
        async move { count(client, "etl_job_records WHERE status = 'running'").await == 1 }
    })
    .await;
    let second =
        crate::support::start_queue_replica(&db, "gauged", "gauged-second", registry()).await;
    crate::support::eventually("the second replica to wait", || {
        let client = &client;
        async move {
            count(
                client,
                "etl_waiting_replicas WHERE owner_id = 'gauged-second'",
            )
            .await
                == 1
        }
    })
    .await;
    first.pop().unwrap().stop().await.unwrap();
    crate::support::eventually("the 4 capped jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 4 }
    })
    .await;
    second.stop().await.unwrap();
    assert_eq!(gauge.most.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Migration 0023 is additive for readers (release 22 never marks its completions) and round
/// trips: below it, a completion's freed permit wakes the waiting replicas again; above it, it
/// wakes nobody.
/// A fenced failure as a release at schema 22 wrote it (`$1` job id, `$2` claim id): the live
/// row deleted, its queue permit freed, its outcome appended, without the columns of later
/// migrations.
const FAIL_AT_22_SQL: &str = "
WITH ended AS (
    DELETE FROM etl_job_records AS j
     WHERE j.id = $1 AND j.lease_claim_id = $2 AND j.status = 'running'
 RETURNING j.id, j.owner_key, j.attempts, j.run_at, j.started_at, j.lease_claim_id, j.queue,
           j.permit_slot
), freed AS (
    UPDATE etl_queue_permits AS x SET claim_id = NULL
      FROM ended AS e
     WHERE x.queue = e.queue AND x.slot = e.permit_slot AND x.claim_id = e.lease_claim_id
)
INSERT INTO etl_job_outcomes
       (job_id, owner_key, status, attempts, run_at, lease_claim_id, failure_code, started_at,
        finished_at)
SELECT id, owner_key, 'failed', attempts, run_at, lease_claim_id, 'handler_failed', started_at,
       statement_timestamp()
  FROM ended";

#[tokio::test]
async fn migration_0023_is_additive_and_round_trips_with_capped_jobs_running() {
    let (db, mut client) = capped_queue(4, 4).await;
    let latest = crate::support::catalog_snapshot(&client).await;
    let mut listener = waited_for(&db, &client).await;
    let jobs = claim(&client, claimant("rolling", Duration::from_secs(60)), 4).await;
    let min_reader: i32 = client
        .query_one(
            "SELECT min_reader_version FROM durable_etl_schema_history WHERE version = 23",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(min_reader, 22, "release 22 reads it");
    let down = durable_etl::schema::migrate_down_to(&mut client, 22)
        .await
        .unwrap();
    assert_eq!((down.changed, down.version), (versions_above(22, true), 22));
    // Ended the way code of that schema ends it, by a failure that frees its permit: this
    // release's own statements write the columns of 0033 (success) and 0036 (failure), which are
    // not there below them.
    let lease = jobs[0].lease();
    let ended = client
        .execute(FAIL_AT_22_SQL, &[&lease.job_id, &lease.claim_id])
        .await
        .unwrap();
    assert_eq!(ended, 1);
    assert_eq!(
        wakes(&client, &mut listener).await,
        vec![("durable_etl_jobs".to_owned(), String::new())],
        "below 0023 a completion wakes the waiting replica"
    );
    let up = durable_etl::schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.changed, versions_above(22, false));
    assert_eq!(crate::support::catalog_snapshot(&client).await, latest);
    completer::succeed_many(&client, &[(jobs[1].lease(), None)])
        .await
        .unwrap();
    assert_eq!(wakes(&client, &mut listener).await, vec![]);
    assert_eq!(held(&client).await, (2, 2, 0), "no job or permit lost");
    drop(db);
}
