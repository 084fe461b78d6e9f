//! Presence: replicas that wait for work say so (`etl_waiting_replicas`), enqueues notify only
//! while one does, and no enqueue is missed in the race between an enqueue that read "nobody
//! waits" and a replica that registers before that enqueue commits.

use crate::handlers::{Noop, Scripted, NOOP, SCRIPTED};
use crate::proxy::{Mode, Proxy};
use crate::support::{eventually, insert_jobs, session_pid, TestDb};
use crate::wake::{config, until_succeeded, Replica};
use durable_etl::config::WorkerConfig;
use durable_etl::job::handler::Registry;
use durable_etl::worker::stats::StatsSnapshot;
use serde_json::json;
use std::time::Duration;

/// The owner ids of the rows that wait (not parked: migration 0027), in order.
async fn waiting(client: &tokio_postgres::Client) -> Vec<String> {
    owners(client, "queues IS DISTINCT FROM '{}'").await
}

/// The owner ids of the parked rows (empty queues and kinds: migration 0027), in order.
async fn parked(client: &tokio_postgres::Client) -> Vec<String> {
    owners(client, "queues = '{}' AND kinds = '{}'").await
}

/// The owner ids of the waiting table's rows that match `filter`, in order.
async fn owners(client: &tokio_postgres::Client, filter: &str) -> Vec<String> {
    client
        .query(
            &format!("SELECT owner_id FROM etl_waiting_replicas WHERE {filter} ORDER BY owner_id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Starts a no-op replica `owner` polling every `poll`, and waits until it waits for work.
async fn waiting_replica(db: &TestDb, owner: &str, poll: Duration) -> Replica {
    let replica =
        Replica::start_with(db, config(owner, poll, 4), Registry::new().register(Noop)).await;
    let client = db.client().await;
    eventually("the replica waits", || async {
        waiting(&client).await == [owner]
    })
    .await;
    replica
}

/// Enqueues one job on `client`, waits until `succeeded` jobs have succeeded in all, and returns
/// `replica`'s counters, asserting that its poll (a minute away in these tests) claimed none.
async fn one_job_found_by_a_wake(
    client: &tokio_postgres::Client,
    replica: &Replica,
    succeeded: i64,
) -> StatsSnapshot {
    insert_jobs(client, NOOP, &[json!({})], 3).await;
    until_succeeded(client, succeeded).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.claimed_by_poll, 0, "the poll never fired: {stats:?}");
    stats
}

/// Waits until `replica` (`owner`) has registered and found the enqueue barrier held at least
/// `tries` times.
async fn until_retrying(
    replica: &Replica,
    observer: &tokio_postgres::Client,
    owner: &str,
    tries: u64,
) {
    eventually("retries that found the enqueue in flight", || {
        let stats = replica.stats.snapshot();
        async move { stats.barrier_held >= tries && waiting(observer).await == [owner] }
    })
    .await;
}

/// The race the enqueue barrier closes: an enqueue reads "nobody waits" (so it will not notify),
/// a replica then registers and claims before that enqueue commits. The replica's try of the
/// barrier fails while the enqueue is open, and it tries again (the try alone, no claim) until it
/// succeeds, then claims: the job runs at once, although no NOTIFY was sent and the poll is a
/// minute away. (A replica
/// that took its registration alone as settled would wait for its poll: the test times out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_flight_while_a_replica_registers_still_wakes_it() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let observer = db.client().await;
    let tx = client.transaction().await.unwrap();
    insert_jobs(&tx, NOOP, &[json!({})], 3).await;
    let replica = Replica::start_with(
        &db,
        config("late", Duration::from_secs(60), 4),
        Registry::new().register(Noop),
    )
    .await;
    until_retrying(&replica, &observer, "late", 3).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.waits, 1, "registered: wakes may name it");
    assert_eq!(
        stats.claims, 1,
        "only the first registration carried a claim; each retry sent its try alone: {stats:?}"
    );
    tx.commit().await.unwrap();
    until_succeeded(&observer, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.notifications, 0, "the enqueue saw nobody waiting");
    assert_eq!(stats.claimed_by_poll, 0, "the 60 s poll never fired");
    assert_eq!(stats.waits, 1);
    replica.stop().await.unwrap();
    assert!(waiting(&observer).await.is_empty(), "it left at shutdown");
}

/// A retry whose lone try of the barrier fails (its claim session stopped answering and the try
/// ran past its bound) is counted and sent again: once the enqueue holding the barrier commits, a
/// try succeeds and the claim after it runs the job at once, not at the minute-away poll. (A
/// replica that stopped retrying after a failed try would wait for its poll: the test times out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_try_fails_is_sent_again_and_still_finds_the_enqueue() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let observer = db.client().await;
    let tx = client.transaction().await.unwrap();
    insert_jobs(&tx, NOOP, &[json!({})], 3).await;
    // The claim and commit sessions go through the proxy, bounded at about a second; the LISTEN
    // and owner-lock session goes direct, so the fault reaches the tries alone.
    let proxy = Proxy::in_front_of_test_server().await;
    let mut through = db.config.clone();
    through.url = proxy.url_for(&db.config.url);
    through.statement_timeout = Duration::from_secs(1);
    let direct = WorkerConfig {
        session_database_url: Some(db.config.url.clone()),
        ..config("stalled", Duration::from_secs(60), 4)
    };
    let replica = Replica::start_on(&db, &through, direct, Registry::new().register(Noop)).await;
    until_retrying(&replica, &observer, "stalled", 2).await;
    proxy.set_mode(Mode::Blackhole);
    eventually("a try that ran past its bound", || async {
        replica.stats.snapshot().presence_failures >= 1
    })
    .await;
    proxy.set_mode(Mode::Pass);
    let stats = replica.stats.snapshot();
    assert_eq!((stats.waits, stats.claimed), (1, 0), "{stats:?}");
    tx.commit().await.unwrap();
    until_succeeded(&observer, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.notifications, 0, "the enqueue saw nobody waiting");
    assert_eq!(stats.claimed_by_poll, 0, "the 60 s poll never fired");
    assert_eq!((stats.waits, stats.claimed), (1, 1), "{stats:?}");
    replica.stop().await.unwrap();
}

/// An idle replica waits (enqueues notify it); one whose claim comes back full parks its row
/// (enqueues stop notifying: it claims again by itself as its jobs end) and waits again, in the
/// same row, once a claim comes back short; it deletes its row at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_waits_while_idle_and_leaves_while_busy() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (gate, scripted) = Scripted::gated();
    let mut cfg = config("busy", Duration::from_secs(60), 2);
    cfg.prefetch = 0;
    let replica = Replica::start_with(&db, cfg, Registry::new().register(scripted)).await;
    eventually("the replica waits", || async {
        replica.stats.snapshot().waits == 1 && waiting(&client).await == ["busy"]
    })
    .await;
    // Four jobs, two slots: the enqueue names the waiting replica (migration 0028), its claim
    // comes back full, and the next one parks its row.
    insert_jobs(&client, SCRIPTED, &vec![json!({}); 4], 3).await;
    gate.add_permits(2);
    eventually("the busy replica left", || async {
        replica.stats.snapshot().waits_left == 1 && waiting(&client).await.is_empty()
    })
    .await;
    assert_eq!(parked(&client).await, ["busy"], "its row stays, parked");
    // Nobody waits: this enqueue notifies nobody, and the busy replica takes it all the same.
    insert_jobs(&client, SCRIPTED, &[json!({})], 3).await;
    gate.add_permits(3);
    until_succeeded(&client, 5).await;
    eventually("the replica waits again", || async {
        replica.stats.snapshot().waits == 2 && waiting(&client).await == ["busy"]
    })
    .await;
    assert_eq!(replica.stats.snapshot().notifications, 1);
    assert!(
        parked(&client).await.is_empty(),
        "waiting again in the same row"
    );
    replica.stop().await.unwrap();
    assert_eq!(owners(&client, "true").await, Vec::<String>::new());
}

/// A waiting replica whose row is lost (deleted, or emptied by crash recovery) restores it at
/// its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_replica_restores_a_lost_row_at_its_poll() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = waiting_replica(&db, "polled", Duration::from_millis(100)).await;
    client
        .batch_execute("DELETE FROM etl_waiting_replicas")
        .await
        .unwrap();
    eventually("the restored row", || async {
        waiting(&client).await == ["polled"]
    })
    .await;
    replica.stop().await.unwrap();
}

/// A reconnect sends a waiting replica back to register: after crash recovery emptied the
/// unlogged table and ended its session, it registers again, and an enqueue wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_registers_again_after_its_session_reconnects() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let replica = waiting_replica(&db, "reconnected", Duration::from_secs(60)).await;
    client
        .batch_execute("DELETE FROM etl_waiting_replicas")
        .await
        .unwrap();
    let pid = session_pid(&client, &db).await;
    client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    eventually("the registration after the reconnect", || async {
        replica.stats.snapshot().reconnects >= 1 && waiting(&client).await == ["reconnected"]
    })
    .await;
    let stats = one_job_found_by_a_wake(&client, &replica, 1).await;
    assert_eq!(stats.claims_by_notify, 1, "{stats:?}");
    replica.stop().await.unwrap();
}

/// A `--poll-only` replica with a direct session (owner lock, no LISTEN) cannot be woken, so it
/// never registers: its row would make every enqueue notify for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_only_replica_with_a_session_never_waits() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut cfg = config("polling", Duration::from_millis(100), 4);
    cfg.poll_only = true;
    cfg.session_database_url = Some(db.config.url.clone());
    let replica = Replica::start_with(&db, cfg, Registry::new().register(Noop)).await;
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 1).await;
    let stats = replica.stats.snapshot();
    assert_eq!(stats.session_up, 1, "it has its session");
    assert_eq!((stats.waits, stats.notifications), (0, 0));
    assert!(waiting(&client).await.is_empty());
    replica.stop().await.unwrap();
}

/// Recovery deletes the rows of replicas that are gone: nobody refreshed them for twice the
/// longest poll interval, or no session holds their owner's lock (the replica died, or is
/// reconnecting and registers again once back); it keeps the others.
#[tokio::test]
async fn recovery_forgets_the_waiting_rows_of_replicas_that_are_gone() {
    let db = TestDb::migrated().await;
    let (client, owners_session) = (db.client().await, db.client().await);
    client
        .batch_execute(
            "INSERT INTO etl_waiting_replicas (owner_id, refreshed_at)
             VALUES ('dead', now() - interval '11 minutes'),
                    ('quiet', now() - interval '9 minutes'),
                    ('fresh', now()),
                    ('gone', now())",
        )
        .await
        .unwrap();
    // Every owner's lock is held but the gone one's, as the sessions of live replicas hold theirs.
    owners_session
        .batch_execute(
            "SELECT pg_advisory_lock(durable_etl_owner_lock_key(o))
               FROM unnest('{dead,quiet,fresh}'::text[]) AS o",
        )
        .await
        .unwrap();
    let forgotten = durable_etl::worker::rescuer::forget_stale_waiters(&client)
        .await
        .unwrap();
    assert_eq!(forgotten, 2);
    assert_eq!(waiting(&client).await, ["fresh", "quiet"]);
}

/// CPU time this test process has used, user and system (`/proc/self/stat`, in clock ticks of
/// 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name (which ends with the last ')'): utime is the 12th of
    // them, stime the 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// A barrier retry that comes due while the replica has no room sends no claim; it must not
/// stay due either (the claim loop would wake for it again at once, forever, burning a core
/// until a slot frees).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_no_room_does_not_spin_on_a_barrier_retry() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let observer = db.client().await;
    let open = client.transaction().await.unwrap();
    insert_jobs(&open, SCRIPTED, &[json!({})], 3).await;
    let (gate, scripted) = Scripted::gated();
    // The poll interval caps the retry pauses, so a retry comes due within the measured second.
    let mut cfg = config("full", Duration::from_millis(200), 1);
    cfg.prefetch = 0;
    let replica = Replica::start_with(&db, cfg, Registry::new().register(scripted)).await;
    eventually("a registration that found the enqueue in flight", || {
        let stats = replica.stats.snapshot();
        let observer = &observer;
        async move { stats.barrier_held >= 1 && waiting(observer).await == ["full"] }
    })
    .await;
    // Notified, it claims this job into its one slot, and its barrier try fails again.
    insert_jobs(&observer, SCRIPTED, &[json!({})], 3).await;
    eventually("the slot taken and the barrier held again", || {
        let stats = replica.stats.snapshot();
        async move { stats.claimed == 1 && stats.barrier_held >= 2 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = cpu_time();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_time() - before;
    assert!(
        used < Duration::from_millis(250),
        "{used:?} of CPU in a second with nothing to do"
    );
    open.commit().await.unwrap();
    gate.add_permits(2);
    until_succeeded(&observer, 2).await;
    replica.stop().await.unwrap();
}

/// An enqueue of one due job names ONE of two waiting replicas, at random, by its wake token
/// (migration 0028): that one claims and runs it; the other hears a wake naming another replica
/// and at most backs it up later (an empty claim). An enqueue of two due jobs in one statement
/// names both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_wakes_one_waiting_replica_per_due_job_by_name() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let first = waiting_replica(&db, "first", Duration::from_secs(60)).await;
    let second = Replica::start_with(
        &db,
        config("second", Duration::from_secs(60), 4),
        Registry::new().register(Noop),
    )
    .await;
    eventually("both wait", || async {
        waiting(&client).await == ["first", "second"]
    })
    .await;
    insert_jobs(&client, NOOP, &[json!({})], 3).await;
    until_succeeded(&client, 1).await;
    // Past the backup delay: whatever backing up the other did is done.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (a, b) = (first.stats.snapshot(), second.stats.snapshot());
    let (named, other) = if a.notifications == 1 { (a, b) } else { (b, a) };
    assert_eq!(
        (named.notifications, named.claimed_by_notify),
        (1, 1),
        "{named:?}"
    );
    assert_eq!((other.notifications, other.claimed), (0, 0), "{other:?}");
    assert!(other.backup_claims <= 1, "{other:?}");
    assert_eq!(a.claimed_by_poll + b.claimed_by_poll, 0);
    assert_eq!(
        waiting(&client).await,
        ["first", "second"],
        "both still wait"
    );

    insert_jobs(&client, NOOP, &[json!({}), json!({})], 3).await;
    until_succeeded(&client, 3).await;
    let (a2, b2) = (first.stats.snapshot(), second.stats.snapshot());
    assert_eq!(
        (
            a2.notifications - a.notifications,
            b2.notifications - b.notifications
        ),
        (1, 1),
        "{a2:?} {b2:?}"
    );
    assert_eq!(a2.claimed + b2.claimed, 3);
    first.stop().await.unwrap();
    second.stop().await.unwrap();
}

/// A waiting replica is woken only for the kinds it runs: a job of a kind only the other
/// replica runs takes that one's row, and the first never hears of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_wakes_only_a_replica_that_runs_its_kind() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let noop = waiting_replica(&db, "noop", Duration::from_secs(60)).await;
    let scripted = Replica::start_with(
        &db,
        config("scripted", Duration::from_secs(60), 4),
        Registry::new().register(Scripted::default()),
    )
    .await;
    eventually("both wait", || async {
        waiting(&client).await == ["noop", "scripted"]
    })
    .await;
    insert_jobs(&client, SCRIPTED, &[json!({"do": "ok"})], 3).await;
    until_succeeded(&client, 1).await;
    let (n, s) = (noop.stats.snapshot(), scripted.stats.snapshot());
    assert_eq!((n.notifications, n.claims_by_notify), (0, 0), "{n:?}");
    assert_eq!((s.notifications, s.claimed_by_notify), (1, 1), "{s:?}");
    noop.stop().await.unwrap();
    scripted.stop().await.unwrap();
}

/// At a steady load of single-job enqueues from concurrent producers, every job is found by a
/// wake, none by the poll: each enqueue names a waiting replica, and every registration that
/// raced an enqueue (a held barrier) is retried until it
/// settles. A lost wake (a replica waiting behind a row it did not write, say) leaves jobs to a
/// poll a minute away: they are claimed by the poll, or the test times out. The race behind the
/// one such loss found so far is rare per job (about one stall in 30,000 jobs at 600/s), so the
/// two `a_registration_that_finds_its_row_…` tests above are the ones that pin it down; this one
/// checks the invariant under real concurrency, whatever the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_steady_load_every_job_is_found_by_a_wake_and_none_by_the_poll() {
    const PRODUCERS: usize = 3;
    const JOBS_EACH: usize = 300;
    let db = TestDb::migrated().await;
    let observer = db.client().await;
    let minute = Duration::from_secs(60);
    let a = waiting_replica(&db, "steady-a", minute).await;
    let b = Replica::start_with(
        &db,
        config("steady-b", minute, 64),
        Registry::new().register(Noop),
    )
    .await;
    eventually("both replicas wait", || async {
        waiting(&observer).await == ["steady-a", "steady-b"]
    })
    .await;
    let mut producers = tokio::task::JoinSet::new();
    for _ in 0..PRODUCERS {
        let client = db.client().await;
        producers.spawn(async move {
            for _ in 0..JOBS_EACH {
                insert_jobs(&client, NOOP, &[json!({})], 3).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
    }
    while let Some(done) = producers.join_next().await {
        done.unwrap();
    }
    let jobs = (PRODUCERS * JOBS_EACH) as i64;
    until_succeeded(&observer, jobs).await;
    let (sa, sb) = (a.stats.snapshot(), b.stats.snapshot());
    assert_eq!(
        (sa.claimed_by_poll, sb.claimed_by_poll),
        (0, 0),
        "no job waited for a poll: {sa:?} {sb:?}"
    );
    assert_eq!(
        sa.claimed + sb.claimed,
        jobs as u64,
        "each job claimed once"
    );
    assert!(
        sa.claimed_by_notify > 0 && sb.claimed_by_notify > 0,
        "both replicas were woken"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
