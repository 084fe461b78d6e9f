//! An application whose own writes go through sqlx: a sign-up stores the user and enqueues the
//! welcome job in one sqlx transaction (both commit, or neither), a replica runs the job, and a
//! second sign-up that rolls back leaves no job behind. Build with `--features sqlx`.
//! `DATABASE_URL` names an existing database; `DURABLE_ETL_SECRET` (16+ bytes) keys the digests.
use durable_etl::{DatabaseConfig, Job, JobContext, JobError, Jobs, Perform, Registry, Secret};
use sqlx::Connection;

/// The job: its value is the payload.
#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    /// Whom to greet.
    user_id: i64,
}
impl Job for Welcome {
    const KIND: &'static str = "sqlx_app.welcome";
}

/// The handler: runs with no connection held, and writes nothing.
struct SendWelcome;
impl Perform for SendWelcome {
    type Job = Welcome;
    type Effects = ();
    async fn compute(&self, job: Welcome, _ctx: &JobContext) -> Result<(), JobError> {
        println!("welcome, user {}", job.user_id);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let db = DatabaseConfig::new(url.clone());
    durable_etl::migrate(&db).await?;
    let jobs = Jobs::new(Secret::from_env()?, "sqlx-app");

    // The application's own connection and schema, through sqlx.
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS sqlx_app_users (id int8 PRIMARY KEY)")
        .execute(&mut conn)
        .await?;

    // A sign-up: the user and the welcome commit together.
    let mut tx = conn.begin().await?;
    sqlx::query("INSERT INTO sqlx_app_users (id) VALUES (1)")
        .execute(&mut *tx)
        .await?;
    let job = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 1 }, Default::default())
        .await?;
    tx.commit().await?;

    // A sign-up that fails after the enqueue: rolling back removes its job too.
    let mut tx = conn.begin().await?;
    let rolled_back = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 2 }, Default::default())
        .await?;
    tx.rollback().await?;

    // A replica runs the committed job.
    let pool = durable_etl::connect_pool(&db, "sqlx-app").await?;
    let registry = Registry::new().perform(SendWelcome);
    let worker = durable_etl::Worker::start(pool.clone(), &db, Default::default(), registry);
    let replica = worker.await?.spawn();
    let client = pool.get().await?;
    let mut status = jobs.status(&*client, job.id).await?.ok_or("no such job")?;
    while status.is_active() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        status = jobs.status(&*client, job.id).await?.ok_or("no such job")?;
    }
    replica.stop().await?;
    assert_eq!(status.status, durable_etl::JobState::Succeeded);
    assert!(jobs.status(&*client, rolled_back.id).await?.is_none());
    println!("the committed job succeeded; the rolled-back one never existed");
    Ok(())
}
