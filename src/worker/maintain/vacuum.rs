//! The vacuum: the role that keeps the live table's dead row versions few, so a claim never walks
//! through a growing run of dead index entries between two autovacuum visits.
//!
//! Why: every job leaves two dead versions of its live row (the claim's update, the success's
//! delete). A claim walks `etl_job_records_claim_idx` from the start of its queue; the entries of
//! claimed and ended jobs stay in that index until a VACUUM removes them (a scan marks them dead,
//! but every later scan still steps over them), and the heap grows while its free space is not
//! recorded. Autovacuum visits a database once per `autovacuum_naptime` (a minute by default):
//! under a sustained load, throughput fell about sevenfold within a minute and came back after
//! each visit (docs/benchmarks.md, "Sustained load and dead rows").
//!
//! Invariants this module keeps:
//! - A replica that claimed no job since its last look sends nothing. One that did asks, at most
//!   once per [`VACUUM_CHECK`], how many dead versions the live table holds
//!   ([`pg_stat_get_dead_tuples`](DUE_SQL): the statistics, no scan), and at
//!   [`VACUUM_DEAD_ROWS`] plus a fifth of its live rows runs [`vacuum_sql`].
//! - On a Citus node, where the cell's sessions reach the live table through a view, the
//!   statistics read and the table vacuumed are the shard's the view reads.
//! - VACUUM removes only versions no snapshot can see: no row reads differently after it, so it
//!   cannot lose, duplicate or wake a job, or change a lease.
//! - It never waits for a lock: `SKIP_LOCKED` skips the table while another replica's VACUUM
//!   or autovacuum holds it (they take the same lock), and `TRUNCATE false` never takes the
//!   exclusive lock that shrinking the file needs, which would hold claims and enqueues up (the
//!   space is reused instead; migration 0040 keeps autovacuum from shrinking it too, and says
//!   how to give the space back at a quiet time).
//! - Its statements are bounded like every other; a failure is logged by its code and the next
//!   look tries again. A role that does not own the table is refused by the server with a
//!   warning and nothing done: autovacuum alone then looks after the table.

use crate::db;
use crate::db::citus::live_table_oid;
use crate::worker::shared::Shared;
use crate::worker::timing::{jittered, ticker};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// How often a replica that claimed jobs looks at the live table's dead versions.
pub const VACUUM_CHECK: Duration = Duration::from_secs(1);

/// The dead versions above a fifth of the live rows at which a replica vacuums the live table:
/// about 25,000 jobs' worth, a second or two of a busy fleet.
pub const VACUUM_DEAD_ROWS: i64 = 50_000;

/// The live table (`db::citus::live_table_oid!`), named as `VACUUM` takes it, and whether it holds at
/// least `$1` dead versions plus a fifth of its live rows, by the server's statistics (flushed by
/// each backend at most once a second).
///
/// Locks: none (reads the catalog and the statistics, not the table).
pub const DUE_SQL: &str = concat!(
    "SELECT t.oid::regclass::text,
            pg_stat_get_dead_tuples(t.oid) >= $1 + pg_stat_get_live_tuples(t.oid) / 5
       FROM (SELECT ",
    live_table_oid!(),
    " AS oid) t
      WHERE t.oid IS NOT NULL"
);

/// Vacuums the live table `table` (as [`DUE_SQL`] names it) unless another VACUUM holds it,
/// without shrinking its file.
///
/// Locks: `ShareUpdateExclusiveLock` on the table, taken only if free (`SKIP_LOCKED`); it
/// conflicts with no claim, enqueue, completion or cancel, only with another VACUUM, ANALYZE or
/// schema change.
pub fn vacuum_sql(table: &str) -> String {
    format!("VACUUM (SKIP_LOCKED, TRUNCATE false) {table}")
}

/// The live table, named as `VACUUM` takes it, if it is due for a vacuum ([`DUE_SQL`] at
/// [`VACUUM_DEAD_ROWS`]).
///
/// # Errors
/// The database error of the statement.
pub async fn due(client: &impl GenericClient) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client
        .query_typed_opt(DUE_SQL, &[(&VACUUM_DEAD_ROWS, Type::INT8)])
        .await?;
    Ok(row.filter(|r| r.get(1)).map(|r| r.get(0)))
}

/// Vacuums the live table `table` ([`vacuum_sql`]; its name as [`DUE_SQL`] gives it: a
/// `regclass`'s text, quoted where it must be).
///
/// # Errors
/// The database error of the statement.
pub async fn vacuum(client: &impl GenericClient, table: &str) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(&vacuum_sql(table)).await
}

/// Whether a replica that had claimed `then` jobs at its last look and `now` jobs at this one
/// has churned the live table since.
fn churned(then: u64, now: u64) -> bool {
    now > then
}

/// The vacuum role: every [`VACUUM_CHECK`] (jittered once, so replicas look at different
/// moments), a look if the replica claimed jobs since the last, until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = ticker(jittered(VACUUM_CHECK));
    let mut seen = shared.stats.snapshot().claimed;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {
                let claimed = shared.stats.snapshot().claimed;
                if churned(seen, claimed) {
                    seen = claimed;
                    if let Err(e) = look(&shared).await {
                        tracing::warn!(code = %e.code(), "vacuum of the live table failed");
                    }
                }
            }
        }
    }
}

/// One look: asks whether the live table is due, and vacuums it if so.
pub(crate) async fn look(shared: &Shared) -> Result<bool, crate::Error> {
    let conn = db::checkout(&shared.pool).await?;
    shared.stats.record_round_trips(1);
    let Some(table) = db::bounded(shared.statement_bound, due(&*conn)).await? else {
        return Ok(false);
    };
    shared.stats.record_round_trips(1);
    db::bounded(shared.statement_bound, vacuum(&*conn, &table)).await?;
    tracing::debug!("vacuumed the live table");
    Ok(true)
}

#[cfg(test)]
#[path = "vacuum_tests.rs"]
mod tests;
