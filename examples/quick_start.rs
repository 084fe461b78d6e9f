//! The quick start: a job kind of your own, enqueued with a domain write in one transaction, run
//! by a worker. `DATABASE_URL` names an existing database; `DURABLE_ETL_SECRET` (16+ bytes) keys
//! the digests of owners and idempotency keys.
use durable_etl::{DatabaseConfig, Job, JobContext, JobError, Jobs, Perform, Registry, Secret};

/// The job: its value is the payload.
#[derive(serde::Serialize, serde::Deserialize)]
struct WelcomeEmail {
    /// Whom to greet.
    user_id: i64,
}
impl Job for WelcomeEmail {
    const KIND: &'static str = "welcome_email";
}

/// The handler: runs with no connection held. Its effects (`()`: none) would be written in the
/// fenced transaction that records the job's success; see `Apply`.
struct SendWelcome;
impl Perform for SendWelcome {
    type Job = WelcomeEmail;
    type Effects = ();
    async fn compute(&self, job: WelcomeEmail, ctx: &JobContext) -> Result<(), JobError> {
        println!("welcome, user {} (attempt {})", job.user_id, ctx.attempt);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = DatabaseConfig::new(std::env::var("DATABASE_URL")?);
    durable_etl::migrate(&db).await?;
    let pool = durable_etl::connect_pool(&db, "app").await?;
    let jobs = Jobs::new(Secret::from_env()?, "my-app");

    // The domain write and the job commit together, or neither does.
    let mut conn = pool.get().await?;
    conn.batch_execute("CREATE TABLE users (id int8)").await?;
    let tx = conn.transaction().await?;
    tx.execute("INSERT INTO users VALUES (1)", &[]).await?;
    let welcome = WelcomeEmail { user_id: 1 };
    let job = jobs.enqueue(&tx, &welcome, Default::default()).await?;
    tx.commit().await?;

    let registry = Registry::new().perform(SendWelcome);
    let worker = durable_etl::Worker::start(pool.clone(), &db, Default::default(), registry);
    let replica = worker.await?.spawn();
    let mut status = jobs.status(&*conn, job.id).await?.ok_or("no such job")?;
    while status.is_active() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        status = jobs.status(&*conn, job.id).await?.ok_or("no such job")?;
    }
    replica.stop().await?;
    assert_eq!(status.status, durable_etl::JobState::Succeeded);
    Ok(())
}
