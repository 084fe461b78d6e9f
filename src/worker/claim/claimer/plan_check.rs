//! The claim's plan check, and the claim's planner switches behind a transaction-mode pooler (see
//! the parent module's invariants): a claim session's claims must walk the claim index in order,
//! with no sort below their row locks and no scan, hash or merge of the whole job table.

use super::statement::{ClaimValues, Claimant, CLAIM_PARAMS};
#[cfg(doc)]
use super::statement::{CLAIM_SQL, CLAIM_UNCAPPED_SQL};
use crate::db;
use crate::db::citus::live_table_oid;
use crate::queue::DEFAULT_QUEUE;
use crate::worker::stats::WorkerStats;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// How a claim's transaction starts behind a transaction-mode pooler: `BEGIN`, then the claim's
/// planner switches, `SET LOCAL` (gone at its `COMMIT`, so no other client of the server
/// connection ever sees them).
pub(super) fn begin_with_planner_switches() -> String {
    super::planner::claim_planner_statements("BEGIN;", "LOCAL")
}

/// The fewest pages the live table must have on disk before a failed plan check means
/// something: below it a sequential scan costs no more than the index, and PostgreSQL rightly
/// plans one for an empty or nearly empty queue (every replica started against an empty,
/// vacuumed queue failed the check). Read from the table's size on disk, which is what the
/// planner sees of a table never analyzed.
pub const JUDGED_FROM_PAGES: i64 = 8;

/// How long a session whose plan check could not be judged plans every claim before the pool
/// replaces it with one that checks again.
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);

/// Whether the live table is large enough for a failed plan check to mean something
/// ([`JUDGED_FROM_PAGES`]).
///
/// Locks: none (reads the catalog and the table's size on disk; on a Citus node, the size of the
/// shard the cell's node view reads).
pub(crate) const CAN_JUDGE_SQL: &str = concat!(
    "SELECT coalesce(pg_relation_size(",
    live_table_oid!(),
    ") / current_setting('block_size')::int8 >= $1, false)"
);

/// The JSON plan of the claim `sql` ([`CLAIM_SQL`] or [`CLAIM_UNCAPPED_SQL`]) prepared on
/// `client` (its generic plan, on a claim session).
pub(super) async fn explain_prepared(
    client: &Client,
    sql: &str,
) -> Result<serde_json::Value, tokio_postgres::Error> {
    let name: String = client
        .query_one(db::PREPARED_NAME_SQL, &[&sql])
        .await?
        .get(0);
    // The values do not matter to a generic plan; the statement is only explained.
    Ok(client
        .query_one(
            &format!(
                "EXPLAIN (FORMAT JSON) EXECUTE {name}('{{1}}', '', 1, false, 1, false, \
                 '{{{DEFAULT_QUEUE}}}', '{{a,b}}')"
            ),
            &[],
        )
        .await?
        .get(0))
}

/// The JSON plan of the claim `sql` ([`CLAIM_SQL`] or [`CLAIM_UNCAPPED_SQL`]) planned for sample
/// values on `client`, in a transaction that sets the planner switches `LOCAL` (as a claim behind
/// a transaction-mode pooler runs).
pub(super) async fn explain_planned(
    client: &Client,
    sql: &str,
) -> Result<serde_json::Value, tokio_postgres::Error> {
    let kinds = ["a", "b"];
    let claimant = Claimant {
        owner_id: "",
        owner_locked: false,
        lease: Duration::from_millis(1),
        heartbeat_interval: Duration::from_millis(1),
        alive_locked: false,
        kinds: &kinds,
    };
    let values = ClaimValues::of(claimant, &[(DEFAULT_QUEUE, 1)]);
    let typed: Vec<_> = values.params().into_iter().zip(CLAIM_PARAMS).collect();
    let explain = format!("EXPLAIN (FORMAT JSON) {sql}");
    let row = in_planner_transaction(client, true, client.query_typed_one(&explain, &typed));
    Ok(row.await?.get(0))
}

/// Runs `statement` on `client` as it is, or, when `in_transaction`, pipelined between
/// [`begin_with_planner_switches`] and `COMMIT`: all three are sent before any answer is read
/// (each is sent on its first poll, and `join` polls them in order).
pub(super) async fn in_planner_transaction<T>(
    client: &Client,
    in_transaction: bool,
    statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    if !in_transaction {
        return statement.await;
    }
    let begin = begin_with_planner_switches();
    let (begun, answer, committed) = futures::join!(
        client.batch_execute(&begin),
        statement,
        client.batch_execute("COMMIT")
    );
    begun?;
    let answer = answer?;
    committed?;
    Ok(answer)
}

/// Whether a failed plan check can be judged (the live table is large enough,
/// [`JUDGED_FROM_PAGES`]): if so the failure is logged and `stats` counts a fallback.
pub(super) async fn judged_failure(
    client: &Client,
    stats: &WorkerStats,
) -> Result<bool, tokio_postgres::Error> {
    let judged: bool = client
        .query_typed_one(CAN_JUDGE_SQL, &[(&JUDGED_FROM_PAGES, Type::INT8)])
        .await?
        .get(0);
    if judged {
        tracing::warn!("the claim's plan failed its check; planning every claim");
        stats.record_claim_plan_fallback();
    }
    Ok(judged)
}

/// Whether the plan's name `name` (a JSON string) is `object`, or `object`'s shard on a Citus
/// node (`object` followed by `_` and the shard id), which the cell's node views read.
fn names(name: &serde_json::Value, object: &str) -> bool {
    name.as_str().is_some_and(|name| {
        name.strip_prefix(object).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('_')
                    .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// Whether the JSON plan `explained` walks `etl_job_records_claim_idx` in order and does nothing
/// whose cost grows with the table: no sequential or bitmap scan of it, no hash or merge join (the
/// claimed rows are joined back through the primary key, one probe each), and no sort below a
/// row lock (each probe locks rows in the index's order; the only sort allowed is the one that
/// merges the probes' locked rows, at most count × kinds of them).
pub(super) fn walks_the_pending_index_in_order(explained: &serde_json::Value) -> bool {
    /// Every plan node under `node`, itself included, each with whether a `LockRows` node is
    /// above it.
    fn nodes<'a>(
        node: &'a serde_json::Value,
        locked: bool,
        out: &mut Vec<(&'a serde_json::Value, bool)>,
    ) {
        out.push((node, locked));
        let locks = locked || node["Node Type"] == "LockRows";
        for child in node["Plans"].as_array().into_iter().flatten() {
            nodes(child, locks, out);
        }
    }
    /// Node types that read every row they are given, however few are claimed.
    const WHOLE_INPUT: [&str; 2] = ["Hash", "Merge"];
    /// Scans that read a whole table (only the job table's size matters: `etl_queues` holds a
    /// row per configured queue, and a scan of it is the right plan while it is small).
    const WHOLE_TABLE: [&str; 2] = ["Seq Scan", "Bitmap"];
    let mut all = Vec::new();
    nodes(&explained[0]["Plan"], false, &mut all);
    let walks = all
        .iter()
        .any(|(n, _)| names(&n["Index Name"], "etl_job_records_claim_idx"));
    let grows = all.iter().any(|(n, locked)| {
        let jobs = names(&n["Relation Name"], "etl_job_records");
        n["Node Type"].as_str().is_some_and(|t| {
            WHOLE_INPUT.iter().any(|w| t.contains(w))
                || (jobs && WHOLE_TABLE.iter().any(|w| t.contains(w)))
                || (*locked && t.contains("Sort"))
        })
    });
    walks && !grows
}
