//! The claim: one statement that takes up to `n` due jobs for this replica.
//!
//! Invariants this module keeps:
//! - `n` is never more than the replica's free execution slots (the caller passes free slots).
//! - Every claimed row gets a fresh `lease_claim_id`, this replica's `lease_owner_id`, a lease on
//!   the database clock, `lease_renewed_at = now()`, `attempts + 1` and `fencing_token + 1`:
//!   attempts are counted at claim time, so a job that kills its worker every time still reaches
//!   its bound, and the fencing token grows with every claim and is never given back.
//! - The claim commits like every other commit, under the server's `synchronous_commit` (its WAL
//!   flushed, and under synchronous replication replicated, before the claimer sees its rows), so
//!   no handler starts on a claim that a crash or a failover can undo. A claim that committed
//!   without waiting for its flush (as claims did before) could be lost by a server crash while
//!   its handler ran: the row came back `pending` with its old fencing token and attempt count,
//!   and the next claim handed the same token to a second attempt, which an external system
//!   fencing by token would accept too (`faults::restart` crashes a private server to prove it
//!   cannot happen now).
//! - The claim's plan is pinned on the claim sessions alone: the producer claims on its own small
//!   pool ([`connect_claim_pool`]), whose sessions plan with sorts and bitmap scans
//!   off, so the claim walks the pending index in order even on a table without statistics; the
//!   replica's other sessions (group commits, handlers' effects) plan with the server's
//!   settings. (A SQL function with its own `SET` clause pinned it too, but cost about 100 µs of
//!   server CPU per job in a burn-down.)
//! - On the replica's claim sessions ([`ClaimSessions`]) the claim and the next-due read are
//!   prepared once per session and planned once, generically; the claim's plan is checked when
//!   the session opens (it must walk the pending index in order, with no sort, and join the
//!   claimed rows back through the primary key, with no scan or hash of the whole table), and a
//!   session whose plan fails the check sends the claim unnamed, planned on every call with its
//!   values. It counts a `claim_plan_fallbacks` only when the check can be judged (the live
//!   table has [`JUDGED_FROM_PAGES`] pages on disk: on an empty or nearly empty queue a
//!   sequential scan is the right plan, not an alarm); a session that could not judge is
//!   replaced after [`RECHECK_AFTER`], and its successor checks again. Elsewhere (tests, tools) [`claim`] sends it unnamed
//!   with typed parameters (`query_typed`): one round trip either way.

use crate::config::DatabaseConfig;
use crate::db;
use crate::error::Error;
use crate::handler::JobContext;
use crate::worker::lease::{millis, ClaimedJob};
use crate::worker::stats::WorkerStats;
use bb8::ManageConnection;
use bb8_postgres::PostgresConnectionManager;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, NoTls, Row, Statement};

/// Claims up to `$1` due jobs for owner `$2` with a lease of `$3` milliseconds; `$4` says whether
/// the owner holds its owner lock (so recovery may treat the lock's absence as death), `$5` is
/// the owner's heartbeat interval in milliseconds and `$6` whether every connection of the
/// owner holds its alive lock (the terms recovery judges the owner by).
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
       lease_heartbeat_ms = $5,
       lease_owner_alive_locked = $6,
       started_at = now(),
       updated_at = now()
  FROM due
 WHERE j.id = due.id
RETURNING j.id, j.kind, j.request_payload, j.attempts, j.max_attempts, j.lease_claim_id,
          j.owner_key, greatest(extract(epoch FROM now() - j.run_at), 0)::float8,
          j.fencing_token, j.run_at";

/// Who claims, and on what terms.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The replica's `lease_owner_id`.
    pub owner_id: &'a str,
    /// Whether the replica holds its owner lock on a live session.
    pub owner_locked: bool,
    /// The lease each claim grants.
    pub lease: Duration,
    /// The owner's heartbeat interval: recovery gives the owner two of them to renew.
    pub heartbeat_interval: Duration,
    /// Whether every connection of the owner holds its alive lock
    /// (`durable_etl_owner_alive_key`, see `worker::alive`), so that recovery reads "no lock at
    /// all" as death.
    pub alive_locked: bool,
}

/// The types of [`CLAIM_SQL`]'s parameters.
const CLAIM_PARAMS: [Type; 6] = [
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::BOOL,
    Type::INT4,
    Type::BOOL,
];

/// Claims up to `free_slots` due jobs for `claimant`, with an unnamed statement planned for
/// its values.
///
/// # Errors
/// The database error of the claim statement.
pub async fn claim(
    client: &impl GenericClient,
    claimant: Claimant<'_>,
    free_slots: usize,
) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
    let values = ClaimValues::of(claimant, free_slots);
    let typed: Vec<_> = values.params().into_iter().zip(CLAIM_PARAMS).collect();
    Ok(claimed(client.query_typed(CLAIM_SQL, &typed).await?))
}

/// The parameter values of [`CLAIM_SQL`] for a claim of `free_slots` for a claimant.
struct ClaimValues<'a> {
    /// The `LIMIT`.
    limit: i64,
    /// The owner id.
    owner_id: &'a str,
    /// The lease in milliseconds.
    lease: i64,
    /// Whether the owner holds its owner lock.
    owner_locked: bool,
    /// The owner's heartbeat interval in milliseconds, at least 1.
    heartbeat: i32,
    /// Whether the owner's connections hold its alive lock.
    alive_locked: bool,
}

impl<'a> ClaimValues<'a> {
    /// The values of a claim of `free_slots` for `claimant`.
    fn of(claimant: Claimant<'a>, free_slots: usize) -> ClaimValues<'a> {
        ClaimValues {
            limit: i64::try_from(free_slots).unwrap_or(i64::MAX),
            owner_id: claimant.owner_id,
            lease: millis(claimant.lease),
            owner_locked: claimant.owner_locked,
            heartbeat: i32::try_from(millis(claimant.heartbeat_interval))
                .unwrap_or(i32::MAX)
                .max(1),
            alive_locked: claimant.alive_locked,
        }
    }

    /// The values in [`CLAIM_SQL`]'s parameter order.
    fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.limit,
            &self.owner_id,
            &self.lease,
            &self.owner_locked,
            &self.heartbeat,
            &self.alive_locked,
        ]
    }
}

/// The claimed jobs of [`CLAIM_SQL`]'s rows.
fn claimed(rows: Vec<Row>) -> Vec<ClaimedJob> {
    rows.iter()
        .map(|row| ClaimedJob {
            ctx: Arc::new(JobContext {
                id: row.get(0),
                kind: row.get(1),
                attempt: row.get(3),
                max_attempts: row.get(4),
                lease_claim_id: row.get(5),
                fencing_token: row.get(8),
                owner_key: row.get(6),
                run_at: row.get(9),
            }),
            payload: row.get(2),
            due_for: row.get(7),
        })
        .collect()
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
    Ok(until_due(client.query_typed_opt(NEXT_DUE_SQL, &[]).await?))
}

/// The time until due of [`NEXT_DUE_SQL`]'s row.
fn until_due(row: Option<Row>) -> Option<Duration> {
    row.map(|r| Duration::from_millis(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
}

/// The statements a claim session prepared, the claim's plan having passed its check.
struct Prepared {
    /// [`CLAIM_SQL`].
    claim: Statement,
    /// [`NEXT_DUE_SQL`].
    next_due: Statement,
}

/// A replica's claim session: a connection of its claim pool ([`db::claim_pg_config`]: planner
/// switches pinned) with the claim and next-due statements prepared on it, unless the claim's
/// plan failed its check.
pub struct ClaimSession {
    /// The connection.
    client: Client,
    /// Its prepared statements; `None` after a failed plan check.
    prepared: Option<Prepared>,
    /// When a session whose check could not be judged yet (the live table was too small for
    /// any plan to matter) is due to be replaced, so that a fresh session checks again.
    recheck_at: Option<Instant>,
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
/// Locks: none (reads the table's size on disk).
pub(crate) const CAN_JUDGE_SQL: &str = "
SELECT pg_relation_size('etl_job_records') / current_setting('block_size')::int8 >= $1";

/// Finds the name of the protocol-level statement prepared from the text `$1` on a session (the
/// driver does not tell it), to `EXPLAIN` its plan.
pub(crate) const PREPARED_NAME_SQL: &str =
    "SELECT name FROM pg_prepared_statements WHERE statement = $1 AND NOT from_sql LIMIT 1";

impl ClaimSession {
    /// Prepares the statements on `client` and checks the claim's plan: it must walk
    /// `etl_job_records_pending_due_idx`, with no sort and no scan or join of the whole table.
    /// If it does not, the session plans each claim for its values instead (`plan_cache_mode =
    /// force_custom_plan`); and if the live table is large enough for the check to be judged
    /// ([`JUDGED_FROM_PAGES`]), the failure is logged and `stats` counts a fallback, else the
    /// session is only due for a recheck after [`RECHECK_AFTER`] (an empty queue is no alarm).
    ///
    /// # Errors
    /// The database error of a statement.
    pub async fn open(
        client: Client,
        stats: &WorkerStats,
    ) -> Result<ClaimSession, tokio_postgres::Error> {
        let claim = client.prepare_typed(CLAIM_SQL, &CLAIM_PARAMS).await?;
        let explained = explain_prepared_claim(&client).await?;
        if walks_the_pending_index_in_order(&explained) {
            let next_due = client.prepare(NEXT_DUE_SQL).await?;
            let prepared = Some(Prepared { claim, next_due });
            return Ok(ClaimSession {
                client,
                prepared,
                recheck_at: None,
            });
        }
        let judged: bool = client
            .query_typed_one(CAN_JUDGE_SQL, &[(&JUDGED_FROM_PAGES, Type::INT8)])
            .await?
            .get(0);
        let recheck_at = if judged {
            tracing::warn!("the prepared claim's plan failed its check; planning every claim");
            stats.record_claim_plan_fallback();
            None
        } else {
            Some(Instant::now() + RECHECK_AFTER)
        };
        client
            .batch_execute("SET plan_cache_mode = force_custom_plan")
            .await?;
        Ok(ClaimSession {
            client,
            prepared: None,
            recheck_at,
        })
    }

    /// The session's connection, to pipeline other statements before a claim.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the claim runs prepared (its plan passed the check).
    pub fn is_prepared(&self) -> bool {
        self.prepared.is_some()
    }

    /// Whether the session's plan check could not be judged (the queue was nearly empty) and
    /// it is due, at `now`, to be replaced by a session that checks again.
    pub(crate) fn due_for_recheck(&self, now: Instant) -> bool {
        self.recheck_at.is_some_and(|at| now >= at)
    }

    /// [`claim`] on this session, prepared when it can be.
    ///
    /// # Errors
    /// The database error of the claim statement.
    pub async fn claim(
        &self,
        claimant: Claimant<'_>,
        free_slots: usize,
    ) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
        let Some(prepared) = &self.prepared else {
            return claim(&self.client, claimant, free_slots).await;
        };
        let values = ClaimValues::of(claimant, free_slots);
        let rows = self.client.query(&prepared.claim, &values.params()).await?;
        Ok(claimed(rows))
    }

    /// [`next_due`] on this session, prepared when it can be.
    ///
    /// # Errors
    /// The database error of the query.
    pub async fn next_due(&self) -> Result<Option<Duration>, tokio_postgres::Error> {
        match &self.prepared {
            Some(prepared) => Ok(until_due(
                self.client.query_opt(&prepared.next_due, &[]).await?,
            )),
            None => next_due(&self.client).await,
        }
    }
}

/// The JSON plan of the claim prepared on `client` (its generic plan, on a claim session).
async fn explain_prepared_claim(
    client: &Client,
) -> Result<serde_json::Value, tokio_postgres::Error> {
    let name: String = client
        .query_one(PREPARED_NAME_SQL, &[&CLAIM_SQL])
        .await?
        .get(0);
    // The values do not matter to a generic plan; the statement is only explained.
    Ok(client
        .query_one(
            &format!("EXPLAIN (FORMAT JSON) EXECUTE {name}(1, '', 1, false, 1, false)"),
            &[],
        )
        .await?
        .get(0))
}

impl db::Session for ClaimSession {
    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// Whether the JSON plan `explained` scans `etl_job_records_pending_due_idx` and does nothing
/// whose cost grows with the table: no sort, no sequential or bitmap scan, no hash or merge join
/// (the claimed rows are joined back through the primary key, one probe each).
fn walks_the_pending_index_in_order(explained: &serde_json::Value) -> bool {
    /// Every plan node under `node`, itself included.
    fn nodes<'a>(node: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        out.push(node);
        for child in node["Plans"].as_array().into_iter().flatten() {
            nodes(child, out);
        }
    }
    /// Node types that read or order every row they are given, however few are claimed.
    const WHOLE_TABLE: [&str; 5] = ["Sort", "Seq Scan", "Bitmap", "Hash", "Merge"];
    let mut all = Vec::new();
    nodes(&explained[0]["Plan"], &mut all);
    let walks = all
        .iter()
        .any(|n| n["Index Name"] == "etl_job_records_pending_due_idx");
    let grows = all.iter().any(|n| {
        n["Node Type"]
            .as_str()
            .is_some_and(|t| WHOLE_TABLE.iter().any(|w| t.contains(w)))
    });
    walks && !grows
}

/// Opens a replica's claim sessions ([`ClaimSession`]) for `bb8`, each holding its owner's alive
/// lock when the replica holds them.
pub struct ClaimSessions {
    /// Opens the connections.
    connections: PostgresConnectionManager<NoTls>,
    /// Where plan-check fallbacks are counted.
    stats: Arc<WorkerStats>,
    /// The owner whose alive lock each session holds (`None`: a replica without alive locks).
    alive: Option<String>,
}

impl ManageConnection for ClaimSessions {
    type Connection = ClaimSession;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<ClaimSession, tokio_postgres::Error> {
        let client = self.connections.connect().await?;
        crate::worker::alive::hold(&client, self.alive.as_deref()).await?;
        ClaimSession::open(client, &self.stats).await
    }

    async fn is_valid(&self, session: &mut ClaimSession) -> Result<(), tokio_postgres::Error> {
        self.connections.is_valid(&mut session.client).await
    }

    fn has_broken(&self, session: &mut ClaimSession) -> bool {
        session.client.is_closed() || session.due_for_recheck(Instant::now())
    }
}

/// The claim sessions of a replica.
pub type ClaimPool = bb8::Pool<ClaimSessions>;

/// Opens a replica's claim pool ([`db::claim_pg_config`], [`db::CLAIM_POOL_SIZE`] sessions,
/// each holding `alive`'s alive lock when given), proving the database answers; plan-check
/// fallbacks are counted in `stats`.
///
/// # Errors
/// As [`db::connect_pool`].
pub async fn connect_claim_pool(
    cfg: &DatabaseConfig,
    stats: Arc<WorkerStats>,
    alive: Option<&str>,
) -> Result<ClaimPool, Error> {
    let sessions = ClaimSessions {
        connections: PostgresConnectionManager::new(db::claim_pg_config(cfg)?, NoTls),
        stats,
        alive: alive.map(str::to_owned),
    };
    db::build_pool_of(sessions, cfg, db::CLAIM_POOL_SIZE).await
}

#[cfg(test)]
mod tests;
