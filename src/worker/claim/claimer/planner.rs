//! The claim sessions' planner switches, which pin the claim's plan (see the parent module's
//! invariants): as start-up options of the claim sessions' connections, as `SET` when a session
//! opens (a pooler may drop start-up options), or as `SET LOCAL` in each claim's own transaction
//! behind a transaction-mode pooler.

use crate::config::{ConfigError, DatabaseConfig};
use crate::db;

/// The planner switches of the claim sessions, and of no other: without statistics (a new or
/// truncated queue table after a bulk insert, before autoanalyze) the planner guesses a handful
/// of pending rows and prefers a bitmap scan plus a sort of every pending row for the claim; with
/// both off it walks the pending index in order. Set on sessions that run nothing but the claim
/// and the next-due read, so they never reach a group commit or a handler's effects (where sorts
/// off made the fenced lock step walk the whole primary-key index).
///
/// The claim sessions also plan every prepared statement once, generically
/// (`plan_cache_mode=force_generic_plan`): the claim is prepared on each session and its one
/// plan checked when the session opens (`worker::claimer`), so the plan that runs is the plan
/// that was checked, and no claim pays for planning (about half a millisecond of pickup). A
/// generic plan does not know the claim's `LIMIT`, so it guesses a tenth of the pending rows
/// and, with hash and merge joins allowed, joins them to the job table by hashing all of it
/// (a sequential scan per claim: a third of the throughput of a burn-down); with both off it
/// probes the primary key once per claimed row.
///
/// And they never JIT-compile (`jit=off`): a switched-off node type still plans, at a cost of
/// ten billion, and the claim's one sort (merging its probes' locked rows, `worker::claimer`)
/// put every claim above `jit_above_cost`, so each claim compiled itself for 450 ms.
const CLAIM_PLANNER_SWITCHES: [(&str, &str); 6] = [
    ("enable_sort", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("plan_cache_mode", "force_generic_plan"),
    ("jit", "off"),
];

/// The claim's planner switches ([`CLAIM_PLANNER_SWITCHES`]) as statements: `SET` each
/// (`scope` empty, for the session) or `SET LOCAL` each (`scope` `LOCAL`, for the transaction),
/// after `before` (say, `BEGIN;`), in one simple-protocol string.
pub(super) fn claim_planner_statements(before: &str, scope: &str) -> String {
    CLAIM_PLANNER_SWITCHES
        .iter()
        .fold(before.to_owned(), |sql, (name, value)| {
            format!("{sql} SET {scope} {name} = {value};")
        })
}

/// How many claim sessions a replica keeps: its one claim loop needs one; a second covers a
/// session that is being replaced.
pub const CLAIM_POOL_SIZE: u32 = 2;

/// The tokio-postgres configuration of a replica's claim sessions (role `claimer`): the usual
/// settings plus its planner switches (sorts and bitmap scans off, one generic plan per prepared
/// statement) as start-up options. A pooler may drop those: a claim session sets them again
/// when it opens, or, behind a transaction-mode pooler, `SET LOCAL` in each claim's transaction
/// (`worker::claimer`).
///
/// # Errors
/// [`ConfigError::DatabaseUrl`] if the URL does not parse.
pub fn claim_pg_config(cfg: &DatabaseConfig) -> Result<tokio_postgres::Config, ConfigError> {
    let mut pg = db::pg_config(cfg, "claimer")?;
    let switches = CLAIM_PLANNER_SWITCHES
        .iter()
        .map(|(name, value)| format!(" -c {name}={value}"))
        .collect::<String>();
    let options = format!("{}{switches}", pg.get_options().unwrap_or_default());
    pg.options(options);
    Ok(pg)
}
