//! Database errors map to the right kind and code, provoked on a real server.

use crate::support::{insert_job, TestDb};
use durable_etl::codes::Code;
use durable_etl::error::{is_transient, Error};

#[tokio::test]
async fn a_constraint_violation_is_a_permanent_database_error() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let e = client
        .execute("INSERT INTO etl_api_clients (id, owner_key, key_digest) VALUES (gen_random_uuid(), 'x', 'y')", &[])
        .await
        .unwrap_err();
    assert!(!is_transient(&e));
    let err = Error::from(e);
    assert!(matches!(err, Error::Database(_)));
    assert_eq!(err.code(), Code::DatabaseError);
    assert_eq!(err.exit_code(), 1);
    assert_eq!(
        err.db_code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
    assert_eq!(
        err.to_string(),
        "database error",
        "no database text in Display"
    );
}

#[tokio::test]
async fn a_lock_timeout_is_transient() {
    let db = TestDb::migrated().await;
    let mut holder = db.client().await;
    let waiter = db.client().await;
    let id = insert_job(&holder, "now()").await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM etl_job_records WHERE id = $1 FOR UPDATE",
        &[&id],
    )
    .await
    .unwrap();
    waiter
        .batch_execute("SET lock_timeout = '50ms'")
        .await
        .unwrap();
    let e = waiter
        .execute(
            "UPDATE etl_job_records SET updated_at = now() WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap_err();
    assert!(is_transient(&e));
    assert_eq!(Error::from(e).code(), Code::TransientDatabase);
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn a_terminated_session_is_unavailable() {
    let db = TestDb::migrated().await;
    let victim = db.client().await;
    let killer = db.client().await;
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    killer
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // The first statement after termination may see the FATAL message or a closed socket;
    // both are a lost session.
    let e = victim.query_one("SELECT 1", &[]).await.unwrap_err();
    assert!(is_transient(&e));
    let err = Error::from(e);
    assert_eq!(err.code(), Code::DatabaseUnavailable);
    assert_eq!(err.exit_code(), 3);
}
