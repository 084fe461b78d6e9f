//! What the server's own statistics say of a run: the updates of live rows, read once the
//! replicas' backends have reported theirs.
//!
//! Invariants this module keeps:
//! - A read waits (at most two seconds) for the replicas' backends to exit, since a backend's
//!   counts reach `pg_stat_user_tables` only as it exits; the bench's own connections
//!   (`durable-etl/bench`) are not waited for.

use durable_etl::error::Error;

/// Statement that counts the backends of this database other than the bench's own and its
/// caller's: the replicas' sessions, whose statistics reach `pg_stat_user_tables` only as their
/// backends exit (after the replica processes have).
const OTHER_BACKENDS_SQL: &str = "
SELECT count(*)::int8 FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND application_name LIKE 'durable-etl/%' AND application_name <> 'durable-etl/bench'";

/// Updates of live rows so far (`pg_stat_user_tables.n_tup_upd` of `etl_job_records`), read once
/// the replicas' backends have exited (up to two seconds after the call) so that theirs count.
///
/// # Errors
/// Database errors.
pub(crate) async fn live_row_updates(client: &tokio_postgres::Client) -> Result<u64, Error> {
    for _ in 0..200 {
        let others: i64 = client.query_one(OTHER_BACKENDS_SQL, &[]).await?.get(0);
        if others == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await?;
    let updates: i64 = client
        .query_one(
            "SELECT coalesce(sum(n_tup_upd), 0)::int8 FROM pg_stat_user_tables
              WHERE relname = 'etl_job_records'",
            &[],
        )
        .await?
        .get(0);
    Ok(u64::try_from(updates).unwrap_or(0))
}
