//! The reporter: the role that, once per heartbeat interval, tells the database how this replica
//! is doing, for the console's operator view (migration 0011): its row of `etl_replicas` (when it
//! started, when it last reported, the jobs it holds, its claim rate) and its incarnation's row
//! of the current minute in `etl_replica_minutes` (its counters since it started: by queue and
//! pickup latency bucket too, migration 0038); after its first report of each minute, the
//! backlog sample (`backlog`).
//!
//! Invariants this module keeps:
//! - A report holds aggregates only: counts, rates, times and stored failure codes; never a job
//!   id, an owner or a payload.
//! - Each run of a replica is an incarnation with a random id (migration 0015). Its minute rows
//!   are its own, keyed by (minute, owner id, incarnation): an incarnation that died mid-minute
//!   keeps the totals of its last report, and one restarted with the same owner id adds its own
//!   beside them instead of overwriting them. The totals are idempotent: a report whose outcome
//!   is unknown (a timeout after the commit, say) is replaced by the next without counting twice.
//! - One statement per report on the pool, bounded, plus one backlog statement per minute (tried
//!   once a minute, whatever its outcome); a failed report is logged by code and the next one
//!   replaces it (the counters are totals, so nothing is lost but a minute's resolution).
//! - The per-queue totals name only the queues the replica claimed from (its configuration
//!   bounds them); the pickup buckets are `stats::LATENCY_BUCKETS`' and one more, as migration
//!   0038 documents them.
//! - While its session is known to have lost the owner lock, a replica does not report: another
//!   process may hold its owner id now, and that holder's row is not overwritten.
//! - Rows of the minute and backlog tables older than two hours, and replica rows not reported for
//!   an hour, are deleted by the reports themselves; a replica that stops deletes its own row
//!   only if it is still its incarnation's, so one stopped because another process took its
//!   owner id leaves the holder's row.

use crate::db;
use crate::error::Error;
use crate::worker::liveness::backlog;
use crate::worker::liveness::held::HeldJobs;
use crate::worker::shared::Shared;
use crate::worker::timing::ticker;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use tokio::time::Instant;
use tokio_postgres::types::{Json, Type};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Upserts owner `$1`'s report, of incarnation `$12`: started at `$2`, holding `$3` jobs, `$4`
/// claimed in all at `$5` jobs/s; this minute's totals: `$6` succeeded, `$7` failed (`$8` by
/// code, `$15` by queue: `{"queue": [succeeded, failed]}`), `$9` recovered, `$10` pickups taking
/// `$11` seconds in all (`$16` per latency bucket); running the kinds `$13` and serving the queues
/// `$14` (so operators see what no live replica serves). Deletes what is too old to show, and
/// returns the database's current minute (the reporter samples the backlog once in each).
///
/// Locks: the replica's own rows (its incarnation's minute rows: nobody else writes them; its
/// owner id's replica row, which only a process holding that owner id writes); the deletes take
/// the locks of rows nobody has written for an hour or more. The tables are UNLOGGED: no WAL.
pub(crate) const REPORT_SQL: &str = "
WITH replica AS (
    INSERT INTO etl_replicas (owner_id, incarnation, started_at, reported_at, held, claimed,
                              claim_rate, kinds, queues)
    VALUES ($1, $12, $2, now(), $3, $4, $5, $13, $14)
        ON CONFLICT (owner_id) DO UPDATE
       SET incarnation = EXCLUDED.incarnation, started_at = EXCLUDED.started_at,
           reported_at = EXCLUDED.reported_at, held = EXCLUDED.held, claimed = EXCLUDED.claimed,
           claim_rate = EXCLUDED.claim_rate, kinds = EXCLUDED.kinds, queues = EXCLUDED.queues
), minute AS (
    INSERT INTO etl_replica_minutes (minute, owner_id, incarnation, started_at, succeeded,
                                     failed, failed_by_code, recovered, pickups, pickup_seconds,
                                     by_queue, pickup_buckets)
    VALUES (date_trunc('minute', now()), $1, $12, $2, $6, $7, $8, $9, $10, $11, $15, $16)
        ON CONFLICT (minute, owner_id, incarnation) DO UPDATE
       SET started_at = EXCLUDED.started_at, succeeded = EXCLUDED.succeeded,
           failed = EXCLUDED.failed, failed_by_code = EXCLUDED.failed_by_code,
           recovered = EXCLUDED.recovered, pickups = EXCLUDED.pickups,
           pickup_seconds = EXCLUDED.pickup_seconds, by_queue = EXCLUDED.by_queue,
           pickup_buckets = EXCLUDED.pickup_buckets
), old_minutes AS (
    DELETE FROM etl_replica_minutes WHERE minute < now() - interval '2 hours'
), old_backlog AS (
    DELETE FROM etl_backlog_minutes WHERE minute < now() - interval '2 hours'
), old_replicas AS (
    DELETE FROM etl_replicas WHERE reported_at < now() - interval '1 hour'
)
SELECT date_trunc('minute', now())";

/// Deletes owner `$1`'s replica row if it is still incarnation `$2`'s: it stopped.
///
/// Locks: the row's lock.
pub(crate) const GONE_SQL: &str =
    "DELETE FROM etl_replicas WHERE owner_id = $1 AND incarnation = $2";

/// One run of a replica: what its reports say it is.
#[derive(Debug, Clone, Copy)]
struct Incarnation {
    /// Its random id.
    id: Uuid,
    /// When it started.
    started_at: DateTime<Utc>,
}

/// The reporter role: reports every heartbeat interval (at once, then on every tick, except
/// while the session is known to have lost the owner lock) until `stop`, then deletes its
/// replica row if it is still its own.
pub(crate) async fn run(shared: Arc<Shared>, held: HeldJobs, stop: CancellationToken) {
    let incarnation = Incarnation {
        id: Uuid::new_v4(),
        started_at: Utc::now(),
    };
    let mut last: Option<(Instant, u64)> = None;
    let mut sampled: Option<DateTime<Utc>> = None;
    let mut tick = ticker(shared.config.heartbeat_interval);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {
                if shared.signals.is_some() && !shared.owner_locked() {
                    continue;
                }
                match report(&shared, &held, incarnation, last).await {
                    Ok((now, minute)) => {
                        last = Some(now);
                        if sampled != Some(minute) {
                            sampled = Some(minute);
                            if let Err(e) = sample_backlog(&shared).await {
                                tracing::warn!(code = %e.code(), "backlog sample failed");
                            }
                        }
                    }
                    Err(e) => tracing::warn!(code = %e.code(), "report failed"),
                }
            }
        }
    }
    if let Err(e) = gone(&shared, incarnation).await {
        tracing::warn!(code = %e.code(), "report of the stop failed");
    }
}

/// Sends one report; returns when it was taken and the claimed total then, for the next claim
/// rate (`last`: the previous report's), and the database's minute.
async fn report(
    shared: &Shared,
    held: &HeldJobs,
    incarnation: Incarnation,
    last: Option<(Instant, u64)>,
) -> Result<((Instant, u64), DateTime<Utc>), Error> {
    let now = Instant::now();
    let stats = shared.stats.snapshot();
    let rate = last.map_or(0.0, |(then, claimed)| {
        let seconds = now.duration_since(then).as_secs_f64();
        if seconds > 0.0 {
            stats.claimed.saturating_sub(claimed) as f64 / seconds
        } else {
            0.0
        }
    });
    let by_code: serde_json::Map<String, serde_json::Value> = shared
        .stats
        .failed_by_code()
        .filter(|(_, n)| *n > 0)
        .map(|(code, n)| (code.to_owned(), n.into()))
        .collect();
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let held_now = i32::try_from(held.len()).unwrap_or(i32::MAX);
    let recovered = stats.recovered_expired + stats.recovered_dead_owner;
    let pickup_seconds = stats.pickup_micros as f64 / 1e6;
    let (owner, by_code) = (shared.owner_id(), Json(&by_code));
    let totals = [
        count(stats.claimed),
        count(stats.succeeded),
        count(stats.failed),
        count(recovered),
        count(stats.pickups),
    ];
    let queues = shared.queue_names();
    let by_queue: serde_json::Map<String, serde_json::Value> = shared
        .stats
        .ended_by_queue()
        .into_iter()
        .map(|(queue, [ok, failed])| (queue.to_string(), serde_json::json!([ok, failed])))
        .collect();
    let by_queue = Json(&by_queue);
    let buckets: Vec<i64> = shared
        .stats
        .pickup_buckets()
        .into_iter()
        .map(count)
        .collect();
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 16] = [
        (&owner, Type::TEXT),
        (&incarnation.started_at, Type::TIMESTAMPTZ),
        (&held_now, Type::INT4),
        (&totals[0], Type::INT8),
        (&rate, Type::FLOAT8),
        (&totals[1], Type::INT8),
        (&totals[2], Type::INT8),
        (&by_code, Type::JSONB),
        (&totals[3], Type::INT8),
        (&totals[4], Type::INT8),
        (&pickup_seconds, Type::FLOAT8),
        (&incarnation.id, Type::UUID),
        (&shared.kinds, Type::TEXT_ARRAY),
        (&queues, Type::TEXT_ARRAY),
        (&by_queue, Type::JSONB),
        (&buckets, Type::INT8_ARRAY),
    ];
    let conn = db::checkout(&shared.pool).await?;
    shared.stats.record_round_trips(1);
    let statement = conn.query_typed(REPORT_SQL, &params);
    let rows = db::bounded(shared.statement_bound, statement).await?;
    let minute = rows.first().map_or_else(Utc::now, |r| r.get(0));
    Ok(((now, stats.claimed), minute))
}

/// Sends the backlog sample of the current minute (a no-op once another replica's is in).
async fn sample_backlog(shared: &Shared) -> Result<(), Error> {
    let conn = db::checkout(&shared.pool).await?;
    shared.stats.record_round_trips(1);
    db::bounded(shared.statement_bound, backlog::sample(&*conn)).await?;
    Ok(())
}

/// Deletes the replica's row as it stops, if it is still `incarnation`'s.
async fn gone(shared: &Shared, incarnation: Incarnation) -> Result<(), Error> {
    let conn = db::checkout(&shared.pool).await?;
    let owner = shared.owner_id();
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&owner, Type::TEXT), (&incarnation.id, Type::UUID)];
    db::bounded(
        shared.statement_bound,
        conn.execute_typed(GONE_SQL, &params),
    )
    .await?;
    Ok(())
}
