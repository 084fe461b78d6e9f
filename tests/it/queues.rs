//! Queues, routing and priorities end to end: a replica claims only the queues it serves and the
//! kinds it runs (a job of any other kind waits, and a rolling deploy that adds a kind loses
//! nothing), shares its slots among its queues by weight, leaves a paused queue alone, wakes
//! only for its own queues, and enqueues carry a kind's queue and priority or the caller's.

use crate::handlers::{Noop, NOOP};
use crate::support::{count, pool, versions_above, TestDb};
use durable_etl::job::handler::{JobContext, JobError, Registry};
use durable_etl::queue;
use durable_etl::schema;
use durable_etl::worker::completer::Transition;
use durable_etl::{EnqueueOptions, Job, Jobs, Perform, Secret, Worker, WorkerConfig};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A kind whose jobs go to the `mail` queue at priority 3 unless the enqueue says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Letter {
    /// Which letter.
    n: i64,
}

impl Job for Letter {
    const KIND: &'static str = "test.letter";
    const QUEUE: &'static str = "mail";
    const PRIORITY: i16 = 3;
}

/// Runs letters, writing nothing.
struct Postman;

impl Perform for Postman {
    type Job = Letter;
    type Effects = ();

    async fn compute(&self, _job: Letter, _ctx: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

/// A replica configuration serving `queues` with `slots`.
fn serving(owner: &str, queues: &str, slots: usize) -> WorkerConfig {
    WorkerConfig {
        owner_id: owner.to_owned(),
        slots,
        prefetch: 0,
        poll_interval: Duration::from_millis(100),
        lease: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(1),
        queues: queue::parse(queues).unwrap(),
        ..WorkerConfig::default()
    }
}

/// A replica on `db` with `config` and `registry`.
async fn start(db: &TestDb, config: WorkerConfig, registry: Registry) -> Worker {
    Worker::start(pool(db).await, &db.config, config, registry)
        .await
        .unwrap()
}

/// A handle enqueuing for one owner.
fn jobs() -> Jobs {
    Jobs::new(
        Secret::new(b"queues-secret-0123456789".to_vec()).unwrap(),
        "tenant",
    )
}

/// `(queue, priority)` of job `id` on its intake row and on its live row (if it has one).
async fn placed(client: &tokio_postgres::Client, id: uuid::Uuid) -> Vec<(String, i16)> {
    client
        .query(
            "SELECT queue, priority FROM etl_job_intake WHERE id = $1
             UNION ALL
             SELECT queue, priority FROM etl_job_records WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn an_enqueue_places_a_job_in_its_kinds_queue_or_the_one_it_names() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let default = jobs
        .enqueue(&client, &Letter { n: 1 }, EnqueueOptions::default())
        .await
        .unwrap();
    let named = EnqueueOptions {
        queue: Some("urgent"),
        priority: Some(0),
        ..EnqueueOptions::default()
    };
    let chosen = jobs
        .enqueue(&client, &Letter { n: 2 }, named)
        .await
        .unwrap();
    let mail = ("mail".to_owned(), 3);
    assert_eq!(placed(&client, default.id).await, vec![mail.clone(), mail]);
    let urgent = ("urgent".to_owned(), 0);
    assert_eq!(
        placed(&client, chosen.id).await,
        vec![urgent.clone(), urgent]
    );
    let view: Vec<(String, i16)> = client
        .query(
            "SELECT queue, priority FROM etl_jobs WHERE id = $1",
            &[&default.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(view, vec![("mail".to_owned(), 3)]);
    // The owner's status view says where each job is.
    let status = jobs.status(&client, chosen.id).await.unwrap().unwrap();
    assert_eq!(
        (status.kind.as_str(), status.queue.as_str(), status.priority),
        ("test.letter", "urgent", 0)
    );
    let listed = jobs
        .list(&client, durable_etl::jobs::Window::default(), None, 10)
        .await
        .unwrap();
    let queues: Vec<&str> = listed.jobs.iter().map(|j| j.queue.as_str()).collect();
    assert_eq!(queues, ["urgent", "mail"], "newest first");
    // A queue the schema cannot store, or a priority out of range, is refused before any write.
    for options in [
        EnqueueOptions {
            queue: Some("Mail"),
            ..EnqueueOptions::default()
        },
        EnqueueOptions {
            priority: Some(10),
            ..EnqueueOptions::default()
        },
        EnqueueOptions {
            priority: Some(-1),
            ..EnqueueOptions::default()
        },
    ] {
        let refused = jobs.enqueue(&client, &Letter { n: 3 }, options).await;
        assert!(
            matches!(refused, Err(durable_etl::Error::Config(_))),
            "{refused:?}"
        );
    }
    assert_eq!(count(&client, "etl_job_intake").await, 2);
}

#[tokio::test]
async fn a_replica_never_claims_a_kind_it_does_not_run_and_a_rolling_deploy_loses_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let letters = EnqueueOptions {
        queue: Some("default"),
        ..EnqueueOptions::default()
    };
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            jobs.enqueue(&client, &Letter { n }, letters)
                .await
                .unwrap()
                .id,
        );
    }
    crate::support::insert_jobs(&client, NOOP, &vec![serde_json::json!({}); 2], 3).await;
    // The old release runs no-ops only: it takes those and leaves the letters alone.
    let old = start(
        &db,
        serving("old", "default", 8),
        Registry::new().register(Noop),
    )
    .await;
    let done = old.step().await.unwrap();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|(_, t)| *t == Transition::Succeeded));
    assert!(old.step().await.unwrap().is_empty(), "nothing else is its");
    let waiting: Vec<(String, i32)> = client
        .query(
            "SELECT status, attempts FROM etl_jobs WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(waiting, vec![("pending".to_owned(), 0); 3], "untouched");
    // The new release runs both: each letter runs once, on its first attempt.
    let registry = Registry::new().register(Noop).perform(Postman);
    let new = start(&db, serving("new", "default", 8), registry).await;
    let done = new.step().await.unwrap();
    let mut ran: Vec<uuid::Uuid> = done.iter().map(|d| d.0).collect();
    ran.sort();
    assert_eq!(ran, ids);
    assert_eq!(
        count(
            &client,
            "etl_job_outcomes WHERE status = 'succeeded' AND attempts = 1"
        )
        .await,
        5
    );
}

#[tokio::test]
async fn a_replica_claims_only_its_queues_and_shares_its_slots_by_weight() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    for queue in ["bulk", "mail", "other"] {
        let letters: Vec<Letter> = (0..40).map(|n| Letter { n }).collect();
        let placed = letters.iter().map(|l| {
            let options = EnqueueOptions {
                queue: Some(queue),
                ..EnqueueOptions::default()
            };
            (l, options)
        });
        jobs.enqueue_many_with(&client, placed).await.unwrap();
    }
    let worker = start(
        &db,
        serving("weighted", "mail:3,bulk", 8),
        Registry::new().perform(Postman),
    )
    .await;
    let mut by_queue = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..4 {
        let done = worker.step().await.unwrap();
        assert_eq!(done.len(), 8, "a full claim every step");
        for (id, _) in done {
            let queue: String = client
                .query_one("SELECT queue FROM etl_job_intake WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get(0);
            *by_queue.entry(queue).or_default() += 1;
        }
    }
    // Of 32 jobs, 3:1 is 24 and 8; the unserved queue gave none.
    assert_eq!(
        by_queue.into_iter().collect::<Vec<_>>(),
        vec![("bulk".to_owned(), 8), ("mail".to_owned(), 24)]
    );
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE queue = 'other' AND attempts = 0"
        )
        .await,
        40
    );
}

#[tokio::test]
async fn a_paused_queue_is_not_claimed_until_it_is_resumed() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let ids = jobs
        .enqueue_many(&client, &[Letter { n: 1 }, Letter { n: 2 }])
        .await
        .unwrap();
    queue::set_paused(&client, "mail", true).await.unwrap();
    let worker = start(
        &db,
        serving("pauser", "mail", 4),
        Registry::new().perform(Postman),
    )
    .await;
    assert!(worker.step().await.unwrap().is_empty(), "paused");
    // Enqueues into a paused queue are accepted, and wait.
    jobs.enqueue(&client, &Letter { n: 3 }, EnqueueOptions::default())
        .await
        .unwrap();
    assert!(worker.step().await.unwrap().is_empty(), "still paused");
    queue::set_paused(&client, "mail", false).await.unwrap();
    let done = worker.step().await.unwrap();
    assert_eq!(done.len(), 3);
    assert!(done.iter().any(|d| d.0 == ids[0]));
    assert!(matches!(
        queue::set_paused(&client, "Not A Queue", true).await,
        Err(durable_etl::Error::Config(_))
    ));
}

/// An enqueue names only a replica that waits for its queue (and runs its kind): a job of
/// another queue notifies nobody (migration 0028).
#[tokio::test]
async fn an_enqueue_wakes_only_replicas_waiting_for_its_queue() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let mut listener =
        crate::support::Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    client
        .batch_execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token)
             VALUES ('mailer', '{mail}', '{test.letter}', 7)",
        )
        .await
        .unwrap();
    let jobs = jobs();
    let elsewhere = EnqueueOptions {
        queue: Some("bulk"),
        ..EnqueueOptions::default()
    };
    jobs.enqueue(&client, &Letter { n: 1 }, elsewhere)
        .await
        .unwrap();
    jobs.enqueue(&client, &Letter { n: 2 }, EnqueueOptions::default())
        .await
        .unwrap();
    // A row whose queues are not listed waits for nothing.
    client
        .batch_execute("UPDATE etl_waiting_replicas SET queues = NULL;")
        .await
        .unwrap();
    jobs.enqueue(&client, &Letter { n: 3 }, EnqueueOptions::default())
        .await
        .unwrap();
    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("test_sentinel").await,
        vec![(
            "durable_etl_jobs".to_owned(),
            "t 7 mail test.letter".to_owned()
        )],
        "the mail enqueue only"
    );
}

/// Whether relation `name` exists.
async fn exists(client: &tokio_postgres::Client, name: &str) -> bool {
    let found: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&name])
        .await
        .unwrap()
        .get(0);
    found.is_some()
}

#[tokio::test]
async fn migration_0020_puts_every_job_in_the_default_queue_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = crate::support::catalog_snapshot(&client).await;
    let down = schema::migrate_down_to(&mut client, 19).await.unwrap();
    assert_eq!((down.changed, down.version), (versions_above(19, true), 19));
    // Jobs of release 19: one due, one deferred, in its layout (no queue, no deadline).
    client
        .batch_execute(
            "WITH intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at)
                 SELECT gen_random_uuid(), decode(repeat('07', 32), 'hex'),
                        sha256(g::text::bytea), sha256(''), 'test.noop', 5,
                        now() + (g - 1) * interval '1 hour'
                   FROM generate_series(1, 2) g
                 RETURNING id, owner_key, kind, max_attempts, run_at
             )
             INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
             SELECT id, owner_key, kind, '{}'::jsonb, max_attempts, run_at FROM intake",
        )
        .await
        .unwrap();
    assert!(exists(&client, "etl_job_records_pending_due_idx").await);
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.changed, versions_above(19, false));
    assert_eq!(crate::support::catalog_snapshot(&client).await, latest);
    let placed: Vec<(String, i16, bool)> = client
        .query(
            "SELECT j.queue, j.priority, j.sort_at = j.run_at
               FROM etl_job_records j JOIN etl_job_intake i USING (id)
              WHERE i.queue = 'default' AND i.priority = 0",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(placed, vec![("default".to_owned(), 0, true); 2]);
    assert!(exists(&client, "etl_job_records_claim_idx").await);
    assert!(!exists(&client, "etl_job_records_pending_due_idx").await);
    // A deferred job dated after its deadline is refused: it would sort before its due time.
    let refused = client
        .batch_execute(
            "UPDATE etl_job_records SET run_at = run_at + interval '1 minute'
              WHERE run_at > now()",
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
    let min_reader: i32 = client
        .query_one(
            "SELECT min_reader_version FROM durable_etl_schema_history WHERE version = 20",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        min_reader, 20,
        "releases before it insert rows without deadlines"
    );
    // Down again: the jobs keep their due times and the pending index is back for release 19.
    schema::migrate_down_to(&mut client, 19).await.unwrap();
    assert!(exists(&client, "etl_job_records_pending_due_idx").await);
    assert!(!exists(&client, "etl_job_records_claim_idx").await);
    assert_eq!(count(&client, "etl_job_records").await, 2);
    assert!(!exists(&client, "etl_queues").await);
}

#[tokio::test]
async fn the_per_queue_sample_counts_each_queue_and_its_cap_and_pause() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let in_queue = |queue| EnqueueOptions {
        queue: Some(queue),
        ..EnqueueOptions::default()
    };
    for _ in 0..3 {
        jobs.enqueue(&client, &Letter { n: 0 }, in_queue("mail"))
            .await
            .unwrap();
    }
    let later = EnqueueOptions {
        run_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
        ..in_queue("bulk")
    };
    jobs.enqueue(&client, &Letter { n: 1 }, later)
        .await
        .unwrap();
    queue::set_cap(&client, "mail", Some(2)).await.unwrap();
    queue::set_paused(&client, "idle", true).await.unwrap();
    // One claim: it holds two permits while its jobs are running (taken, not yet run).
    let claimed = durable_etl::worker::claimer::claim_from(
        &client,
        durable_etl::worker::claimer::Claimant {
            owner_id: "sampler",
            owner_locked: false,
            lease: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(4),
            alive_locked: false,
            kinds: &["test.letter"],
        },
        &[("mail", 8)],
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 2);
    let sample = durable_etl::service::metrics::sample_queues(&client)
        .await
        .unwrap();
    let of = |name: &str| sample.iter().find(|q| q.queue == name).cloned().unwrap();
    let mail = of("mail");
    assert_eq!(
        (
            mail.due,
            mail.deferred,
            mail.running,
            mail.cap,
            mail.permits_held,
            mail.paused
        ),
        (1, 0, 2, Some(2), 2, false)
    );
    assert!(mail.oldest_due_seconds >= 0.0);
    let bulk = of("bulk");
    assert_eq!((bulk.due, bulk.deferred, bulk.cap), (0, 1, None));
    let idle = of("idle");
    assert_eq!((idle.due, idle.running, idle.paused), (0, 0, true));
    assert_eq!(sample[0].queue, "mail", "the deepest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_jobs_no_live_replica_serves_are_counted_unserved_per_queue() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let bulk = EnqueueOptions {
        queue: Some("bulk"),
        ..EnqueueOptions::default()
    };
    for (n, options) in [
        (0, EnqueueOptions::default()),
        (1, EnqueueOptions::default()),
        (2, bulk),
    ] {
        jobs.enqueue(&client, &Letter { n }, options).await.unwrap();
    }
    let unserved = || async {
        let sample = durable_etl::service::metrics::sample_queues(&client)
            .await
            .unwrap();
        let of = |name: &str| sample.iter().find(|q| q.queue == name).map(|q| q.unserved);
        (of("mail"), of("bulk"))
    };
    assert_eq!(unserved().await, (Some(2), Some(1)), "no replica at all");
    // A replica of the no-ops serving mail reports its kinds and queues; it runs no letter.
    let replica = start(
        &db,
        serving("noops", "mail,other", 4),
        Registry::new().register(Noop),
    )
    .await
    .spawn();
    crate::support::eventually("the no-op replica's report", || {
        let client = &client;
        async move {
            let of_it = "etl_replicas WHERE kinds = '{test.noop}' AND queues = '{mail,other}'";
            count(client, of_it).await == 1
        }
    })
    .await;
    assert_eq!(unserved().await, (Some(2), Some(1)), "it runs no letter");
    // A live replica that runs letters for bulk (its report, as it writes it).
    client
        .batch_execute(
            "INSERT INTO etl_replicas (owner_id, incarnation, started_at, reported_at, held,
                                       claimed, claim_rate, kinds, queues)
             VALUES ('letters', gen_random_uuid(), now(), now(), 0, 0, 0, '{test.letter}',
                     '{bulk}')",
        )
        .await
        .unwrap();
    assert_eq!(unserved().await, (Some(2), Some(0)));
    // It stops reporting: once its last report is older than SERVED_WITHIN, bulk is unserved.
    let stale = durable_etl::service::metrics::SERVED_WITHIN.as_secs() + 1;
    client
        .execute(
            "UPDATE etl_replicas SET reported_at = now() - $1 * interval '1 second'
              WHERE owner_id = 'letters'",
            &[&f64::from(u32::try_from(stale).unwrap())],
        )
        .await
        .unwrap();
    assert_eq!(unserved().await, (Some(2), Some(1)));
    replica.stop().await.unwrap();
}

/// One replica of 8 slots serving twenty queues, polling once a minute, with every job in the
/// last of them: its first claims ask only empty queues, which come back short, and the hot
/// one's backlog still drains at once (a short claim while some queue was not asked yet, or
/// filled its ask, claims again for the room left, the short queues left out), never one poll
/// at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_serving_many_queues_drains_the_one_with_work_without_waiting_for_polls() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = jobs();
    let hot = EnqueueOptions {
        queue: Some("q19"),
        ..EnqueueOptions::default()
    };
    let letters: Vec<Letter> = (0..120).map(|n| Letter { n }).collect();
    jobs.enqueue_many_with(&client, letters.iter().map(|l| (l, hot)))
        .await
        .unwrap();
    let served: Vec<String> = (0..20).map(|i| format!("q{i}")).collect();
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(60),
        ..serving("many", &served.join(","), 8)
    };
    let replica = start(&db, config, Registry::new().perform(Postman))
        .await
        .spawn();
    crate::support::eventually("the hot queue's 120 jobs to succeed", || {
        let client = &client;
        async move { count(client, "etl_job_outcomes WHERE status = 'succeeded'").await == 120 }
    })
    .await;
    replica.stop().await.unwrap();
}
