//! A job whose effects enqueue a follow-up job on the fenced transaction, with one `?`: the
//! follow-up commits with the job's success or not at all, and a refused enqueue fails the job
//! with a stable code.

use crate::support::{count, eventually, pool, TestDb};
use durable_etl::{
    shutdown, Apply, EnqueueOptions, Job, JobContext, JobError, JobState, Jobs, Perform, Registry,
    Secret, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio_postgres::Transaction;

/// A sign-up: its effects store the user and enqueue their welcome.
#[derive(Debug, Serialize, Deserialize)]
struct SignUp {
    /// The user.
    user_id: i64,
    /// The welcome's priority (out of range for the sign-up whose follow-up must be refused).
    welcome_priority: i16,
}

impl Job for SignUp {
    const KIND: &'static str = "test.sign_up";
}

/// The follow-up: welcome a user.
#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    /// The user.
    user_id: i64,
}

impl Job for Welcome {
    const KIND: &'static str = "test.follow_up_welcome";
}

/// The sign-up's effects: the user's row and the welcome job, on the fenced transaction.
struct Registered {
    /// The job handle the follow-up is enqueued with.
    jobs: Jobs,
    /// The sign-up.
    job: SignUp,
}

impl Apply for Registered {
    async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        tx.execute("INSERT INTO users (id) VALUES ($1)", &[&self.job.user_id])
            .await?;
        let welcome = Welcome {
            user_id: self.job.user_id,
        };
        let options = EnqueueOptions {
            priority: Some(self.job.welcome_priority),
            ..EnqueueOptions::default()
        };
        // The crate's `Error` converts into `JobError`: one `?`, no `map_err`.
        self.jobs.enqueue(tx, &welcome, options).await?;
        Ok(())
    }
}

/// Runs sign-ups, handing each the job handle for its follow-up.
struct SignUps {
    /// The job handle.
    jobs: Jobs,
}

impl Perform for SignUps {
    type Job = SignUp;
    type Effects = Registered;

    async fn compute(&self, job: SignUp, _ctx: &JobContext) -> Result<Registered, JobError> {
        let jobs = self.jobs.clone();
        Ok(Registered { jobs, job })
    }
}

/// Runs welcomes: records each in `welcomed`.
struct Welcomes;

impl Perform for Welcomes {
    type Job = Welcome;
    type Effects = Welcomed;

    async fn compute(&self, job: Welcome, _ctx: &JobContext) -> Result<Welcomed, JobError> {
        Ok(Welcomed(job.user_id))
    }
}

/// A welcome's effect: its row in `welcomed`.
struct Welcomed(i64);

impl Apply for Welcomed {
    async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        tx.execute("INSERT INTO welcomed (user_id) VALUES ($1)", &[&self.0])
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn effects_enqueue_a_follow_up_job_with_one_question_mark() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id int8 PRIMARY KEY);
             CREATE TABLE welcomed (user_id int8 NOT NULL)",
        )
        .await
        .unwrap();
    let secret = Secret::new(b"follow-up-secret-0123456789".to_vec()).unwrap();
    let jobs = Jobs::new(secret, "tenant-1");
    let signed_up = jobs
        .enqueue(
            &client,
            &SignUp {
                user_id: 1,
                welcome_priority: 0,
            },
            EnqueueOptions::default(),
        )
        .await
        .unwrap()
        .id;
    let refused = jobs
        .enqueue(
            &client,
            &SignUp {
                user_id: 2,
                welcome_priority: 10,
            },
            EnqueueOptions::default(),
        )
        .await
        .unwrap()
        .id;
    let config = WorkerConfig {
        owner_id: "follow-ups".into(),
        poll_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let registry = Registry::new()
        .perform(SignUps { jobs: jobs.clone() })
        .perform(Welcomes);
    let worker = Worker::start(pool(&db).await, &db.config, config, registry)
        .await
        .unwrap();
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(worker.run(until));
    eventually("the sign-ups and the follow-up to end", || async {
        count(&client, "etl_job_records").await == 0 && count(&client, "etl_job_intake").await == 3
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();

    let status = jobs.status(&client, signed_up).await.unwrap().unwrap();
    assert_eq!(status.status, JobState::Succeeded);
    let welcomed: Vec<i64> =
        crate::support::first_column(&client, "SELECT user_id FROM welcomed").await;
    assert_eq!(
        welcomed,
        [1],
        "the follow-up ran once, for the user who signed up"
    );
    // The refused follow-up failed its sign-up with a stable code, and rolled its user back.
    let status = jobs.status(&client, refused).await.unwrap().unwrap();
    assert_eq!(status.status, JobState::Failed);
    assert_eq!(status.failure.unwrap().code, "handler_failed");
    let users: Vec<i64> = crate::support::first_column(&client, "SELECT id FROM users").await;
    assert_eq!(users, [1]);
}
