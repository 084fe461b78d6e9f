//! The pruner: the role that, at start and then once a minute, deletes what the product keeps
//! only for a time: retained payloads past their time to keep or whose job did not fail
//! ([`retention::prune`]), and the records of schedule fires older than [`FIRES_KEPT`].
//!
//! Invariants this module keeps:
//! - Every statement is bounded ([`FIRES_BATCH`] fire records, [`retention::PRUNE_BATCH`]
//!   payloads) and skips rows another transaction holds (`SKIP LOCKED`), so two replicas
//!   pruning at once never wait on each other. A pass repeats a statement that deleted a full
//!   batch at most [`PRUNE_ROUNDS`] times: a backlog is worked off over a few minutes, never in
//!   one long transaction.
//! - It deletes only what has expired. A fire record is history, not state: a schedule's next
//!   fire is kept in its own row (`etl_schedules.next_fire_at`), so deleting the record of a past
//!   fire never lets the schedule fire that instant again.
//! - Fire records are found through the primary key, one schedule at a time (an index probe per
//!   schedule when nothing is old), never by a scan of every fire.
//! - A failed statement is logged by its code and tried again at the next pass.

use crate::db;
use crate::dead_letters::retention;
use crate::worker::shared::Shared;
use crate::worker::timing::ticker;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// How often a replica prunes.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The most statements of one kind a pass runs while each deletes a full batch.
pub const PRUNE_ROUNDS: usize = 10;

/// How long the record of a schedule's fire is kept after its instant: seven days.
pub const FIRES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most fire records one statement deletes.
pub const FIRES_BATCH: i64 = 10_000;

/// Deletes up to `$1` fire records whose instant is more than `$2` seconds old, taking at most
/// `$1` of each schedule's oldest through the primary key `(owner_key, name, fire_at)`.
///
/// Locks: row-locks the records it deletes, skipping those another transaction holds (`SKIP
/// LOCKED`: another replica's pass, or a schedule's delete). Reads the schedules without locks.
pub const FIRES_SQL: &str = "
WITH old AS (
    SELECT f.owner_key, f.name, f.fire_at
      FROM etl_schedules s
     CROSS JOIN LATERAL (
           SELECT owner_key, name, fire_at
             FROM etl_schedule_fires
            WHERE owner_key = s.owner_key AND name = s.name
              AND fire_at < now() - $2::int8 * interval '1 second'
            ORDER BY fire_at
            LIMIT $1
              FOR UPDATE SKIP LOCKED
           ) f
     LIMIT $1
)
DELETE FROM etl_schedule_fires d
 USING old
 WHERE d.owner_key = old.owner_key AND d.name = old.name AND d.fire_at = old.fire_at";

/// Deletes up to [`FIRES_BATCH`] fire records older than `kept` ([`FIRES_SQL`]); returns how
/// many.
///
/// # Errors
/// The database error of the statement.
pub async fn prune_fires(
    client: &impl GenericClient,
    kept: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let kept_s = i64::try_from(kept.as_secs()).unwrap_or(i64::MAX);
    client
        .execute_typed(
            FIRES_SQL,
            &[(&FIRES_BATCH, Type::INT8), (&kept_s, Type::INT8)],
        )
        .await
}

/// The pruner role: a pass at once, then every [`PRUNE_EVERY`], until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = ticker(PRUNE_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => pass(&shared).await,
        }
    }
}

/// What a pass prunes.
#[derive(Debug, Clone, Copy)]
enum Pruned {
    /// Retained payloads no longer kept ([`retention::prune`]).
    Payloads,
    /// Fire records past [`FIRES_KEPT`] ([`prune_fires`]).
    Fires,
}

impl Pruned {
    /// The most rows one of its statements deletes.
    fn batch(self) -> i64 {
        match self {
            Pruned::Payloads => retention::PRUNE_BATCH,
            Pruned::Fires => FIRES_BATCH,
        }
    }

    /// What it is, for the log.
    fn what(self) -> &'static str {
        match self {
            Pruned::Payloads => "retained payloads no longer kept",
            Pruned::Fires => "schedule fire records past their time to keep",
        }
    }

    /// Runs one of its statements on `client`; returns how many rows it deleted.
    async fn once(self, client: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
        match self {
            Pruned::Payloads => retention::prune(client).await,
            Pruned::Fires => prune_fires(client, FIRES_KEPT).await,
        }
    }
}

/// One pass: the retained payloads no longer kept, then the fire records past [`FIRES_KEPT`],
/// each logged by how many it deleted (or the failure's code).
pub(crate) async fn pass(shared: &Shared) {
    for pruned in [Pruned::Payloads, Pruned::Fires] {
        log(rounds(shared, pruned).await, pruned.what());
    }
}

/// Runs `pruned`'s statement on a pooled connection, again while it deleted a full batch, at
/// most [`PRUNE_ROUNDS`] times; returns how many rows it deleted in all.
async fn rounds(shared: &Shared, pruned: Pruned) -> Result<u64, crate::Error> {
    let full = u64::try_from(pruned.batch()).unwrap_or(u64::MAX);
    let mut deleted = 0;
    for _ in 0..PRUNE_ROUNDS {
        let conn = db::checkout(&shared.pool).await?;
        let n = db::bounded(shared.statement_bound, pruned.once(&*conn)).await?;
        deleted += n;
        if n < full {
            break;
        }
    }
    Ok(deleted)
}

/// Logs what a pass deleted of `what`: at info when it deleted any, by code when it failed.
fn log(outcome: Result<u64, crate::Error>, what: &str) {
    match outcome {
        Ok(0) => {}
        Ok(n) => tracing::info!(deleted = n, what, "pruned"),
        Err(e) => tracing::warn!(code = %e.code(), what, "pruning failed"),
    }
}
