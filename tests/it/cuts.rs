//! A live replica whose every connection is cut at once (a pooler or proxy restart, a NAT reset,
//! an operator ending its backends), with the default lease, heartbeat and poll: a short cut
//! moves no job and charges no attempt, and a long one never lets another replica start the job
//! while the cut replica's handler still trusts its lease (it is told first, by
//! `JobContext::lease_lost`).

use crate::proxy::{Mode, Proxy};
use crate::support::{eventually, insert_jobs, job_row, pool, TestDb};
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::error::Error;
use durable_etl::job::handler::{Effects, Handler, JobContext, JobError, NoEffects, Registry};
use durable_etl::shutdown::{self, Stage, Trigger};
use durable_etl::worker::stats::WorkerStats;
use durable_etl::worker::Worker;
use futures::future::BoxFuture;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The kind the watchful handler runs.
const WATCHFUL: &str = "test.watchful";

/// What the replicas' handlers did, on this process's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Replica `0` started the job.
    Started(&'static str, Instant),
    /// Replica `0`'s handler was told its lease is lost.
    Lost(&'static str, Instant),
}

/// A handler that records when it starts and when it is told its lease is lost, then waits for
/// a permit of its gate and succeeds without effects.
struct Watchful {
    /// Which replica runs it.
    replica: &'static str,
    /// Every event of every replica, in order.
    events: Arc<Mutex<Vec<Event>>>,
    /// Each job waits for one permit.
    gate: Arc<Semaphore>,
}

impl Handler for Watchful {
    fn kind(&self) -> &'static str {
        WATCHFUL
    }
    fn prepare<'a>(
        &'a self,
        job: &'a Arc<JobContext>,
        _payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            record(&self.events, Event::Started(self.replica, Instant::now()));
            let (replica, events, lost) = (
                self.replica,
                Arc::clone(&self.events),
                job.lease_lost.clone(),
            );
            // Work started elsewhere watches the signal: the handler's own future is dropped.
            tokio::spawn(async move {
                lost.lost().await;
                record(&events, Event::Lost(replica, Instant::now()));
            });
            let permit = self.gate.acquire().await;
            permit.map(|p| p.forget()).ok();
            Ok(Box::new(NoEffects) as Box<dyn Effects>)
        })
    }
}

/// Appends `event` to `events`.
fn record(events: &Mutex<Vec<Event>>, event: Event) {
    events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(event);
}

/// A running replica: its counters, its shutdown trigger and its `run` task.
struct Running {
    /// Live counters.
    stats: Arc<WorkerStats>,
    /// Asks it to stop.
    trigger: Trigger,
    /// The `run` task.
    task: JoinHandle<Result<(), Error>>,
}

/// The two replicas of a test: `a` through `proxy`, `b` direct, both with the defaults (lease,
/// heartbeat, poll) and the watchful handler, and what their handlers did.
struct Pair {
    /// The proxy in front of every connection of `a`.
    proxy: Proxy,
    /// The replica that is cut.
    a: Running,
    /// The replica that judges it.
    b: Running,
    /// Both handlers' events.
    events: Arc<Mutex<Vec<Event>>>,
    /// Both handlers' gate.
    gate: Arc<Semaphore>,
}

impl Pair {
    /// Starts `a` (through a proxy), waits until it runs the one job of `db`, then starts `b`.
    async fn start(db: &TestDb) -> Pair {
        let proxy = Proxy::in_front_of_test_server().await;
        let events = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Semaphore::new(0));
        let proxied = DatabaseConfig {
            url: proxy.url_for(&db.config.url),
            ..db.config.clone()
        };
        let a_pool = durable_etl::db::connect_pool(&proxied, "test")
            .await
            .unwrap();
        let a = watchful("a", (a_pool, &proxied), &events, &gate).await;
        eventually("a to run the job", || started(&events, "a")).await;
        let b = watchful("b", (pool(db).await, &db.config), &events, &gate).await;
        Pair {
            proxy,
            a,
            b,
            events,
            gate,
        }
    }

    /// Cuts every connection of `a` and holds new ones for `cut`, then lets them through.
    async fn cut(&self, cut: Duration) {
        self.proxy.set_mode(Mode::Blackhole);
        self.proxy.drop_all();
        tokio::time::sleep(cut).await;
        self.proxy.set_mode(Mode::Pass);
    }

    /// The events so far.
    fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops both replicas cleanly.
    async fn stop(self) {
        for replica in [self.a, self.b] {
            replica.trigger.request(Stage::Draining);
            replica.task.await.unwrap().unwrap();
        }
    }
}

/// Whether replica `who` started the job, by `events`.
async fn started(events: &Arc<Mutex<Vec<Event>>>, who: &'static str) -> bool {
    events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .any(|e| matches!(e, Event::Started(r, _) if *r == who))
}

/// Starts replica `owner` on `pool` and `config`, with the defaults but for its owner id, running
/// the watchful handler (recording into `events`, held at `gate`).
async fn watchful(
    owner: &'static str,
    (pool, config): (durable_etl::db::Pool, &DatabaseConfig),
    events: &Arc<Mutex<Vec<Event>>>,
    gate: &Arc<Semaphore>,
) -> Running {
    let handler = Watchful {
        replica: owner,
        events: Arc::clone(events),
        gate: Arc::clone(gate),
    };
    let replica = WorkerConfig {
        owner_id: owner.to_owned(),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().register(handler);
    let worker = Worker::start(pool, config, replica, registry)
        .await
        .unwrap();
    let stats = worker.stats_handle();
    let (trigger, shutdown) = shutdown::manual();
    let task = tokio::spawn(worker.run(shutdown));
    Running {
        stats,
        trigger,
        task,
    }
}

/// A cut of every connection of a live replica for 1 s moves no job and charges no attempt:
/// the other replica, judging twice a second and whenever a silence would end, never takes the
/// job; the cut replica's handler is never told its lease is lost; and the job succeeds under
/// its first claim. (Before owner beats, the other replica took the job within milliseconds of
/// the cut, as a dead owner's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_replica_cut_off_for_a_second_moves_no_job_and_is_charged_nothing() {
    let (db, client, id) = one_job(5).await;
    let pair = Pair::start(&db).await;
    pair.cut(Duration::from_secs(1)).await;
    // Twice the silence after the cut ended: every judgement the cut could have caused is done.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let row = job_row(&client, id).await;
    assert_eq!(
        (row.status.as_str(), row.attempts),
        ("running", 1),
        "the job stayed with its first claim"
    );
    assert!(
        pair.events()
            .iter()
            .all(|e| matches!(e, Event::Started("a", _))),
        "nobody was told the lease is lost and b never ran it: {:?}",
        pair.events()
    );
    assert_eq!(pair.b.stats.snapshot().recovered_dead_owner, 0);
    pair.gate.add_permits(1);
    until_succeeded(&client, id).await;
    assert_eq!(job_row(&client, id).await.attempts, 1);
    assert_eq!(pair.a.stats.snapshot().lease_lost, 0);
    pair.stop().await;
}

/// A cut of every connection of a live replica for 10 s: its handler is told the lease is lost
/// before the other replica starts the job, so the two never compute it at once; the cut
/// replica, once back, commits nothing of it (the job succeeds once, under the second claim),
/// and gives back the attempt recovery charged it: the job ends with one attempt counted, its
/// first recorded `released`, taken from `a`. (Before refunds, it ended with two, the first
/// `recovered`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_for_long_stops_trusting_before_another_takes_its_job() {
    let (db, client, id) = one_job(5).await;
    let pair = Pair::start(&db).await;
    let cut = pair.cut(Duration::from_secs(10));
    let taken = eventually("b to take the job", || started(&pair.events, "b"));
    futures::join!(cut, taken);
    let events = pair.events();
    let lost = events.iter().find_map(|e| match e {
        Event::Lost("a", at) => Some(*at),
        _ => None,
    });
    let taken = events.iter().find_map(|e| match e {
        Event::Started("b", at) => Some(*at),
        _ => None,
    });
    match (lost, taken) {
        (Some(lost), Some(taken)) => assert!(
            lost < taken,
            "a still trusted its lease when b started the job: {events:?}"
        ),
        _ => panic!("a was never told, or b never ran the job: {events:?}"),
    }
    eventually(
        "a to refund the attempt b's recovery charged it",
        || async { pair.a.stats.snapshot().refunded == 1 },
    )
    .await;
    assert_eq!(
        job_row(&client, id).await.attempts,
        1,
        "b's claim alone counts"
    );
    pair.gate.add_permits(2);
    until_succeeded(&client, id).await;
    assert_eq!(job_row(&client, id).await.attempts, 1);
    assert_eq!(
        history(&client, id).await,
        [("released".to_owned(), Some("a".to_owned()))]
    );
    assert_eq!(pair.a.stats.snapshot().lease_lost, 1);
    assert_eq!(pair.b.stats.snapshot().recovered_dead_owner, 1);
    pair.stop().await;
}

/// A migrated database, a client, and the one watchful job it holds, of `max_attempts`.
async fn one_job(max_attempts: i32) -> (TestDb, tokio_postgres::Client, uuid::Uuid) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, WATCHFUL, &[json!({})], max_attempts).await;
    (db, client, ids[0])
}

/// Waits until job `id` succeeded.
async fn until_succeeded(client: &tokio_postgres::Client, id: uuid::Uuid) {
    eventually("the job to succeed", || async move {
        job_row(client, id).await.status == "succeeded"
    })
    .await;
}

/// A claimant of the watchful kind for `owner_id`, its claims stamped lock-backed (no lock is
/// held: a judge takes it for dead unless it beats), with a long lease.
fn claimant(owner_id: &str) -> durable_etl::worker::claimer::Claimant<'_> {
    durable_etl::worker::claimer::Claimant {
        owner_id,
        owner_locked: true,
        lease: Duration::from_secs(600),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: true,
        kinds: &[WATCHFUL],
    }
}

/// Job `id`'s attempt history: each attempt's ending and the owner it was taken from.
async fn history(client: &tokio_postgres::Client, id: uuid::Uuid) -> Vec<(String, Option<String>)> {
    client
        .query(
            "SELECT ending, owner_id FROM etl_job_attempts WHERE job_id = $1 ORDER BY ended_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A job on its last attempt whose replica is cut off for 4 s (past its silence, within its
/// lease) is not taken by the other replica, which judges the owner dead but cannot know it is
/// not merely cut off; the cut replica abandons it when its trust runs out and gives it back
/// uncharged once it is back, and the job succeeds. (Before, the other replica ended it at once
/// `failed`, `lease_expired_exhausted`: an infrastructure fault spent its last attempt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_its_last_attempt_outlives_a_cut_of_its_replica_longer_than_its_silence() {
    let (db, client, id) = one_job(1).await;
    let pair = Pair::start(&db).await;
    pair.cut(Duration::from_secs(4)).await;
    eventually("a to give the job back", || async {
        pair.a.stats.snapshot().given_back == 1
    })
    .await;
    assert_eq!(pair.b.stats.snapshot().recovered_exhausted, 0);
    pair.gate.add_permits(2);
    until_succeeded(&client, id).await;
    assert_eq!(job_row(&client, id).await.attempts, 1);
    assert_eq!(history(&client, id).await, [("released".to_owned(), None)]);
    pair.stop().await;
}

/// The refund itself, without timing: it turns into `released` only the attempts recovery took
/// from this owner's incarnation (started since its start-up), gives each live job its attempt
/// back, and refunds nothing twice; a previous incarnation's attempt and another owner's stay
/// `recovered`, charged.
#[tokio::test]
async fn a_refund_gives_back_only_what_recovery_took_from_this_incarnation() {
    use durable_etl::worker::claimer;
    use durable_etl::worker::refund::{self, Refunded};
    use durable_etl::worker::rescuer::{self, Judgement};
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, WATCHFUL, &[json!({}), json!({}), json!({})], 5).await;
    let claim = |owner_id| {
        let client = &client;
        async move {
            let jobs = claimer::claim(client, claimant(owner_id), 1).await.unwrap();
            jobs[0].id()
        }
    };
    let before = claim("cut").await;
    let since: std::time::SystemTime = client.query_one("SELECT now()", &[]).await.unwrap().get(0);
    let mine = claim("cut").await;
    let others = claim("other").await;
    assert_eq!(
        [before, mine, others]
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        ids.len()
    );
    // Nobody holds their locks and neither ever beat: all three are taken as dead owners'.
    let judge = Judgement {
        heartbeat_interval: Duration::from_secs(4),
        reachable_for: Duration::MAX,
    };
    assert_eq!(
        rescuer::recover(&client, judge).await.unwrap().dead_owner,
        3
    );
    // Another replica claims all three again: their second attempts run.
    let again = claimer::claim(&client, claimant("other"), 3).await.unwrap();
    assert_eq!(again.len(), 3);
    assert_eq!(job_row(&client, mine).await.attempts, 2);
    assert_eq!(
        refund::refund(&client, "cut", since).await.unwrap(),
        Refunded {
            attempts: 1,
            live_jobs: 1
        }
    );
    assert_eq!(job_row(&client, mine).await.attempts, 1);
    assert_eq!(
        history(&client, mine).await,
        [("released".to_owned(), Some("cut".to_owned()))]
    );
    assert_eq!(
        history(&client, before).await,
        [("recovered".to_owned(), Some("cut".to_owned()))]
    );
    assert_eq!(
        history(&client, others).await,
        [("recovered".to_owned(), Some("other".to_owned()))]
    );
    assert_eq!(job_row(&client, before).await.attempts, 2);
    assert_eq!(job_row(&client, others).await.attempts, 2);
    assert_eq!(
        refund::refund(&client, "cut", since).await.unwrap(),
        Refunded::default(),
        "nothing is refunded twice"
    );
}

/// The judgement itself, without timing: an owner whose locks are all gone but whose last beat
/// is younger than its silence is alive (its job stays, and the pass says when the silence
/// ends); once its last beat is older, it is dead; an owner that never beat (a release before
/// beats) is judged by its locks alone.
#[tokio::test]
async fn an_owner_without_locks_is_alive_until_its_beats_fall_silent() {
    use durable_etl::worker::claimer;
    use durable_etl::worker::rescuer::{self, Judgement};
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, WATCHFUL, &[json!({}), json!({})], 5).await;
    assert_eq!(
        claimer::claim(&client, claimant("beating"), 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        claimer::claim(&client, claimant("older"), 1)
            .await
            .unwrap()
            .len(),
        1
    );
    let beat = |seconds_ago: f64| {
        let client = &client;
        async move {
            client
                .execute(
                    "INSERT INTO etl_owner_beats (owner_id, beat_at, silence_ms)
                     VALUES ('beating', now() - $1 * interval '1 second', 1750)
                         ON CONFLICT (owner_id) DO UPDATE SET beat_at = excluded.beat_at",
                    &[&seconds_ago],
                )
                .await
                .unwrap();
        }
    };
    let judge = Judgement {
        heartbeat_interval: Duration::from_secs(4),
        reachable_for: Duration::MAX,
    };
    beat(1.0).await;
    // No backend holds either owner's locks: "older" never beat and is dead at once.
    let recovered = rescuer::recover(&client, judge).await.unwrap();
    assert_eq!(recovered.dead_owner, 1, "only the owner that never beat");
    let again = recovered.judge_again_in.unwrap_or_default();
    assert!(
        again > Duration::from_millis(500) && again < Duration::from_millis(1000),
        "the silence ends 0.75 s from now: {again:?}"
    );
    let states: Vec<String> = futures::future::join_all(
        ids.iter()
            .map(|id| async { job_row(&client, *id).await.status }),
    )
    .await;
    assert_eq!(states.iter().filter(|s| *s == "running").count(), 1);
    beat(1.8).await;
    let recovered = rescuer::recover(&client, judge).await.unwrap();
    assert_eq!((recovered.dead_owner, recovered.judge_again_in), (1, None));
}
