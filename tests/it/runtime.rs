//! The job runtime for any kind, through the public API only: a typed kind enqueued with a
//! domain write in the caller's transaction, run by a worker, its effects committed with its
//! success; idempotency, bulk enqueue, replacement and cancellation, retries and failures, and a
//! stale claim's effects fenced out.

use crate::support::{count, eventually, pool, TestDb};
use durable_etl::jobs::Window;
use durable_etl::worker::completer::Transition;
use durable_etl::worker::rescuer::Recovered;
use durable_etl::{
    shutdown, Apply, Code, EnqueueOptions, Error, Job, JobContext, JobError, JobState, Jobs,
    Perform, Registry, Secret, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_postgres::Transaction;
use uuid::Uuid;

/// The test's welcome-email kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Welcome {
    /// The user the email greets.
    user_id: i64,
    /// Where it goes.
    email: String,
}

impl Job for Welcome {
    const KIND: &'static str = "test.welcome";
    const MAX_ATTEMPTS: i32 = 3;
}

/// Records the sent email in the domain table `sent`, inside the fence.
struct Sent(Welcome);

impl Apply for Sent {
    async fn apply(self, tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        tx.execute(
            "INSERT INTO sent (user_id, email, job_id, attempt, due) VALUES ($1, $2, $3, $4, $5)",
            &[
                &self.0.user_id,
                &self.0.email,
                &job.id,
                &job.attempt,
                &job.run_at,
            ],
        )
        .await?;
        Ok(())
    }
}

/// Sends welcome emails; fails transiently on the attempts before `succeed_from`, and
/// permanently for user 0.
struct Mailer {
    /// The first attempt that succeeds.
    succeed_from: i32,
    /// Compute phases run.
    computed: Arc<AtomicI32>,
}

impl Perform for Mailer {
    type Job = Welcome;
    type Effects = Sent;

    async fn compute(&self, job: Welcome, ctx: &JobContext) -> Result<Sent, JobError> {
        self.computed.fetch_add(1, Ordering::SeqCst);
        if job.user_id == 0 {
            return Err(JobError::permanent(Code::HandlerFailed));
        }
        if ctx.attempt < self.succeed_from {
            return Err(JobError::transient("mail server busy"));
        }
        Ok(Sent(job))
    }
}

/// A test database with the domain tables `users` and `sent`, and a [`Jobs`] handle on it.
async fn domain() -> (TestDb, tokio_postgres::Client, Jobs) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id int8 PRIMARY KEY, email text NOT NULL);
             CREATE TABLE sent (user_id int8, email text, job_id uuid, attempt int4,
                                due timestamptz)",
        )
        .await
        .unwrap();
    let secret = Secret::new(b"runtime-secret-0123456789".to_vec()).unwrap();
    (db, client, Jobs::new(secret, "tenant-1"))
}

/// Runs a replica with `mailer` until `done` holds, then stops it.
async fn run_until<F, Fut>(db: &TestDb, mailer: Mailer, what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let config = WorkerConfig {
        owner_id: "runtime".into(),
        retry_min_delay: Duration::from_millis(10),
        retry_max_delay: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(mailer);
    let worker = Worker::start(pool(db).await, &db.config, config, registry)
        .await
        .unwrap();
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(worker.run(until));
    eventually(what, done).await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
}

/// Runs a replica with `mailer` until no job is live.
async fn run_until_ended(db: &TestDb, mailer: Mailer, what: &str) {
    let probe = db.client().await;
    run_until(db, mailer, what, || async {
        count(&probe, "etl_job_records").await == 0
    })
    .await;
}

/// The welcome job of user `user_id`.
fn welcome(user_id: i64) -> Welcome {
    Welcome {
        user_id,
        email: format!("u{user_id}@example.test"),
    }
}

/// Enqueues `job` now, for the handle's owner, without a key.
async fn enqueue_now(
    jobs: &Jobs,
    client: &impl tokio_postgres::GenericClient,
    job: &Welcome,
) -> Uuid {
    jobs.enqueue(client, job, EnqueueOptions::default())
        .await
        .unwrap()
        .id
}

/// A mailer that succeeds from attempt `from`, and its compute counter.
fn mailer(from: i32) -> (Mailer, Arc<AtomicI32>) {
    let computed = Arc::new(AtomicI32::new(0));
    let m = Mailer {
        succeed_from: from,
        computed: Arc::clone(&computed),
    };
    (m, computed)
}

#[tokio::test]
async fn a_typed_job_enqueued_with_a_domain_write_runs_once_and_commits_its_effects() {
    let (db, mut client, jobs) = domain().await;
    let welcome = welcome(42);
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO users VALUES (42, 'a@example.test')", &[])
        .await
        .unwrap();
    let queued = jobs
        .enqueue(&tx, &welcome, EnqueueOptions::default())
        .await
        .unwrap();
    assert!(!queued.replayed);
    tx.commit().await.unwrap();

    let (m, computed) = mailer(1);
    let probe = db.client().await;
    run_until(&db, m, "the welcome job to succeed", || async {
        count(&probe, "sent").await == 1
    })
    .await;
    let row = client
        .query_one("SELECT user_id, email, job_id, attempt, due FROM sent", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 42);
    assert_eq!(row.get::<_, String>(1), "u42@example.test");
    assert_eq!(row.get::<_, Uuid>(2), queued.id);
    assert_eq!(computed.load(Ordering::SeqCst), 1);
    let status = jobs.status(&client, queued.id).await.unwrap().unwrap();
    assert_eq!(status.status, JobState::Succeeded);
    // The handler saw when the job was due: its `run_at`.
    let due: chrono::DateTime<chrono::Utc> = row.get(4);
    assert_eq!(Ok(due), status.run_at.parse());
    assert_eq!((status.attempts, status.max_attempts), (1, 3));
    // A kind that keeps no ledger reports none (no rows, no checksum).
    assert_eq!(status.result, None);
    // Another owner cannot see it.
    let other = jobs.for_owner("tenant-2");
    assert_eq!(other.status(&client, queued.id).await.unwrap(), None);
    // The payload left with the live row.
    assert_eq!(count(&client, "etl_job_records").await, 0);
}

#[tokio::test]
async fn an_enqueue_rolled_back_with_the_domain_write_leaves_neither() {
    let (_db, mut client, jobs) = domain().await;
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO users VALUES (7, 'b@example.test')", &[])
        .await
        .unwrap();
    let queued = enqueue_now(&jobs, &tx, &welcome(7)).await;
    tx.rollback().await.unwrap();
    assert_eq!(count(&client, "users").await, 0);
    assert_eq!(count(&client, "etl_job_intake").await, 0);
    assert_eq!(count(&client, "etl_job_records").await, 0);
    assert_eq!(jobs.status(&client, queued).await.unwrap(), None);
}

#[tokio::test]
async fn a_duplicate_key_returns_the_same_job_and_a_different_payload_under_it_is_refused() {
    let (_db, client, jobs) = domain().await;
    let options = EnqueueOptions {
        idempotency_key: Some("welcome-42"),
        ..EnqueueOptions::default()
    };
    let welcome = welcome(42);
    let first = jobs.enqueue(&client, &welcome, options).await.unwrap();
    let again = jobs.enqueue(&client, &welcome, options).await.unwrap();
    assert_eq!(again.id, first.id);
    assert!(again.replayed);
    let changed = Welcome {
        email: "other@example.test".into(),
        ..welcome.clone()
    };
    match jobs.enqueue(&client, &changed, options).await {
        Err(Error::Rejected(r)) => assert_eq!(r.code, Code::IdempotencyKeyReused),
        other => panic!("a different payload under the key was not refused: {other:?}"),
    }
    // Under another owner the key is another key.
    let theirs = jobs
        .enqueue(
            &client,
            &changed,
            EnqueueOptions {
                owner: Some("tenant-2"),
                ..options
            },
        )
        .await
        .unwrap();
    assert_ne!(theirs.id, first.id);
    assert_eq!(count(&client, "etl_job_intake").await, 2);
    // Jobs without a key never match each other.
    let a = enqueue_now(&jobs, &client, &welcome).await;
    assert_ne!(a, enqueue_now(&jobs, &client, &welcome).await);
}

#[tokio::test]
async fn a_bulk_enqueue_commits_every_job_with_the_transaction_and_none_before() {
    let (db, mut client, jobs) = domain().await;
    let batch: Vec<Welcome> = (1..=12_000)
        .map(|i| Welcome {
            user_id: i,
            email: format!("u{i}@example.test"),
        })
        .collect();
    let tx = client.transaction().await.unwrap();
    let ids = jobs.enqueue_many(&tx, &batch).await.unwrap();
    assert_eq!(ids.len(), batch.len());
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), batch.len());
    let outside = db.client().await;
    assert_eq!(count(&outside, "etl_job_records").await, 0);
    tx.commit().await.unwrap();
    assert_eq!(
        count(
            &outside,
            "etl_job_records WHERE kind = 'test.welcome' AND status = 'pending'"
        )
        .await,
        12_000
    );
    // In order: the 1,000th id is the 1,000th job.
    let payload: serde_json::Value = outside
        .query_one(
            "SELECT request_payload FROM etl_job_records WHERE id = $1",
            &[&ids[999]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload["user_id"], 1000);
    // A job without a key has a key of its own, its id padded with zeros (no digest), so the
    // owner's run of the idempotency index grows at its end.
    let own_keys = "etl_job_intake
        WHERE idempotency_key_digest = uuid_send(id) || decode(repeat('00', 16), 'hex')
          AND request_fingerprint = idempotency_key_digest";
    assert_eq!(count(&outside, own_keys).await, 12_000);
}

#[tokio::test]
async fn a_custom_kind_is_replaced_and_cancelled_under_its_owner() {
    let (_db, client, jobs) = domain().await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let welcome = welcome(5);
    let deferred = EnqueueOptions {
        run_at: Some(later),
        ..EnqueueOptions::default()
    };
    let old = jobs.enqueue(&client, &welcome, deferred).await.unwrap();
    let new = jobs
        .enqueue(
            &client,
            &welcome,
            EnqueueOptions {
                replaces: Some(old.id),
                ..deferred
            },
        )
        .await
        .unwrap();
    let old_status = jobs.status(&client, old.id).await.unwrap().unwrap();
    assert_eq!(old_status.status, JobState::Cancelled);
    assert_eq!(old_status.failure.unwrap().code, "replaced");
    assert_eq!(
        jobs.status(&client, new.id)
            .await
            .unwrap()
            .unwrap()
            .replaces,
        Some(old.id)
    );
    // Another owner can neither cancel it nor see it.
    let other = jobs.for_owner("tenant-2");
    assert_eq!(
        other.cancel(&client, new.id).await.unwrap(),
        durable_etl::jobs::Cancel::NotFound
    );
    assert_eq!(
        jobs.cancel(&client, new.id).await.unwrap(),
        durable_etl::jobs::Cancel::Cancelled
    );
    let page = jobs
        .list(&client, Window::default(), Some(JobState::Cancelled), 10)
        .await
        .unwrap();
    let listed: Vec<Uuid> = page.jobs.iter().map(|j| j.id).collect();
    assert_eq!(listed, vec![new.id, old.id]);
    assert_eq!(count(&client, "etl_job_records").await, 0);
}

#[tokio::test]
async fn a_transient_failure_is_retried_within_the_kinds_bound_and_a_permanent_one_is_not() {
    let (db, client, jobs) = domain().await;
    let retried = welcome(1);
    let ok = enqueue_now(&jobs, &client, &retried).await;
    let bad = enqueue_now(&jobs, &client, &welcome(0)).await;
    let (m, computed) = mailer(3);
    run_until_ended(&db, m, "both jobs to end").await;
    let ok = jobs.status(&client, ok).await.unwrap().unwrap();
    assert_eq!(ok.status, JobState::Succeeded);
    assert_eq!(ok.attempts, 3, "two transient failures, then success");
    let bad = jobs.status(&client, bad).await.unwrap().unwrap();
    assert_eq!(bad.status, JobState::Failed);
    assert_eq!(bad.attempts, 1, "a permanent failure is never retried");
    assert_eq!(bad.failure.unwrap().code, "handler_failed");
    assert_eq!(computed.load(Ordering::SeqCst), 4);
    assert_eq!(count(&client, "sent").await, 1);

    // A kind whose attempts are spent ends `attempts_exhausted`, after exactly its bound.
    let spent = jobs
        .enqueue(
            &client,
            &retried,
            EnqueueOptions {
                max_attempts: Some(2),
                ..EnqueueOptions::default()
            },
        )
        .await
        .unwrap();
    let (m, computed) = mailer(i32::MAX);
    run_until_ended(&db, m, "the spent job to end").await;
    let spent = jobs.status(&client, spent.id).await.unwrap().unwrap();
    assert_eq!(spent.status, JobState::Failed);
    assert_eq!(spent.attempts, 2);
    assert_eq!(spent.failure.unwrap().code, "attempts_exhausted");
    assert_eq!(computed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_payload_that_does_not_decode_as_the_kind_fails_invalid_payload() {
    let (db, client, jobs) = domain().await;
    #[derive(Serialize, Deserialize)]
    struct Impostor {
        /// Not a `Welcome`.
        user: String,
    }
    impl Job for Impostor {
        const KIND: &'static str = "test.welcome";
    }
    let impostor = Impostor { user: "x".into() };
    let queued = jobs
        .enqueue(&client, &impostor, EnqueueOptions::default())
        .await
        .unwrap();
    let (m, computed) = mailer(1);
    run_until_ended(&db, m, "the impostor to end").await;
    let status = jobs.status(&client, queued.id).await.unwrap().unwrap();
    assert_eq!(status.status, JobState::Failed);
    assert_eq!(status.failure.unwrap().code, "invalid_payload");
    assert_eq!(computed.load(Ordering::SeqCst), 0);
}

/// A kind with its own policy: retried an hour after a transient failure, and five seconds per
/// phase, whatever the replica's settings.
#[derive(Debug, Serialize, Deserialize)]
struct Patient {
    /// `transient`, `retry_after` (two hours), `forever` (a retry after `Duration::MAX`) or
    /// `slow` (1.5 s of compute).
    mode: String,
}

impl Job for Patient {
    const KIND: &'static str = "test.patient";
    const EXECUTION_TIMEOUT: Option<Duration> = Some(Duration::from_secs(5));

    fn retry_delay(_attempt: i32) -> Option<Duration> {
        Some(Duration::from_secs(3600))
    }
}

/// A kind whose compute phase may take only 100 ms.
#[derive(Debug, Serialize, Deserialize)]
struct Hasty {}

impl Job for Hasty {
    const KIND: &'static str = "test.hasty";
    const EXECUTION_TIMEOUT: Option<Duration> = Some(Duration::from_millis(100));
}

/// Runs [`Patient`] jobs as their mode says.
struct PatientRunner;

impl Perform for PatientRunner {
    type Job = Patient;
    type Effects = ();

    async fn compute(&self, job: Patient, _ctx: &JobContext) -> Result<(), JobError> {
        match job.mode.as_str() {
            "transient" => Err(JobError::transient("busy")),
            "retry_after" => Err(JobError::retry_after(
                Duration::from_secs(7200),
                "come back in two hours",
            )),
            "forever" => Err(JobError::retry_after(Duration::MAX, "come back never")),
            _ => {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok(())
            }
        }
    }
}

/// Runs [`Hasty`] jobs too slowly for their kind (500 ms), not for the replica.
struct HastyRunner;

impl Perform for HastyRunner {
    type Job = Hasty;
    type Effects = ();

    async fn compute(&self, _job: Hasty, _ctx: &JobContext) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }
}

/// Seconds from `from` to `to`, both canonical UTC timestamps of a status.
fn seconds_between(from: &str, to: &str) -> i64 {
    let at = |t: &str| t.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    (at(to) - at(from)).num_seconds()
}

#[tokio::test]
async fn a_kinds_own_timeout_and_retry_delay_override_the_replicas_and_a_retry_after_both() {
    let (db, client, jobs) = domain().await;
    let mut ids = Vec::new();
    for mode in ["transient", "retry_after", "slow", "forever"] {
        let job = Patient { mode: mode.into() };
        let queued = jobs.enqueue(&client, &job, EnqueueOptions::default());
        ids.push(queued.await.unwrap().id);
    }
    let hasty = jobs.enqueue(&client, &Hasty {}, EnqueueOptions::default());
    let hasty = hasty.await.unwrap().id;
    // The replica's own policy would retry within 20 ms and cut every phase at 1 s.
    let config = WorkerConfig {
        owner_id: "policies".into(),
        execution_timeout: Duration::from_secs(1),
        retry_min_delay: Duration::from_millis(10),
        retry_max_delay: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(PatientRunner).perform(HastyRunner);
    let replica = Worker::start(pool(&db).await, &db.config, config, registry)
        .await
        .unwrap()
        .spawn();
    let probe = db.client().await;
    eventually("three retries waiting and two jobs ended", || async {
        count(
            &probe,
            "etl_job_records WHERE status = 'pending' AND attempts = 1",
        )
        .await
            == 3
            && count(&probe, "etl_job_outcomes").await == 2
    })
    .await;
    replica.stop().await.unwrap();

    let status = |id| {
        let (jobs, client) = (&jobs, &client);
        async move { jobs.status(client, id).await.unwrap().unwrap() }
    };
    let transient = status(ids[0]).await;
    let wait = seconds_between(&transient.updated_at, &transient.run_at);
    assert!((3590..=3610).contains(&wait), "the kind's hour: {wait} s");
    let later = status(ids[1]).await;
    let wait = seconds_between(&later.updated_at, &later.run_at);
    assert!(
        (7190..=7210).contains(&wait),
        "the failure's two hours: {wait} s"
    );
    let capped = status(ids[3]).await;
    let wait = seconds_between(&capped.updated_at, &capped.run_at);
    assert!(
        (604_790..=604_810).contains(&wait),
        "capped at a week: {wait} s"
    );
    let slow = status(ids[2]).await;
    assert_eq!(
        slow.status,
        JobState::Succeeded,
        "the kind's 5 s, not 100 ms"
    );
    let hasty = status(hasty).await;
    assert_eq!(hasty.status, JobState::Failed);
    assert_eq!(hasty.failure.unwrap().code, "execution_timeout");
}

/// A kind with failure codes of its own.
#[derive(Debug, Serialize, Deserialize)]
struct Bounce {
    /// The code the handler fails with.
    code: String,
}

impl Job for Bounce {
    const KIND: &'static str = "test.bounce";
    // `handler_panicked` is the crate's, so it is no kind code even when declared.
    const CODES: &'static [&'static str] = &["address_bounced", "handler_panicked"];
}

/// Fails every [`Bounce`] job permanently with its code.
struct Bouncer;

impl Perform for Bouncer {
    type Job = Bounce;
    type Effects = ();

    async fn compute(&self, job: Bounce, _ctx: &JobContext) -> Result<(), JobError> {
        let code = match job.code.as_str() {
            "address_bounced" => "address_bounced",
            "handler_panicked" => "handler_panicked",
            _ => "never_declared",
        };
        Err(JobError::failed(code))
    }
}

#[tokio::test]
async fn a_permanent_failure_ends_with_the_code_its_kind_declares_and_no_other() {
    let (db, client, jobs) = domain().await;
    let mut ids = Vec::new();
    for code in ["address_bounced", "never_declared", "handler_panicked"] {
        let job = Bounce { code: code.into() };
        let queued = jobs.enqueue(&client, &job, EnqueueOptions::default());
        ids.push(queued.await.unwrap().id);
    }
    let config = WorkerConfig {
        owner_id: "bounces".into(),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(Bouncer);
    let worker = Worker::start(pool(&db).await, &db.config, config, registry)
        .await
        .unwrap();
    let stats = worker.stats_handle();
    let replica = worker.spawn();
    let probe = db.client().await;
    eventually("every bounce to end", || async {
        count(&probe, "etl_job_outcomes").await == 3
    })
    .await;
    replica.stop().await.unwrap();
    let mut codes = Vec::new();
    for id in ids {
        let status = jobs.status(&client, id).await.unwrap().unwrap();
        assert_eq!((status.status, status.attempts), (JobState::Failed, 1));
        codes.push(status.failure.unwrap().code);
    }
    assert_eq!(
        codes,
        ["address_bounced", "handler_failed", "handler_failed"]
    );
    // Metrics keep to the crate's list: the kind's code counts as `handler_failed`.
    let by_code: std::collections::HashMap<_, _> = stats.failed_by_code().collect();
    assert_eq!(by_code.get("handler_failed"), Some(&3));
    assert_eq!(by_code.get("handler_panicked"), Some(&0));
}

/// A kind named as a Rust type is, not as the schema stores kinds.
#[derive(Debug, Serialize, Deserialize)]
struct Camel {}

impl Job for Camel {
    const KIND: &'static str = "WelcomeEmail";
}

/// Would run [`Camel`] jobs.
struct CamelRunner;

impl Perform for CamelRunner {
    type Job = Camel;
    type Effects = ();

    async fn compute(&self, _job: Camel, _ctx: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_kind_whose_name_the_schema_cannot_store_is_refused_before_any_write() {
    let (db, client, jobs) = domain().await;
    match jobs
        .enqueue(&client, &Camel {}, EnqueueOptions::default())
        .await
    {
        Err(Error::Config(durable_etl::ConfigError::KindName)) => {}
        other => panic!("the kind's name was not refused: {other:?}"),
    }
    assert_eq!(count(&client, "etl_job_intake").await, 0);
    let registry = Registry::new().perform(CamelRunner);
    let started = Worker::start(
        pool(&db).await,
        &db.config,
        WorkerConfig::default(),
        registry,
    );
    assert!(matches!(
        started.await,
        Err(Error::Config(durable_etl::ConfigError::KindName))
    ));
}

/// A kind whose attempt bound cannot be stored: no attempt at all.
#[derive(Debug, Serialize, Deserialize)]
struct Unattempted {}

impl Job for Unattempted {
    const KIND: &'static str = "test.unattempted";
    const MAX_ATTEMPTS: i32 = 0;
}

#[tokio::test]
async fn an_attempt_bound_outside_1_to_100_is_refused_before_any_write() {
    let (_db, client, jobs) = domain().await;
    for max_attempts in [0, -1, 101, 1000] {
        let options = EnqueueOptions {
            max_attempts: Some(max_attempts),
            ..EnqueueOptions::default()
        };
        match jobs.enqueue(&client, &welcome(1), options).await {
            Err(e @ Error::Config(durable_etl::ConfigError::MaxAttempts)) => {
                assert_eq!(e.code(), Code::ConfigInvalid);
            }
            other => panic!("max_attempts {max_attempts} was not refused: {other:?}"),
        }
    }
    let kinds_own = jobs
        .enqueue(&client, &Unattempted {}, EnqueueOptions::default())
        .await;
    assert!(
        matches!(
            kinds_own,
            Err(Error::Config(durable_etl::ConfigError::MaxAttempts))
        ),
        "{kinds_own:?}"
    );
    assert_eq!(count(&client, "etl_job_intake").await, 0);
    for max_attempts in [1, 100] {
        let options = EnqueueOptions {
            max_attempts: Some(max_attempts),
            ..EnqueueOptions::default()
        };
        let id = jobs
            .enqueue(&client, &welcome(1), options)
            .await
            .unwrap()
            .id;
        let status = jobs.status(&client, id).await.unwrap().unwrap();
        assert_eq!(status.max_attempts, max_attempts);
    }
}

/// A typed kind whose effects stamp a domain row per committed attempt.
#[derive(Debug, Serialize, Deserialize)]
struct Stamp {}

impl Job for Stamp {
    const KIND: &'static str = "test.stamp";
}

/// Inserts the attempt's stamp (job, attempt, claim) into the domain table `stamps`, inside the
/// fence.
struct Stamped;

impl Apply for Stamped {
    async fn apply(self, tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        tx.execute(
            "INSERT INTO stamps (job_id, attempt, claim_id) VALUES ($1, $2, $3)",
            &[&job.id, &job.attempt, &job.lease_claim_id],
        )
        .await?;
        Ok(())
    }
}

/// Stamps [`Stamp`] jobs; each compute phase shows its claim id in `claim`, then waits for a
/// permit of `gate` (a replica stalled inside its handler, for as long as the test wants).
struct GatedStamper {
    /// The claim id of the last compute phase entered.
    claim: Arc<std::sync::Mutex<Option<Uuid>>>,
    /// Holds every compute phase until the test adds a permit.
    gate: Arc<Semaphore>,
}

impl Perform for GatedStamper {
    type Job = Stamp;
    type Effects = Stamped;

    async fn compute(&self, _job: Stamp, ctx: &JobContext) -> Result<Stamped, JobError> {
        *self.claim.lock().unwrap() = Some(ctx.lease_claim_id);
        let permit = self.gate.acquire().await.map_err(JobError::transient)?;
        permit.forget();
        Ok(Stamped)
    }
}

/// A replica that runs [`GatedStamper`], stepping once on a task of its own, with its job inside
/// its compute phase.
struct GatedReplica {
    /// What its recovery pass, just before its step, took back.
    recovered: Recovered,
    /// The claim its job's compute phase runs under.
    claim: Uuid,
    /// Holds its job's compute phase until the test adds a permit.
    gate: Arc<Semaphore>,
    /// The step: what became of each job it claimed.
    step: tokio::task::JoinHandle<Vec<(Uuid, Transition)>>,
}

/// Starts a [`GatedReplica`] as `owner` on `db`: one recovery pass, then one step, which claims
/// what is due; returns once the one job it claimed is inside its compute phase.
async fn gated_replica(db: &TestDb, owner: &str) -> GatedReplica {
    let (claim, gate) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let stamper = GatedStamper {
        claim: Arc::clone(&claim),
        gate: Arc::clone(&gate),
    };
    let config = WorkerConfig {
        owner_id: owner.into(),
        ..WorkerConfig::default()
    };
    let registry = Registry::new().perform(stamper);
    let worker = Worker::start(pool(db).await, &db.config, config, registry)
        .await
        .unwrap();
    let recovered = worker.recover().await.unwrap();
    let step = tokio::spawn(async move { worker.step().await.unwrap() });
    eventually("the replica's job to be inside its compute phase", || {
        let entered = claim.lock().unwrap().is_some();
        async move { entered }
    })
    .await;
    let claim = claim.lock().unwrap().unwrap();
    GatedReplica {
        recovered,
        claim,
        gate,
        step,
    }
}

// A stale claim of a typed kind reaches its commit while the claim that replaced it is live:
// the fence (`lease_claim_id` + `status`, checked when the rows are locked, before any effect
// is written) is all that stops it. Seen failing without it: with the claim check taken out of
// `LOCK_FENCED_SQL` (the rows locked by id and status alone), A's effects committed (a stamp of
// attempt 1, "no effect of A's" failed) even though its success statement, fenced on its own,
// wrote nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_claim_of_a_typed_kind_never_commits_its_effects_or_its_outcome() {
    let (db, client, jobs) = domain().await;
    client
        .batch_execute("CREATE TABLE stamps (job_id uuid, attempt int4, claim_id uuid)")
        .await
        .unwrap();
    let id = jobs
        .enqueue(&client, &Stamp {}, EnqueueOptions::default())
        .await
        .unwrap()
        .id;
    // Replica A claims the job and stalls inside its compute phase; its lease is aged past
    // expiry in SQL (no sleeping), so that B's recovery and claim take the job over.
    let a = gated_replica(&db, "replica-a").await;
    let aged = "UPDATE etl_job_records SET lease_expires_at = now() - interval '2 hours'
                 WHERE id = $1 AND lease_claim_id = $2 AND status = 'running'";
    assert_eq!(client.execute(aged, &[&id, &a.claim]).await.unwrap(), 1);
    let b = gated_replica(&db, "replica-b").await;
    assert_eq!((b.recovered.expired, b.recovered.exhausted), (1, 0));
    assert_ne!(b.claim, a.claim, "B's claim is a new one");

    // A's compute ends, and its typed effects try to commit under the stale claim: lost.
    a.gate.add_permits(1);
    assert_eq!(a.step.await.unwrap(), vec![(id, Transition::LeaseLost)]);
    assert_eq!(count(&client, "stamps").await, 0, "no effect of A's");
    assert_eq!(
        count(&client, "etl_job_outcomes").await,
        0,
        "no outcome of A's"
    );
    let running = count(
        &client,
        "etl_job_records WHERE status = 'running' AND attempts = 2",
    );
    assert_eq!(running.await, 1, "the job is still B's to finish");

    // B's commit goes through: its effects, once, under its own claim.
    b.gate.add_permits(1);
    assert_eq!(b.step.await.unwrap(), vec![(id, Transition::Succeeded)]);
    let stamps = client
        .query("SELECT job_id, attempt, claim_id FROM stamps", &[])
        .await
        .unwrap();
    let stamps: Vec<(Uuid, i32, Uuid)> = stamps
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(stamps, vec![(id, 2, b.claim)], "B's effects, exactly once");
    let outcome = client
        .query_one(
            "SELECT status, attempts, lease_claim_id FROM etl_job_outcomes WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            outcome.get::<_, String>(0).as_str(),
            outcome.get::<_, i32>(1)
        ),
        ("succeeded", 2)
    );
    assert_eq!(outcome.get::<_, Uuid>(2), b.claim, "the outcome is B's");
    let status = jobs.status(&client, id).await.unwrap().unwrap();
    assert_eq!((status.status, status.attempts), (JobState::Succeeded, 2));
}
