//! The claim: one statement that takes up to `n` due jobs for this replica.
//!
//! Invariants this module keeps:
//! - `n` is never more than the replica's free execution slots (the caller passes free slots).
//! - Every claimed row gets a fresh `lease_claim_id`, this replica's `lease_owner_id`, a lease on
//!   the database clock, `lease_renewed_at = now()`, `attempts + 1` and `fencing_token + 1`:
//!   attempts are counted at claim time, so a job that kills its worker every time still reaches
//!   its bound, and the fencing token grows with every claim and is never given back.
//! - The claim commits asynchronously (`synchronous_commit = off` for its own transaction only,
//!   set from its select list, so an empty claim changes nothing): a job starts one WAL flush
//!   sooner. This is safe because a claim's durability protects nothing: if a server crash loses
//!   it, the row is back to `pending` with its old claim id, and the fence refuses every write of
//!   the lost claim, effects included. Completions, retries and failures stay synchronous.
//! - The claim's plan is pinned on the claim sessions alone: the producer claims on its own small
//!   pool ([`crate::db::connect_claim_pool`]), whose sessions plan with sorts and bitmap scans
//!   off, so the claim walks the pending index in order even on a table without statistics; the
//!   replica's other sessions (group commits, handlers' effects) plan with the server's
//!   settings. (A SQL function with its own `SET` clause pinned it too, but cost about 100 µs of
//!   server CPU per job in a burn-down.)
//! - The statement is sent unnamed with typed parameters (`query_typed`): one round trip.

use crate::handler::JobContext;
use crate::worker::lease::{millis, ClaimedJob};
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// Claims up to `$1` due jobs for owner `$2` with a lease of `$3` milliseconds; `$4` says whether
/// the owner holds its owner lock (so recovery may treat the lock's absence as death).
///
/// Locks: the CTE walks `etl_job_records_pending_due_idx` in `(run_at, id)` order and takes a
/// row lock (`FOR NO KEY UPDATE`: the claim changes no key, so the `FOR KEY SHARE` locks that foreign-key
/// checks of rows referencing a job take never make a claim skip it) on each due pending row,
/// skipping (`SKIP LOCKED`) rows another claimer, canceller or recovery holds, so concurrent
/// claimers never wait for each other and never take the same row. After locking, PostgreSQL
/// re-checks the row's current version against `status = 'pending' AND run_at <= now()`, so a
/// row that another transaction changed meanwhile is left out. The UPDATE rewrites only the rows
/// the CTE locked, and stops after `$1` of them. Only `status = 'pending'` appears in the
/// predicate (no OR across states), so the partial index is always usable; expired leases are
/// returned to `pending` by recovery, not here. There is no filter on `kind` on purpose: with
/// stale statistics its selectivity estimate made the planner trade the ordered index scan for a
/// bitmap scan plus a sort of every pending row (caught by the `claim_plan` test). So every
/// replica must register every kind; a job of a kind the claiming replica does not know ends
/// `failed` with `unknown_kind`.
pub const CLAIM_SQL: &str = "
WITH due AS (
    SELECT d.id
      FROM etl_job_records d
     WHERE d.status = 'pending' AND d.run_at <= now()
     ORDER BY d.run_at, d.id
     LIMIT $1
     FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE etl_job_records AS j
   SET status = 'running',
       attempts = j.attempts + 1,
       fencing_token = j.fencing_token + 1,
       lease_claim_id = gen_random_uuid(),
       lease_owner_id = $2,
       lease_owner_locked = $4,
       lease_expires_at = now() + $3 * interval '1 millisecond',
       lease_renewed_at = now(),
       started_at = now(),
       updated_at = now()
  FROM due
 WHERE j.id = due.id
RETURNING j.id, j.kind, j.request_payload, j.attempts, j.max_attempts, j.lease_claim_id,
          j.owner_key, greatest(extract(epoch FROM now() - j.run_at), 0)::float8,
          j.fencing_token,
          -- Commit this claim without waiting for its WAL flush (see the invariants above).
          set_config('synchronous_commit', 'off', true)";

/// Who claims, and on what terms.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The replica's `lease_owner_id`.
    pub owner_id: &'a str,
    /// Whether the replica holds its owner lock on a live session.
    pub owner_locked: bool,
    /// The lease each claim grants.
    pub lease: Duration,
}

/// Claims up to `free_slots` due jobs for `claimant`.
///
/// # Errors
/// The database error of the claim statement.
pub async fn claim(
    client: &impl GenericClient,
    claimant: Claimant<'_>,
    free_slots: usize,
) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
    let limit = i64::try_from(free_slots).unwrap_or(i64::MAX);
    let rows = client
        .query_typed(
            CLAIM_SQL,
            &[
                (&limit, Type::INT8),
                (&claimant.owner_id, Type::TEXT),
                (&millis(claimant.lease), Type::INT8),
                (&claimant.owner_locked, Type::BOOL),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| ClaimedJob {
            ctx: JobContext {
                id: row.get(0),
                kind: row.get(1),
                attempt: row.get(3),
                max_attempts: row.get(4),
                lease_claim_id: row.get(5),
                fencing_token: row.get(8),
                owner_key: row.get(6),
            },
            payload: row.get(2),
            due_for: row.get(7),
        })
        .collect())
}

/// How long until the next deferred pending job is due, in whole milliseconds rounded up, if any.
///
/// Locks: none (a snapshot read of the pending partial index, in `(run_at, id)` order).
pub const NEXT_DUE_SQL: &str = "
SELECT ceil(extract(epoch FROM run_at - now()) * 1000)::int8
  FROM etl_job_records
 WHERE status = 'pending' AND run_at > now()
 ORDER BY run_at, id
 LIMIT 1";

/// The time until the next deferred job is due, if one is pending.
///
/// # Errors
/// The database error of the query.
pub async fn next_due(
    client: &impl GenericClient,
) -> Result<Option<Duration>, tokio_postgres::Error> {
    let row = client.query_typed_opt(NEXT_DUE_SQL, &[]).await?;
    Ok(row.map(|r| Duration::from_millis(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))))
}
