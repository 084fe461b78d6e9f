//! Enqueue and cancel on a sqlx connection or transaction (the `sqlx` feature), with the
//! guarantees of the tokio-postgres path: a job enqueued in a transaction commits or rolls back
//! with the caller's own writes, an idempotency key returns the same job (and refuses another
//! payload), a replacement cancels the job it replaces in the same transaction, and an owner's
//! cancel ends a pending job. Jobs and rows are checked through a tokio-postgres client.

use crate::support::{count, TestDb};
use durable_etl::codes::Code;
use durable_etl::jobs::Cancel;
use durable_etl::{EnqueueOptions, Error, Job, JobState, Jobs, Secret};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};

/// A sign-up's welcome mail.
#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    /// Who to welcome.
    user_id: i64,
}

impl Job for Welcome {
    const KIND: &'static str = "test.sqlx_welcome";
}

/// A migrated database with a `users` table, a sqlx connection to it, a tokio-postgres client
/// to check it, and a handle for one owner.
async fn setup() -> (TestDb, PgConnection, tokio_postgres::Client, Jobs) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE users (id int8 PRIMARY KEY)")
        .await
        .unwrap();
    let conn = PgConnection::connect(&db.config.url).await.unwrap();
    let secret = Secret::new(b"sqlx-enqueue-secret-0123456789".to_vec()).unwrap();
    (db, conn, client, Jobs::new(secret, "tenant-1"))
}

/// The state of job `id` as its owner sees it, if it exists.
async fn state(jobs: &Jobs, client: &tokio_postgres::Client, id: uuid::Uuid) -> Option<JobState> {
    jobs.status(client, id).await.unwrap().map(|s| s.status)
}

#[tokio::test]
async fn a_job_enqueued_in_a_sqlx_transaction_commits_or_rolls_back_with_it() {
    let (_db, mut conn, client, jobs) = setup().await;
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO users (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let rolled = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 1 }, EnqueueOptions::default())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(state(&jobs, &client, rolled.id).await, None);
    assert_eq!(count(&client, "users").await, 0);

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO users (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let options = EnqueueOptions {
        queue: Some("mail"),
        priority: Some(3),
        ..EnqueueOptions::default()
    };
    let kept = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 2 }, options)
        .await
        .unwrap();
    assert!(!kept.replayed);
    tx.commit().await.unwrap();
    assert_eq!(
        state(&jobs, &client, kept.id).await,
        Some(JobState::Pending)
    );
    assert_eq!(count(&client, "users").await, 1);
    let row = client
        .query_one(
            "SELECT queue, priority FROM etl_job_records WHERE id = $1",
            &[&kept.id],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i16>(1)),
        ("mail".to_owned(), 3)
    );
}

#[tokio::test]
async fn an_idempotency_key_on_sqlx_returns_the_same_job_and_refuses_another_payload() {
    let (_db, mut conn, client, jobs) = setup().await;
    let keyed = EnqueueOptions {
        idempotency_key: Some("welcome-7"),
        ..EnqueueOptions::default()
    };
    let first = jobs
        .enqueue_sqlx(&mut conn, &Welcome { user_id: 7 }, keyed)
        .await
        .unwrap();
    let again = jobs
        .enqueue_sqlx(&mut conn, &Welcome { user_id: 7 }, keyed)
        .await
        .unwrap();
    assert_eq!((again.id, again.replayed), (first.id, true));
    let other = jobs
        .enqueue_sqlx(&mut conn, &Welcome { user_id: 8 }, keyed)
        .await;
    assert!(
        matches!(&other, Err(e) if e.code() == Code::IdempotencyKeyReused),
        "{other:?}"
    );
    let many = jobs
        .enqueue_many_sqlx(
            &mut conn,
            [
                (&Welcome { user_id: 7 }, keyed),
                (&Welcome { user_id: 9 }, EnqueueOptions::default()),
            ],
        )
        .await
        .unwrap();
    assert_eq!((many[0].id, many[0].replayed), (first.id, true));
    assert!(!many[1].replayed);
    assert_eq!(count(&client, "etl_job_records").await, 2);
}

#[tokio::test]
async fn a_replacement_and_a_cancel_on_sqlx_end_the_jobs_they_name() {
    let (_db, mut conn, client, jobs) = setup().await;
    let old = jobs
        .enqueue_sqlx(
            &mut conn,
            &Welcome { user_id: 1 },
            EnqueueOptions::default(),
        )
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    let replacing = EnqueueOptions {
        replaces: Some(old.id),
        ..EnqueueOptions::default()
    };
    let new = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 1 }, replacing)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        state(&jobs, &client, old.id).await,
        Some(JobState::Cancelled)
    );
    let code: Option<String> = client
        .query_one(
            "SELECT failure_code FROM etl_job_outcomes WHERE job_id = $1",
            &[&old.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(code.as_deref(), Some("replaced"));
    assert_eq!(
        jobs.cancel_sqlx(&mut conn, new.id).await.unwrap(),
        Cancel::Cancelled
    );
    assert_eq!(
        state(&jobs, &client, new.id).await,
        Some(JobState::Cancelled)
    );
    assert_eq!(
        jobs.cancel_sqlx(&mut conn, new.id).await.unwrap(),
        Cancel::AlreadyEnded("cancelled".to_owned())
    );
    let other_owner = jobs.for_owner("tenant-2");
    assert_eq!(
        other_owner.cancel_sqlx(&mut conn, old.id).await.unwrap(),
        Cancel::NotFound,
        "another owner's job is not there"
    );
}

#[tokio::test]
async fn a_sqlx_error_has_a_stable_code_by_its_sqlstate_and_no_message() {
    let (_db, mut conn, mut client, jobs) = setup().await;
    // A statement in a transaction that already failed (25P02): a database error.
    let mut tx = conn.begin().await.unwrap();
    assert!(sqlx::query("SELECT 1 / 0").execute(&mut *tx).await.is_err());
    let failed = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 1 }, EnqueueOptions::default())
        .await;
    match failed {
        Err(e @ Error::Sqlx(_)) => {
            assert_eq!(e.code(), Code::DatabaseError);
            assert_eq!(e.to_string(), "database error");
        }
        other => panic!("{other:?}"),
    }
    tx.rollback().await.unwrap();
    // A lock not granted within `lock_timeout` (55P03): transient, worth trying again.
    let holder = client.transaction().await.unwrap();
    holder
        .batch_execute("LOCK TABLE etl_job_records IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '50ms'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let waited = jobs
        .enqueue_sqlx(&mut tx, &Welcome { user_id: 2 }, EnqueueOptions::default())
        .await;
    assert!(
        matches!(&waited, Err(e) if e.code() == Code::TransientDatabase),
        "{waited:?}"
    );
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
    // An owner the cell lists as moved (55M02): `owner_moved`, find its cell again.
    client
        .execute(
            "INSERT INTO etl_moved_owners (owner_key, moved_to) VALUES ($1::bytea, 'elsewhere')",
            &[&&jobs.owner_key()[..]],
        )
        .await
        .unwrap();
    let moved = jobs
        .enqueue_sqlx(
            &mut conn,
            &Welcome { user_id: 3 },
            EnqueueOptions::default(),
        )
        .await;
    assert!(
        matches!(&moved, Err(e) if e.code() == Code::OwnerMoved),
        "{moved:?}"
    );
}

#[tokio::test]
async fn a_retaining_handle_on_sqlx_seals_the_payloads_of_new_jobs_only() {
    let (_db, mut conn, client, jobs) = setup().await;
    let secret = Secret::new(b"sqlx-enqueue-secret-0123456789".to_vec()).unwrap();
    let key = durable_etl::dead_letters::PayloadKey::derive(&secret, "k1").unwrap();
    let jobs =
        jobs.retaining(durable_etl::dead_letters::Retention::new(key.clone()).kind(Welcome::KIND));
    let keyed = EnqueueOptions {
        idempotency_key: Some("welcome-canary"),
        ..EnqueueOptions::default()
    };
    let first = jobs
        .enqueue_sqlx(&mut conn, &Welcome { user_id: 4242 }, keyed)
        .await
        .unwrap();
    // An idempotent replay seals nothing again.
    jobs.enqueue_sqlx(&mut conn, &Welcome { user_id: 4242 }, keyed)
        .await
        .unwrap();
    let row = client
        .query_one(
            "SELECT job_id, key_id, sealed FROM etl_retained_payloads",
            &[],
        )
        .await
        .unwrap();
    let (job, key_id, sealed): (uuid::Uuid, String, Vec<u8>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((job, key_id.as_str()), (first.id, "k1"));
    assert!(!String::from_utf8_lossy(&sealed).contains("4242"));
    assert_eq!(
        key.open(job, "k1", &sealed),
        Some(serde_json::json!({"user_id": 4242}))
    );
}
