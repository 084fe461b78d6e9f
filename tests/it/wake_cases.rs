//! Wakes reach a replica able to run the work, and only such work wakes anyone: the cases the
//! wake path of 6a052c4 got wrong (found black-box: due jobs left to the poll, a backlog or a
//! shutdown stalled behind an open enqueue, wakes for work nobody may claim). Every replica here
//! polls once a minute, so the poll can never hide a miss, and each test asserts that the work
//! starts (or succeeds) within [`BOUND`], far below the poll; or, for work nobody may claim, that
//! no enqueue woke anyone. Each test proves one case:
//! - an enqueue transaction left open never silences another producer, whether it then rolls
//!   back or commits (its own job then runs at its commit);
//! - the waiting row of a replica that died does not absorb the wake of a live one;
//! - jobs recovered by one replica wake a waiting replica of their queue;
//! - an open enqueue never stalls a replica's backlog or its shutdown (what the replica writes
//!   about its waiting never waits for the enqueue's locks);
//! - resuming a queue, raising or lifting its cap, and raising its key cap each wake a waiting
//!   replica for the due jobs they make claimable;
//! - an enqueue into a paused queue, or into a capped queue whose permits are all held, wakes
//!   nobody (no NOTIFY, no claim).

use crate::handlers::{Noop, Scripted, NOOP, SCRIPTED};
use crate::support::{count, eventually, insert_jobs, Listener, TestDb};
use crate::wake::{config, Replica};
use durable_etl::job::handler::{JobContext, JobError, Registry};
use durable_etl::queue;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::{EnqueueOptions, Job, Jobs, Perform, Secret, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How long a wake may take to start the work it announces: far below the minute-long poll of
/// every replica here, so only a wake can meet it.
const BOUND: Duration = Duration::from_secs(5);

/// The poll interval of every replica here.
const MINUTE: Duration = Duration::from_secs(60);

/// The channel the tests' own sentinel NOTIFY goes on.
const SENTINEL: &str = "wake_cases_sentinel";

/// Waits until `measure` reads `expected`, for at most [`BOUND`]; panics naming `what`, with the
/// last reading and the time waited, otherwise.
async fn promptly<F, Fut>(what: &str, expected: i64, mut measure: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = i64>,
{
    let start = Instant::now();
    loop {
        let now = measure().await;
        if now == expected {
            return;
        }
        assert!(
            start.elapsed() < BOUND,
            "{what}: {now} of {expected} after {:?} (the poll is a minute away)",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many jobs have succeeded.
async fn succeeded(client: &tokio_postgres::Client) -> i64 {
    count(client, "etl_job_outcomes WHERE status = 'succeeded'").await
}

/// Whether job `id` has succeeded (1) or not (0).
async fn succeeded_job(client: &tokio_postgres::Client, id: uuid::Uuid) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM etl_job_outcomes WHERE job_id = $1 AND status = 'succeeded'",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until `replica` has begun waiting for work `waits` times in all (registered, settled).
async fn until_waits(replica: &Replica, waits: u64) {
    eventually(&format!("the replica's wait number {waits}"), || {
        let stats = replica.stats.snapshot();
        async move { stats.waits >= waits }
    })
    .await;
}

/// Starts a no-op replica `owner` with 4 slots, polling once a minute, and waits until it waits
/// for work.
async fn waiting_noop_replica(db: &TestDb, owner: &str) -> Replica {
    let replica =
        Replica::start_with(db, config(owner, MINUTE, 4), Registry::new().register(Noop)).await;
    until_waits(&replica, 1).await;
    replica
}

/// A job of the queue `chores`, unless its enqueue names another.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chore {
    /// Which chore.
    n: i64,
}

impl Job for Chore {
    const KIND: &'static str = "test.chore";
    const QUEUE: &'static str = "chores";
}

/// Runs chores: counts each one it starts, then waits for a permit of its gate (if it has one),
/// which it keeps.
#[derive(Clone, Default)]
struct Chores {
    /// Chores started.
    started: Arc<AtomicI64>,
    /// When set, each chore waits for one of its permits before it ends.
    gate: Option<Arc<Semaphore>>,
}

impl Chores {
    /// A handler whose chores each wait for a permit of the returned gate.
    fn gated() -> (Arc<Semaphore>, Chores) {
        let gate = Arc::new(Semaphore::new(0));
        let chores = Chores {
            gate: Some(Arc::clone(&gate)),
            ..Chores::default()
        };
        (gate, chores)
    }

    /// How many chores it started.
    fn started(&self) -> i64 {
        self.started.load(Ordering::SeqCst)
    }
}

impl Perform for Chores {
    type Job = Chore;
    type Effects = ();

    async fn compute(&self, _job: Chore, _ctx: &JobContext) -> Result<(), JobError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        Ok(())
    }
}

/// The handle the tests enqueue chores with.
fn jobs() -> Jobs {
    Jobs::new(
        Secret::new(b"wake-cases-secret-0123456789".to_vec()).unwrap(),
        "t",
    )
}

/// The options of an enqueue into `queue`, with concurrency key `key`.
fn placed<'a>(queue: &'a str, key: Option<&'a str>) -> EnqueueOptions<'a> {
    EnqueueOptions {
        queue: Some(queue),
        concurrency_key: key,
        ..EnqueueOptions::default()
    }
}

/// A configuration of 8 slots, no prefetch, serving `queues`, polling once a minute.
fn serving(owner: &str, queues: &str) -> WorkerConfig {
    WorkerConfig {
        queues: queue::parse(queues).unwrap(),
        prefetch: 0,
        ..config(owner, MINUTE, 8)
    }
}

/// Claims up to one chore of `queue` by hand, as a replica `owner` (a live one, as recovery
/// judges it: only its lease's expiry frees the job) with a minute's lease would.
async fn claim_by_hand(client: &tokio_postgres::Client, owner: &str, queue: &str) -> usize {
    let who = Claimant {
        owner_id: owner,
        owner_locked: false,
        lease: MINUTE,
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: &[Chore::KIND],
    };
    claimer::claim_from(client, who, &[(queue, 1)])
        .await
        .unwrap()
        .len()
}

/// What the test does to the open enqueue transaction once the other producer's job ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Rolls it back.
    RollBack,
    /// Commits it.
    Commit,
}

/// Defect 1: an enqueue transaction A (its own connection) enqueues a due job while the one
/// replica waits, and stays open; producer B then enqueues a due job and commits. B's job must
/// run at once while A is still open: A's hold on whatever it took to wake the replica must not
/// leave B's commit waking nobody. Then A ends as `then` says; the replica still answers: A's
/// own job runs at once after its commit, or, after a rollback, the next producer's does.
async fn an_open_enqueue_and_another_producer(then: Then) {
    let db = TestDb::migrated().await;
    let (mut a_client, b) = (db.client().await, db.client().await);
    let replica = waiting_noop_replica(&db, "held").await;
    let a = a_client.transaction().await.unwrap();
    let a_job = insert_jobs(&a, NOOP, &[json!({})], 3).await[0];
    let b_job = insert_jobs(&b, NOOP, &[json!({})], 3).await[0];
    promptly("B's job succeeded while A is open", 1, || {
        succeeded_job(&b, b_job)
    })
    .await;
    match then {
        Then::RollBack => {
            a.rollback().await.unwrap();
            let next = insert_jobs(&b, NOOP, &[json!({})], 3).await[0];
            promptly("the next job succeeded after A's rollback", 1, || {
                succeeded_job(&b, next)
            })
            .await;
            assert_eq!(count(&b, "etl_job_intake").await, 2, "A's job is gone");
        }
        Then::Commit => {
            a.commit().await.unwrap();
            promptly("A's job succeeded after its commit", 1, || {
                succeeded_job(&b, a_job)
            })
            .await;
        }
    }
    // Counters move after the commit returns: read them once the replica has stopped.
    let handle = Arc::clone(&replica.stats);
    replica.stop().await.unwrap();
    let stats = handle.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    assert_eq!(stats.succeeded, 2);
}

/// Defect 1, A rolled back: see [`an_open_enqueue_and_another_producer`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_never_silences_another_producer_and_its_rollback_changes_nothing() {
    an_open_enqueue_and_another_producer(Then::RollBack).await;
}

/// Defect 1, A committed: see [`an_open_enqueue_and_another_producer`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_never_silences_another_producer_and_its_job_runs_at_its_commit() {
    an_open_enqueue_and_another_producer(Then::Commit).await;
}

/// Defect 2: a replica killed while it waited leaves its waiting row (recovery forgets it only
/// after ten minutes). Here that row is written by hand, for an owner no process runs (nobody
/// holds its owner lock), serving the live replica's queues and kinds, with a wake token of its
/// own, and refreshed before the live replica's row (the longest waiting). A job enqueued next
/// must still wake the live replica: it runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_waiting_row_never_absorbs_the_wake_of_a_live_one() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let live = waiting_noop_replica(&db, "live").await;
    eventually("the live replica's row", || async {
        count(
            &client,
            "etl_waiting_replicas WHERE owner_id = 'live' AND queues IS DISTINCT FROM '{}'",
        )
        .await
            == 1
    })
    .await;
    let dead = client
        .execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token, refreshed_at)
             SELECT 'dead', queues, kinds, wake_token + 1, refreshed_at - interval '30 seconds'
               FROM etl_waiting_replicas WHERE owner_id = 'live'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(dead, 1);
    let id = insert_jobs(&client, NOOP, &[json!({})], 3).await[0];
    promptly("the job succeeded on the live replica", 1, || {
        succeeded_job(&client, id)
    })
    .await;
    let stats = live.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    live.stop().await.unwrap();
}

/// Defect 3: a chore of queue `q2` runs under the lease of an owner that is gone (claimed by
/// hand); replica R2 serves `q2` and waits; replica R1 serves `q1` only. The lease expires and
/// R1's recovery gives the chore back: R1 cannot run it, so the recovery must wake R2, which
/// starts it at once (its own recovery pass is half a minute away, its poll a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_recovered_by_another_replica_wakes_a_waiting_replica_of_its_queue() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    jobs()
        .enqueue(&client, &Chore { n: 1 }, placed("q2", None))
        .await
        .unwrap();
    assert_eq!(claim_by_hand(&client, "gone", "q2").await, 1);
    let r2_chores = Chores::default();
    let r2 = Replica::start_with(
        &db,
        serving("r2", "q2"),
        Registry::new().perform(r2_chores.clone()),
    )
    .await;
    until_waits(&r2, 1).await;
    // R1 recovers every 100 ms (twice per poll); its poll claims only q1.
    let r1_config = WorkerConfig {
        poll_interval: Duration::from_millis(200),
        ..serving("r1", "q1")
    };
    let r1 = Replica::start_with(&db, r1_config, Registry::new().perform(Chores::default())).await;
    client
        .batch_execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second'
              WHERE status = 'running'",
        )
        .await
        .unwrap();
    eventually("R1's recovery of the expired lease", || {
        let stats = r1.stats.snapshot();
        async move { stats.recovered_expired == 1 }
    })
    .await;
    promptly("the recovered chore succeeded on R2", 1, || async {
        succeeded(&client).await
    })
    .await;
    assert_eq!(r2_chores.started(), 1, "R2 ran it");
    let (s1, s2) = (r1.stats.snapshot(), r2.stats.snapshot());
    assert_eq!((s1.claimed, s2.recovered_expired), (0, 0), "{s1:?} {s2:?}");
    assert_eq!(s2.claimed_by_poll, 0, "R2's poll never fired: {s2:?}");
    r1.stop().await.unwrap();
    r2.stop().await.unwrap();
}

/// Defect 4: a replica of 8 slots is woken for a backlog of 300 due jobs and starts 8 of them
/// (held by the test); an enqueue transaction A, left open for the rest of the test, then
/// enqueues a due job, taking (row-locking) whatever an enqueue takes to wake the replica. Once
/// the 8 are let go, the whole backlog must drain at once while A stays open: no statement the
/// replica sends with its claims may wait for A's locks. (6a052c4 parked the replica's row
/// without `SKIP LOCKED`, pipelined before the drain's claim, which then waited for A's lock
/// until `lock_timeout`; the replica's sessions here allow 300 s of lock and statement time, as a
/// database may, so such a wait outlasts the bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_never_stalls_a_replicas_backlog() {
    let db = TestDb::migrated().await;
    let (mut a_client, observer) = (db.client().await, db.client().await);
    let mut patient = db.config.clone();
    patient.statement_timeout = Duration::from_secs(300);
    patient.lock_timeout = Duration::from_secs(300);
    let (gate, scripted) = Scripted::gated();
    let started = Arc::clone(&scripted.prepares);
    let cfg = WorkerConfig {
        prefetch: 0,
        ..config("backlogged", MINUTE, 8)
    };
    let replica = Replica::start_on(&db, &patient, cfg, Registry::new().register(scripted)).await;
    until_waits(&replica, 1).await;
    insert_jobs(&observer, SCRIPTED, &vec![json!({}); 300], 3).await;
    eventually("the first 8 jobs started", || {
        let started = Arc::clone(&started);
        async move { started.load(Ordering::SeqCst) == 8 }
    })
    .await;
    let a = a_client.transaction().await.unwrap();
    insert_jobs(&a, SCRIPTED, &[json!({})], 3).await;
    gate.add_permits(1000);
    promptly("the backlog's jobs succeeded while A is open", 300, || {
        succeeded(&observer)
    })
    .await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    a.rollback().await.unwrap();
    replica.stop().await.unwrap();
}

/// Defect 4, at shutdown: an enqueue transaction A, left open, enqueues a due job while the one
/// replica waits, taking (row-locking) whatever an enqueue takes to wake it; the replica is then
/// asked to stop, and must stop at once, not wait for A's locks. (6a052c4 deleted the replica's
/// row without `SKIP LOCKED`, which waited for A's lock until `lock_timeout`; the replica's
/// sessions here allow 300 s, so such a wait outlasts the bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_never_delays_a_replicas_shutdown() {
    let db = TestDb::migrated().await;
    let mut a_client = db.client().await;
    let mut patient = db.config.clone();
    patient.statement_timeout = Duration::from_secs(300);
    patient.lock_timeout = Duration::from_secs(300);
    let replica = Replica::start_on(
        &db,
        &patient,
        config("stopping", MINUTE, 4),
        Registry::new().register(Noop),
    )
    .await;
    until_waits(&replica, 1).await;
    let a = a_client.transaction().await.unwrap();
    insert_jobs(&a, NOOP, &[json!({})], 3).await;
    let start = Instant::now();
    let stopped = tokio::time::timeout(BOUND, replica.stop()).await;
    assert!(
        stopped.is_ok(),
        "the replica had not stopped {:?} after it was asked to, A still open",
        start.elapsed()
    );
    stopped.unwrap().unwrap();
    a.rollback().await.unwrap();
}

/// Defect 5a: a chore waits in a paused queue while a replica serving the queue waits; resuming
/// the queue makes it claimable, and must wake the replica: it runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_paused_queue_wakes_a_waiting_replica() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_paused(&client, "chores", true).await.unwrap();
    jobs()
        .enqueue(&client, &Chore { n: 1 }, EnqueueOptions::default())
        .await
        .unwrap();
    let replica = Replica::start_with(
        &db,
        serving("resumed", "chores"),
        Registry::new().perform(Chores::default()),
    )
    .await;
    until_waits(&replica, 1).await;
    assert_eq!(replica.stats.snapshot().claimed, 0, "paused");
    queue::set_paused(&client, "chores", false).await.unwrap();
    promptly("the resumed queue's chore succeeded", 1, || async {
        succeeded(&client).await
    })
    .await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    replica.stop().await.unwrap();
}

/// How the test makes a second chore claimable beside a first one that runs at the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loosen {
    /// The queue's cap, 1, raised to 2.
    CapRaised,
    /// The queue's cap, 1, lifted.
    CapLifted,
    /// The queue's key cap, 1, raised to 2 (both chores have the same concurrency key).
    KeyCapRaised,
}

/// Defects 5b to 5d: one replica of 8 slots serves `chores`, limited to one running chore (its
/// cap, or its key cap with both chores of one key); two chores are enqueued, the first starts
/// and is held by the test, the second waits, and the replica waits. Loosening the limit as
/// `loosen` says makes the second claimable, and must wake the replica: it starts at once, while
/// the first still runs.
async fn a_loosened_limit_wakes_a_waiting_replica(loosen: Loosen) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let key = match loosen {
        Loosen::CapRaised | Loosen::CapLifted => {
            queue::set_cap(&client, "chores", Some(1)).await.unwrap();
            None
        }
        Loosen::KeyCapRaised => {
            queue::set_key_cap(&client, "chores", Some(1))
                .await
                .unwrap();
            Some("customer-1")
        }
    };
    let (gate, chores) = Chores::gated();
    let replica = Replica::start_with(
        &db,
        serving("limited", "chores"),
        Registry::new().perform(chores.clone()),
    )
    .await;
    until_waits(&replica, 1).await;
    let two = [Chore { n: 1 }, Chore { n: 2 }];
    jobs()
        .enqueue_many_with(&client, two.iter().map(|c| (c, placed("chores", key))))
        .await
        .unwrap();
    eventually("the first chore started", || {
        let chores = chores.clone();
        async move { chores.started() == 1 }
    })
    .await;
    // Woken by the enqueue, it claimed what the limit allowed; its claim came back short, so its
    // row still waits.
    eventually("the claim of the first chore is back", || {
        let stats = Arc::clone(&replica.stats);
        async move { stats.snapshot().claimed == 1 }
    })
    .await;
    assert_eq!(
        count(
            &client,
            "etl_waiting_replicas WHERE owner_id = 'limited' AND queues = '{chores}'"
        )
        .await,
        1,
        "it still waits"
    );
    assert_eq!(
        count(&client, "etl_job_records WHERE status = 'pending'").await,
        1,
        "the second chore waits for the limit"
    );
    match loosen {
        Loosen::CapRaised => queue::set_cap(&client, "chores", Some(2)).await,
        Loosen::CapLifted => queue::set_cap(&client, "chores", None).await,
        Loosen::KeyCapRaised => queue::set_key_cap(&client, "chores", Some(2)).await,
    }
    .unwrap();
    promptly("chores started once the limit was loosened", 2, || {
        let chores = chores.clone();
        async move { chores.started() }
    })
    .await;
    assert_eq!(
        count(&client, "etl_job_records WHERE status = 'running'").await,
        2,
        "the second runs beside the first"
    );
    gate.add_permits(2);
    promptly("both chores succeeded", 2, || succeeded(&client)).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    replica.stop().await.unwrap();
}

/// Defect 5b: see [`a_loosened_limit_wakes_a_waiting_replica`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_a_cap_wakes_a_waiting_replica() {
    a_loosened_limit_wakes_a_waiting_replica(Loosen::CapRaised).await;
}

/// Defect 5c: see [`a_loosened_limit_wakes_a_waiting_replica`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_cap_wakes_a_waiting_replica() {
    a_loosened_limit_wakes_a_waiting_replica(Loosen::CapLifted).await;
}

/// Defect 5d: see [`a_loosened_limit_wakes_a_waiting_replica`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_a_key_cap_wakes_a_waiting_replica() {
    a_loosened_limit_wakes_a_waiting_replica(Loosen::KeyCapRaised).await;
}

/// Defect 6: one replica serving `chores` waits, and nothing of `chores` may be claimed (the
/// test made it so before the replica started). 50 chores are then enqueued, each in a
/// transaction of its own: none may send a NOTIFY on `durable_etl_jobs` (each would take the
/// cluster-wide notify lock for nothing) and the replica claims nothing for them. The sentinel
/// NOTIFY, sent after the last enqueue committed, ends the listening (notifications arrive in
/// commit order).
async fn enqueues_of_unclaimable_work_wake_nobody(db: &TestDb, client: &tokio_postgres::Client) {
    let mut listener = Listener::start(db, &["durable_etl_jobs", SENTINEL]).await;
    let replica = Replica::start_with(
        db,
        serving("unwoken", "chores"),
        Registry::new().perform(Chores::default()),
    )
    .await;
    until_waits(&replica, 1).await;
    let before = replica.stats.snapshot();
    assert_eq!(before.claimed, 0, "nothing of the queue may be claimed");
    let jobs = jobs();
    for n in 0..50 {
        jobs.enqueue(client, &Chore { n }, EnqueueOptions::default())
            .await
            .unwrap();
    }
    client
        .batch_execute(&format!("NOTIFY {SENTINEL}"))
        .await
        .unwrap();
    let woken = listener.drain_until(SENTINEL).await;
    assert_eq!(woken, vec![], "an enqueue woke a replica for nothing");
    let after = replica.stats.snapshot();
    assert_eq!(
        (after.claims, after.empty_claims, after.notifications),
        (before.claims, before.empty_claims, 0),
        "the replica claimed nothing for them: {after:?}"
    );
    replica.stop().await.unwrap();
}

/// Defect 6, a paused queue: see [`enqueues_of_unclaimable_work_wake_nobody`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_into_a_paused_queue_wake_nobody() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_paused(&client, "chores", true).await.unwrap();
    enqueues_of_unclaimable_work_wake_nobody(&db, &client).await;
}

/// Defect 6, a queue capped at 1 whose permit is held by a chore running under another owner
/// (claimed by hand, its lease a minute long): see [`enqueues_of_unclaimable_work_wake_nobody`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_into_a_capped_queue_with_every_permit_held_wake_nobody() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_cap(&client, "chores", Some(1)).await.unwrap();
    jobs()
        .enqueue(&client, &Chore { n: -1 }, EnqueueOptions::default())
        .await
        .unwrap();
    assert_eq!(claim_by_hand(&client, "holder", "chores").await, 1);
    enqueues_of_unclaimable_work_wake_nobody(&db, &client).await;
}

/// A busy replica is parked: wakes do not reach it, and it claims again by itself as its jobs
/// end. So a queue its claims left out because it came back short must be asked again while the
/// backlog of another queue lasts, not only once that backlog is gone. One replica of 2 slots
/// serves `q1` and `q2`; 40 chores of `q1` arrive at once, so `q2` comes back short and the
/// replica drains `q1` and parks; a chore of `q2` then wakes nobody. The test lets `q1`'s chores
/// end one at a time: the `q2` chore must be claimed while most of `q1`'s backlog still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_still_asks_a_queue_it_left_out_while_another_queues_backlog_lasts() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (gate, chores) = Chores::gated();
    let cfg = WorkerConfig {
        slots: 2,
        ..serving("busy", "q1,q2")
    };
    let replica = Replica::start_with(&db, cfg, Registry::new().perform(chores.clone())).await;
    until_waits(&replica, 1).await;
    let mut producer = db.client().await;
    let tx = producer.transaction().await.unwrap();
    for n in 0..40 {
        jobs()
            .enqueue(&tx, &Chore { n }, placed("q1", None))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    eventually("both slots busy and the replica parked", || async {
        chores.started() == 2
            && count(
                &client,
                "etl_waiting_replicas WHERE owner_id = 'busy' AND queues = '{}'",
            )
            .await
                == 1
    })
    .await;
    let left_out = jobs()
        .enqueue(&client, &Chore { n: 100 }, placed("q2", None))
        .await
        .unwrap()
        .id;
    let running = "etl_job_records WHERE status = 'running' AND id = ";
    let mut released = 0;
    while count(&client, &format!("{running}'{left_out}'")).await == 0 {
        assert!(released < 40, "the q2 chore was never claimed");
        gate.add_permits(1);
        released += 1;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let waiting = count(
        &client,
        "etl_job_records WHERE queue = 'q1' AND status = 'pending'",
    )
    .await;
    assert!(
        waiting >= 20,
        "the q2 chore was claimed only once q1's backlog was nearly gone ({waiting} left)"
    );
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    gate.add_permits(1000);
    replica.stop().await.unwrap();
}

/// Two enqueues into a paused queue wake nobody and hold its enqueue barrier until they end; the
/// queue is resumed, so the one waiting replica tries the barrier again and again. One of them
/// commits while the other stays open: its chore must run at once, not once the other
/// transaction ends (a retry of a barrier held that long claims each time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_committed_while_another_enqueue_holds_the_barrier_runs_at_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (mut t_client, mut e_client) = (db.client().await, db.client().await);
    let chores = Chores::default();
    let replica = Replica::start_with(
        &db,
        serving("settling", "chores"),
        Registry::new().perform(chores.clone()),
    )
    .await;
    until_waits(&replica, 1).await;
    queue::set_paused(&client, "chores", true).await.unwrap();
    let (t, e) = (
        t_client.transaction().await.unwrap(),
        e_client.transaction().await.unwrap(),
    );
    for (tx, n) in [(&t, 1), (&e, 2)] {
        jobs()
            .enqueue(tx, &Chore { n }, EnqueueOptions::default())
            .await
            .unwrap();
    }
    queue::set_paused(&client, "chores", false).await.unwrap();
    e.commit().await.unwrap();
    promptly("E's chore ran while T is open", 1, || async {
        succeeded(&client).await
    })
    .await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    assert!(stats.barrier_held > 0, "T held the barrier: {stats:?}");
    t.commit().await.unwrap();
    promptly("T's chore ran at its commit", 2, || async {
        succeeded(&client).await
    })
    .await;
    replica.stop().await.unwrap();
}
