//! Concurrency caps per key (migration 0022): a key-capped queue never runs more jobs of one key
//! than its key cap, under racing claimers too; every statement that moves a claim out of
//! `running` deletes that claim's key permit and no other; a stale finisher frees nothing; a hot
//! key never keeps a cold key's job from being claimed; a freed key permit wakes a waiting
//! replica; and the key stays on the live row only.

use crate::support::{count, expire_and_recover, versions_above, TestDb};
use durable_etl::codes::Code;
use durable_etl::queue;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer::{self, Transition};
use durable_etl::worker::lease::{ClaimedJob, Lease};
use durable_etl::{EnqueueOptions, Job, Jobs, Secret};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A job of the key-capped queue `keyed`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    /// How long its handler runs, in milliseconds (the replicas test).
    ms: u64,
    /// Its concurrency key, again in the payload so the handler can count per key.
    key: Option<String>,
}

impl Job for Keyed {
    const KIND: &'static str = "test.keyed";
    const QUEUE: &'static str = "keyed";
}

/// The handle the tests enqueue with.
fn jobs() -> Jobs {
    Jobs::new(
        Secret::new(b"key-caps-secret-0123456789".to_vec()).unwrap(),
        "t",
    )
}

/// A replica-like claimant of `keyed` jobs.
fn claimant(owner_id: &str) -> Claimant<'_> {
    Claimant {
        owner_id,
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: &["test.keyed"],
    }
}

/// Enqueues one job per key of `keys` (`None`: no key), in order.
async fn enqueue(client: &tokio_postgres::Client, keys: &[Option<&str>]) {
    let all: Vec<Keyed> = keys
        .iter()
        .map(|key| Keyed {
            ms: 20,
            key: key.map(str::to_owned),
        })
        .collect();
    let with = all.iter().zip(keys).map(|(job, &key)| {
        let options = EnqueueOptions {
            concurrency_key: key,
            ..EnqueueOptions::default()
        };
        (job, options)
    });
    jobs().enqueue_many_with(client, with).await.unwrap();
}

/// A test database whose queue `keyed` has key cap `key_cap`.
async fn keyed_queue(key_cap: i32) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    queue::set_key_cap(&client, "keyed", Some(key_cap))
        .await
        .unwrap();
    (db, client)
}

/// Claims up to `n` keyed jobs as `who`.
async fn claim(client: &tokio_postgres::Client, who: Claimant<'_>, n: usize) -> Vec<ClaimedJob> {
    claimer::claim_from(client, who, &[("keyed", n)])
        .await
        .unwrap()
}

/// The keys of `claimed` jobs, sorted (`-` for none).
async fn keys_of(client: &tokio_postgres::Client, claimed: &[ClaimedJob]) -> Vec<String> {
    let ids: Vec<uuid::Uuid> = claimed.iter().map(ClaimedJob::id).collect();
    let rows = client
        .query(
            "SELECT coalesce(concurrency_key, '-') FROM etl_job_records
              WHERE id = ANY($1) ORDER BY 1",
            &[&ids],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The lease of the one job of `claimed` whose key is `key`.
async fn with_key(client: &tokio_postgres::Client, claimed: &[ClaimedJob], key: &str) -> Lease {
    for job in claimed {
        if keys_of(client, std::slice::from_ref(job)).await == [key] {
            return job.lease();
        }
    }
    panic!("no claimed job of key {key}")
}

/// `(most running jobs of one key, key permits held, permits not held by a running claim of
/// their key, running keyed jobs without a permit)`.
async fn held(client: &tokio_postgres::Client) -> (i64, i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT coalesce(max(n), 0) FROM (
                        SELECT count(*) AS n FROM etl_job_records
                         WHERE status = 'running' AND concurrency_key IS NOT NULL
                         GROUP BY concurrency_key) r),
                    (SELECT count(*) FROM etl_key_permits),
                    (SELECT count(*) FROM etl_key_permits p
                      WHERE NOT EXISTS (
                            SELECT FROM etl_job_records j
                             WHERE j.lease_claim_id = p.claim_id AND j.status = 'running'
                               AND j.concurrency_key = p.concurrency_key AND j.queue = p.queue)),
                    (SELECT count(*) FROM etl_job_records j
                      WHERE j.status = 'running' AND j.concurrency_key IS NOT NULL
                        AND NOT EXISTS (SELECT FROM etl_key_permits p
                                         WHERE p.claim_id = j.lease_claim_id))",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

#[tokio::test]
async fn a_key_cap_runs_one_job_per_key_and_every_exit_frees_its_own_permit() {
    let (_db, client) = keyed_queue(1).await;
    let a = Some("tenant-a");
    let b = Some("tenant-b");
    enqueue(&client, &[a, a, a, a, a, b, b, None, None]).await;
    let who = claimant("keyer");
    let first = claim(&client, who, 10).await;
    assert_eq!(
        keys_of(&client, &first).await,
        ["-", "-", "tenant-a", "tenant-b"],
        "one job of each key, and every job without one"
    );
    assert!(claim(&client, who, 10).await.is_empty(), "both keys full");
    assert_eq!(held(&client).await, (1, 2, 0, 0));
    // A failure frees tenant-a's permit: its next job runs, tenant-b's does not.
    let tenant_a = with_key(&client, &first, "tenant-a").await;
    let failed = completer::fail(&client, tenant_a, Code::HandlerFailed, None).await;
    assert!(matches!(failed.unwrap(), Transition::Failed(_)));
    assert_eq!(held(&client).await, (1, 1, 0, 0));
    let next = claim(&client, who, 10).await;
    assert_eq!(keys_of(&client, &next).await, ["tenant-a"]);
    // A retry frees it (the job waits, its permit does not).
    let retried = completer::retry(&client, next[0].lease(), Duration::ZERO).await;
    assert_eq!(retried.unwrap(), Transition::Retried);
    assert_eq!(held(&client).await, (1, 1, 0, 0));
    // A release, a success and a recovery each free theirs.
    let next = claim(&client, who, 10).await;
    assert_eq!(keys_of(&client, &next).await, ["tenant-a"]);
    let released = completer::release(&client, &[next[0].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    let next = claim(&client, who, 10).await;
    assert_eq!(keys_of(&client, &next).await, ["tenant-a"]);
    let succeeded = completer::succeed_many(&client, &[(next[0].lease(), None)]).await;
    assert_eq!(succeeded.unwrap().len(), 1);
    assert_eq!(held(&client).await, (1, 1, 0, 0));
    let next = claim(&client, who, 10).await;
    assert_eq!(keys_of(&client, &next).await, ["tenant-a"]);
    assert_eq!(
        expire_and_recover(&client).await,
        4,
        "a, b and the two unkeyed"
    );
    assert_eq!(
        held(&client).await,
        (0, 0, 0, 0),
        "no permit once nothing runs"
    );
    assert_eq!(
        keys_of(&client, &claim(&client, who, 10).await).await,
        ["-", "-", "tenant-a", "tenant-b"],
        "one of each key again"
    );
}

#[tokio::test]
async fn a_key_cap_of_two_fills_both_slots_in_one_claim_and_reuses_the_freed_one() {
    let (_db, client) = keyed_queue(2).await;
    let a = Some("a");
    enqueue(&client, &[a, a, a, a, a]).await;
    let who = claimant("pair");
    let first = claim(&client, who, 5).await;
    assert_eq!(first.len(), 2, "the key cap, in one claim");
    let slots: Vec<i32> =
        crate::support::first_column(&client, "SELECT slot FROM etl_key_permits ORDER BY slot")
            .await;
    assert_eq!(slots, [1, 2]);
    assert!(claim(&client, who, 5).await.is_empty());
    let done = completer::succeed_many(&client, &[(first[0].lease(), None)]).await;
    assert_eq!(done.unwrap().len(), 1);
    assert_eq!(claim(&client, who, 5).await.len(), 1, "the freed slot only");
    assert_eq!(held(&client).await, (2, 2, 0, 0));
    let sample = durable_etl::service::metrics::sample_queues(&client)
        .await
        .unwrap();
    let keyed = sample.iter().find(|q| q.queue == "keyed").unwrap();
    assert_eq!((keyed.key_cap, keyed.key_permits_held), (Some(2), 2));
}

#[tokio::test]
async fn a_stale_finisher_frees_no_key_permit() {
    let (_db, client) = keyed_queue(1).await;
    enqueue(&client, &[Some("k"), Some("k")]).await;
    let [stale] = &claim(&client, claimant("stalled"), 2).await[..] else {
        unreachable!()
    };
    let stale = stale.lease();
    assert_eq!(expire_and_recover(&client).await, 1);
    let fresh = claim(&client, claimant("fresh"), 2).await;
    assert_eq!(fresh.len(), 1, "cap 1");
    assert_eq!(fresh[0].id(), stale.job_id, "the earliest job again");
    let lost = completer::fail(&client, stale, Code::HandlerFailed, None).await;
    assert_eq!(lost.unwrap(), Transition::LeaseLost);
    let lost = completer::retry(&client, stale, Duration::ZERO).await;
    assert_eq!(lost.unwrap(), Transition::LeaseLost);
    assert_eq!(completer::release(&client, &[stale], &[]).await.unwrap(), 0);
    let none = completer::succeed_many(&client, &[(stale, None)]).await;
    assert!(none.unwrap().is_empty());
    assert_eq!(held(&client).await, (1, 1, 0, 0), "the new claim's permit");
    assert!(claim(&client, claimant("third"), 2).await.is_empty());
}

#[tokio::test]
async fn a_lowered_key_cap_starts_nothing_until_the_key_falls_below_it() {
    let (_db, client) = keyed_queue(3).await;
    enqueue(&client, &[Some("k"); 6]).await;
    let who = claimant("lowered");
    let running = claim(&client, who, 6).await;
    assert_eq!(running.len(), 3);
    queue::set_key_cap(&client, "keyed", Some(1)).await.unwrap();
    for (i, job) in running.iter().enumerate() {
        assert!(claim(&client, who, 6).await.is_empty(), "{i} still held");
        let done = completer::succeed_many(&client, &[(job.lease(), None)]).await;
        assert_eq!(done.unwrap().len(), 1);
    }
    assert_eq!(claim(&client, who, 6).await.len(), 1, "the new cap");
    // Lifting the key cap lets the key's jobs run as the queue's own.
    queue::set_key_cap(&client, "keyed", None).await.unwrap();
    assert_eq!(claim(&client, who, 6).await.len(), 2, "the rest");
    assert!(matches!(
        queue::set_key_cap(&client, "keyed", Some(0)).await,
        Err(durable_etl::Error::Config(_))
    ));
    assert!(matches!(
        queue::set_key_cap(&client, "Not A Queue", Some(1)).await,
        Err(durable_etl::Error::Config(_))
    ));
}

/// A key cap lowered while more of a key run than the new cap starts no job of the key while its
/// running jobs are at or above the new cap, whichever of them ends first; running jobs finish.
#[tokio::test]
async fn a_lowered_key_cap_is_never_exceeded_by_a_claim_while_a_permit_above_it_is_held() {
    let (_db, client) = keyed_queue(3).await;
    enqueue(&client, &[Some("k"); 8]).await;
    let who = claimant("lowered-under");
    let running = claim(&client, who, 8).await;
    assert_eq!(running.len(), 3);
    queue::set_key_cap(&client, "keyed", Some(2)).await.unwrap();
    // The lowest slots end first, while slot 3, above the new cap, stays held.
    let mut by_slot = Vec::new();
    for job in &running {
        let slot: i32 = client
            .query_one(
                "SELECT slot FROM etl_key_permits WHERE claim_id = $1",
                &[&job.claim_id()],
            )
            .await
            .unwrap()
            .get(0);
        by_slot.push((slot, job.lease()));
    }
    by_slot.sort_by_key(|(slot, _)| *slot);
    for (slot, lease) in by_slot.iter().take(2) {
        let done = completer::succeed_many(&client, &[(*lease, None)]).await;
        assert_eq!(done.unwrap().len(), 1, "slot {slot} ends");
        let before = held(&client).await.0;
        let claimed = claim(&client, who, 8).await.len();
        let after = held(&client).await.0;
        crate::support::assert_within_lowered_cap(*slot, 2, (before, claimed, after));
    }
    assert_eq!(held(&client).await.0, 2, "the new cap, no more");
}

#[tokio::test]
async fn a_hot_key_at_its_cap_never_keeps_a_cold_key_from_being_claimed() {
    let (_db, client) = keyed_queue(1).await;
    let mut keys = vec![Some("hot"); 200];
    keys.push(Some("cold"));
    enqueue(&client, &keys).await;
    let who = claimant("fair");
    let first = claim(&client, who, 1).await;
    assert_eq!(keys_of(&client, &first).await, ["hot"], "the earliest job");
    let next = claim(&client, who, 1).await;
    assert_eq!(
        keys_of(&client, &next).await,
        ["cold"],
        "past 199 waiting jobs of the key at its cap"
    );
}

#[tokio::test]
async fn a_queue_cap_and_a_key_cap_both_hold() {
    let (_db, client) = keyed_queue(1).await;
    queue::set_cap(&client, "keyed", Some(2)).await.unwrap();
    enqueue(&client, &[Some("a"), Some("a"), Some("b"), Some("c")]).await;
    let who = claimant("both");
    let first = claim(&client, who, 4).await;
    assert_eq!(
        keys_of(&client, &first).await,
        ["a", "b"],
        "two, one per key"
    );
    assert_eq!(
        count(&client, "etl_queue_permits WHERE claim_id IS NOT NULL").await,
        2
    );
    assert!(claim(&client, who, 4).await.is_empty(), "the queue is full");
    let done = completer::succeed_many(&client, &[(first[0].lease(), None)]).await;
    assert_eq!(done.unwrap().len(), 1);
    let next = claim(&client, who, 4).await;
    assert_eq!(next.len(), 1, "one queue permit free");
    assert_eq!(held(&client).await, (1, 2, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claimers_never_run_two_jobs_of_a_key_with_cap_one() {
    let (db, client) = keyed_queue(1).await;
    enqueue(&client, &[Some("one"); 40]).await;
    let mut claimers = Vec::new();
    for _ in 0..4 {
        claimers.push(db.client().await);
    }
    for round in 0..10 {
        let claims = claimers.iter().enumerate().map(|(i, c)| async move {
            let owner = format!("racer-{i}");
            claimer::claim_from(c, claimant(&owner), &[("keyed", 4)]).await
        });
        let claimed: Vec<ClaimedJob> = futures::future::join_all(claims)
            .await
            .into_iter()
            .flat_map(|r| r.expect("no claim fails, none deadlocks"))
            .collect();
        assert!(claimed.len() <= 1, "round {round}: {} ran", claimed.len());
        assert_eq!(held(&client).await.0, i64::from(claimed.len() == 1));
        let leases: Vec<_> = claimed.iter().map(|j| (j.lease(), None)).collect();
        completer::succeed_many(&client, &leases).await.unwrap();
    }
    assert_eq!(held(&client).await, (0, 0, 0, 0));
}

#[tokio::test]
async fn a_key_is_kept_on_the_live_row_only_and_must_be_one_to_255_bytes() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    enqueue(&client, &[Some("customer-7")]).await;
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE concurrency_key = 'customer-7'"
        )
        .await,
        1
    );
    let shown: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_jobs j WHERE to_jsonb(j)::text LIKE '%customer-7%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, 0, "the jobs view never shows it");
    let long = "k".repeat(256);
    for bad in ["", long.as_str()] {
        let options = EnqueueOptions {
            concurrency_key: Some(bad),
            ..EnqueueOptions::default()
        };
        let job = Keyed { ms: 1, key: None };
        assert!(matches!(
            jobs().enqueue(&client, &job, options).await,
            Err(durable_etl::Error::Config(
                durable_etl::ConfigError::ConcurrencyKey
            ))
        ));
    }
    assert_eq!(
        count(&client, "etl_job_records").await,
        1,
        "nothing else written"
    );
}

/// A key permit freed by its holder's completion wakes nobody (migration 0023: the holder claims
/// next); one freed by a release notifies, and only while a replica waits for its queue.
#[tokio::test]
async fn a_freed_key_permit_notifies_only_when_released_while_a_replica_waits_for_its_queue() {
    let (db, client) = keyed_queue(1).await;
    let mut listener =
        crate::support::Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    enqueue(&client, &[Some("k"), Some("k"), Some("k"), Some("k")]).await;
    let who = claimant("notified");
    let first = claim(&client, who, 4).await;
    assert!(first[0].held_permit, "the keyed claim holds a key permit");
    // Nobody waits: a freed permit notifies nobody.
    let released = completer::release(&client, &[first[0].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    let second = claim(&client, who, 4).await;
    client
        .batch_execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues) VALUES ('other', '{elsewhere}')",
        )
        .await
        .unwrap();
    let released = completer::release(&client, &[second[0].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    let third = claim(&client, who, 4).await;
    client
        .batch_execute("UPDATE etl_waiting_replicas SET queues = '{keyed}'")
        .await
        .unwrap();
    // The holder's own completion: no wake, though a replica waits for the queue.
    completer::succeed_many(&client, &[(third[0].lease(), None)])
        .await
        .unwrap();
    let fourth = claim(&client, who, 4).await;
    let released = completer::release(&client, &[fourth[0].lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("test_sentinel").await,
        vec![("durable_etl_jobs".to_owned(), "q keyed".to_owned())],
        "the one released while a replica waited for the queue"
    );
    assert_eq!(count(&client, "etl_key_permits").await, 0);
}

/// Counts the running jobs of each key, handler-side, and the most of one key at once.
#[derive(Debug, Clone, Default)]
struct Gauge {
    /// Running jobs by key, and the most seen of any one key.
    inner: Arc<Mutex<(HashMap<String, i64>, i64)>>,
    /// Running jobs of every key, and the most seen at once.
    all: Arc<Mutex<(i64, i64)>>,
}

impl Gauge {
    /// Counts `delta` running jobs of `key`.
    fn step(&self, key: &str, delta: i64) {
        let mut inner = self.inner.lock().unwrap();
        let now = {
            let n = inner.0.entry(key.to_owned()).or_default();
            *n += delta;
            *n
        };
        inner.1 = inner.1.max(now);
        let mut all = self.all.lock().unwrap();
        all.0 += delta;
        all.1 = all.1.max(all.0);
    }
}

impl durable_etl::Perform for Gauge {
    type Job = Keyed;
    type Effects = ();

    async fn compute(
        &self,
        job: Keyed,
        _ctx: &durable_etl::job::handler::JobContext,
    ) -> Result<(), durable_etl::job::handler::JobError> {
        let key = job.key.unwrap_or_default();
        self.step(&key, 1);
        tokio::time::sleep(Duration::from_millis(job.ms)).await;
        self.step(&key, -1);
        Ok(())
    }
}

/// Two replicas of 8 slots, polling once a minute, on a queue whose key cap is 1: the
/// handler-side count of any one key never passes 1, both keys run at once, and the jobs flow
/// only because every freed key permit wakes a replica (a poll would take a minute per round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_run_one_job_per_key_and_a_freed_key_permit_wakes_them() {
    let (db, client) = keyed_queue(1).await;
    let gauge = Gauge::default();
    let replicas = crate::support::start_queue_replicas(&db, "keyed", 2, || {
        durable_etl::job::handler::Registry::new().perform(gauge.clone())
    })
    .await;
    let keys: Vec<Option<&str>> = (0..24)
        .map(|n| Some(if n % 2 == 0 { "even" } else { "odd" }))
        .collect();
    enqueue(&client, &keys).await;
    crate::support::eventually("the 24 keyed jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 24 }
    })
    .await;
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    let most_of_a_key = gauge.inner.lock().unwrap().1;
    assert_eq!(most_of_a_key, 1, "the key cap, never passed");
    let most = gauge.all.lock().unwrap().1;
    assert_eq!(most, 2, "both keys at once, no more");
    assert_eq!(count(&client, "etl_key_permits").await, 0);
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE attempts = 1").await,
        24,
        "each ran once"
    );
}

/// Whether column `column` of table `table` exists.
async fn has_column(client: &tokio_postgres::Client, table: &str, column: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT FROM information_schema.columns
                             WHERE table_name = $1 AND column_name = $2)",
            &[&table, &column],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn migration_0022_is_breaking_for_readers_and_round_trips_with_keyed_jobs_running() {
    let (db, mut client) = keyed_queue(1).await;
    let latest = crate::support::catalog_snapshot(&client).await;
    enqueue(&client, &[Some("k"), Some("k"), None]).await;
    assert_eq!(claim(&client, claimant("rolling"), 3).await.len(), 2);
    let min_reader: i32 = client
        .query_one(
            "SELECT min_reader_version FROM durable_etl_schema_history WHERE version = 22",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(min_reader, 22, "a release before it frees no key permit");
    let down = durable_etl::schema::migrate_down_to(&mut client, 21)
        .await
        .unwrap();
    assert_eq!((down.changed, down.version), (versions_above(21, true), 21));
    assert!(!has_column(&client, "etl_job_records", "concurrency_key").await);
    assert!(!has_column(&client, "etl_queues", "key_cap").await);
    assert_eq!(count(&client, "etl_job_records").await, 3, "no job lost");
    let permits: Option<String> = client
        .query_one("SELECT to_regclass('etl_key_permits')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(permits, None);
    let up = durable_etl::schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.changed, versions_above(21, false));
    assert_eq!(crate::support::catalog_snapshot(&client).await, latest);
    drop(db);
}
