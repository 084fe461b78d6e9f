//! The backlog sample: once a minute, the fleet's active jobs by state (due, deferred or waiting
//! to retry, running), in all and for the deepest queues, in `etl_backlog_minutes` (migration
//! 0038), for the operator view's backlog chart. The reporter sends it after its first report of
//! each minute; the first replica to send it in a minute counts, the others' statements find the
//! minute's row and skip the count.
//!
//! Invariants this module keeps:
//! - A row holds aggregates only: counts by state, in all and by queue name; never a job id, an
//!   owner or a payload. At most [`QUEUES_KEPT`] queues are named in it; its totals count them all.
//! - One row per minute (the table's key): a statement that finds the minute's row (a one-time
//!   filter, checked before the count) counts nothing. Two sent in the same instant may both
//!   count; the first to commit keeps its row, the other's is dropped (`ON CONFLICT DO NOTHING`).
//! - The count reads the live table only (active jobs), bounded like the operator view's own
//!   backlog sample; rows older than two hours are deleted by the reports (`reporter`).

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// The most queues a backlog row names (the deepest, then by name).
pub(crate) const QUEUES_KEPT: i64 = 20;

/// Writes the backlog of the current minute unless its row exists: the active jobs due, deferred
/// (or waiting to retry) and running, in all and for the `$1` deepest queues (`by_queue`:
/// `{"queue": [due, deferred, running]}`).
///
/// The `HAVING NOT EXISTS` is planned as a one-time filter above the count: when the minute's
/// row exists, the live table is not read. The aggregate without `GROUP BY` returns one row
/// even when no job is active, so an idle minute is written as zeros, not left unknown.
///
/// Locks: none on the live table (a read); the new row's key, or, if another replica's
/// uncommitted row of the minute holds it, a wait for its commit, then nothing.
pub(crate) const BACKLOG_SQL: &str = "
INSERT INTO etl_backlog_minutes (minute, due, deferred, running, by_queue)
SELECT date_trunc('minute', now()), coalesce(sum(due), 0), coalesce(sum(deferred), 0),
       coalesce(sum(running), 0),
       coalesce(jsonb_object_agg(queue, jsonb_build_array(due, deferred, running))
                    FILTER (WHERE depth <= $1), '{}')
  FROM (SELECT queue, due, deferred, running,
               row_number() OVER (ORDER BY due + deferred + running DESC, queue) AS depth
          FROM (SELECT queue,
                       count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS due,
                       count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS deferred,
                       count(*) FILTER (WHERE status = 'running') AS running
                  FROM etl_job_records
                 GROUP BY queue) AS counts) AS ranked
HAVING NOT EXISTS (SELECT FROM etl_backlog_minutes WHERE minute = date_trunc('minute', now()))
    ON CONFLICT (minute) DO NOTHING";

/// Writes the current minute's backlog row unless it exists; returns whether this call wrote it.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn sample(client: &impl GenericClient) -> Result<bool, tokio_postgres::Error> {
    let written = client
        .execute_typed(BACKLOG_SQL, &[(&QUEUES_KEPT, Type::INT8)])
        .await?;
    Ok(written == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_db::TestDb;

    /// Inserts `n` jobs of `queue`, `status` (`pending` due, `deferred`: pending in an hour, or
    /// `running`).
    async fn jobs(client: &tokio_postgres::Client, queue: &str, status: &str, n: i64) {
        let (status, run_at) = match status {
            "deferred" => ("pending", "now() + interval '1 hour'"),
            other => (other, "now() - interval '1 second'"),
        };
        let running = status == "running";
        client
            .execute(
                &format!(
                    "INSERT INTO etl_job_records
                         (id, owner_key, kind, request_payload, status, run_at, sort_at, queue,
                          lease_owner_id, lease_claim_id, lease_expires_at, lease_renewed_at,
                          started_at, attempts)
                     SELECT gen_random_uuid(), decode(repeat('07', 32), 'hex'), 'etl', '{{}}',
                            $1::text, {run_at}, {run_at}, $2::text,
                            CASE WHEN $3 THEN 'owner' END,
                            CASE WHEN $3 THEN gen_random_uuid() END,
                            CASE WHEN $3 THEN now() + interval '1 minute' END,
                            CASE WHEN $3 THEN now() END, CASE WHEN $3 THEN now() END,
                            CASE WHEN $3 THEN 1 ELSE 0 END
                       FROM generate_series(1, $4::bigint)"
                ),
                &[&status, &queue, &running, &n],
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn racing_replicas_write_the_minute_once_and_the_others_skip_the_count() {
        let db = TestDb::migrated().await;
        let client = db.client().await;
        jobs(&client, "mail", "pending", 3).await;
        jobs(&client, "mail", "deferred", 2).await;
        jobs(&client, "etl", "running", 1).await;
        for i in 0..25 {
            jobs(&client, &format!("q{i:02}"), "deferred", 1).await;
        }
        // Four replicas, each on its own session, in the same instant.
        let mut sessions = Vec::new();
        for _ in 0..4 {
            sessions.push(db.client().await);
        }
        let written = futures::future::join_all(sessions.iter().map(sample)).await;
        let written: Vec<bool> = written.into_iter().map(|w| w.unwrap()).collect();
        assert_eq!(written.iter().filter(|w| **w).count(), 1, "{written:?}");
        let rows = client
            .query(
                "SELECT due, deferred, running, by_queue FROM etl_backlog_minutes",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        let (due, deferred, running): (i64, i64, i64) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        assert_eq!((due, deferred, running), (3, 27, 1), "every queue counts");
        let by_queue: serde_json::Value = rows[0].get(3);
        let by_queue = by_queue.as_object().unwrap();
        assert_eq!(
            by_queue.len(),
            QUEUES_KEPT as usize,
            "the deepest queues only"
        );
        assert_eq!(by_queue["mail"], serde_json::json!([3, 2, 0]));
        assert_eq!(by_queue["etl"], serde_json::json!([0, 0, 1]));
        assert!(by_queue.contains_key("q00") && !by_queue.contains_key("q24"));

        // Once the minute's row exists, the live table is not read.
        let plan = client
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, COSTS OFF) {}",
                    BACKLOG_SQL.replace("$1", "20")
                ),
                &[],
            )
            .await
            .unwrap();
        let plan: Vec<String> = plan.iter().map(|r| r.get(0)).collect();
        let plan = plan.join("\n");
        assert!(plan.contains("One-Time Filter"), "{plan}");
        let scan = plan
            .lines()
            .find(|l| l.contains("on etl_job_records"))
            .unwrap_or_default();
        assert!(scan.contains("never executed"), "{plan}");
    }

    #[tokio::test]
    async fn an_idle_minute_is_written_as_zeros() {
        let db = TestDb::migrated().await;
        let client = db.client().await;
        assert!(sample(&client).await.unwrap());
        assert!(!sample(&client).await.unwrap(), "once a minute");
        let row = client
            .query_one(
                "SELECT due + deferred + running, by_queue = '{}' FROM etl_backlog_minutes",
                &[],
            )
            .await
            .unwrap();
        assert_eq!((row.get::<_, i64>(0), row.get::<_, bool>(1)), (0, true));
    }
}
