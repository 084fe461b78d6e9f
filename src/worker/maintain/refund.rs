//! Refunds: the attempts recovery charged a replica that was only cut off, given back once it
//! reaches the database again.
//!
//! Recovery cannot tell a dead replica from one whose every connection was cut for longer than
//! its silence (`beat`): both have lost their locks and stopped beating when it must act. It
//! takes the jobs of both, charges the attempt, and records from which owner it took it
//! (migration 0032). A replica that runs [`REFUND_SQL`] is alive, so every attempt of its own
//! incarnation that recovery took was taken from a live replica: an infrastructure fault, not
//! the job's. Only a replica whose process died never comes back to refund, so only a job whose
//! worker process dies stays charged by recovery (and a job that kills its worker every time
//! still reaches its bound).
//!
//! Invariants this module keeps:
//! - A replica refunds only attempts of its own incarnation: taken from its owner id, started at
//!   or after its start-up (`claimer::Orphans::since`). A previous incarnation's attempts, whose
//!   process died, stay charged.
//! - An attempt is refunded at most once: the statement that gives its job the attempt back also
//!   turns it from `recovered` into `released` (out of the index the next refund reads).
//! - A job that ended keeps its outcome as written; only its history says the attempt was
//!   released. A live job's count goes down by what was refunded, never below zero, whatever
//!   its state (a claim running it keeps its own context; its retry and its end read the count
//!   refunded).
//! - A refund runs when the replica's beats trust its leases again after that trust lapsed (no
//!   judge takes a replica whose trust has not lapsed: its silence is longer), and when a
//!   give-back of an abandoned job finds its claim gone (a lease recovery may have expired while
//!   the replica could not renew); and once more [`REFUND_AGAIN_AFTER`] later, for a judgement
//!   whose statement began before the beat that proved the replica alive and committed after the
//!   first refund. A refund that fails is tried again at the next of those.

use crate::db;
use crate::worker::liveness::beat::SILENCE;
use crate::worker::shared::Shared;
use crate::worker::timing::sleep_until_opt;
use std::future::pending;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// Turns every `recovered` attempt of owner `$1` started at or after `$2` into `released`, and
/// gives each live job the attempts it was charged that way back. Returns how many attempts were
/// refunded, and how many of their jobs were still live.
///
/// Locks: row-locks the refunded history rows (found through their partial index), then each
/// live job's row (`FOR NO KEY UPDATE`, by primary key), waiting for a commit that holds one.
/// Nothing else locks history rows, so the order cannot deadlock.
pub const REFUND_SQL: &str = "
WITH refunded AS (
    UPDATE etl_job_attempts a
       SET ending = 'released'
     WHERE a.owner_id = $1 AND a.started_at >= $2 AND a.ending = 'recovered'
 RETURNING a.job_id
), uncharged AS (
    UPDATE etl_job_records j
       SET attempts = greatest(j.attempts - r.n, 0)
      FROM (SELECT job_id, count(*)::int4 AS n FROM refunded GROUP BY job_id) r
     WHERE j.id = r.job_id
 RETURNING j.id
)
SELECT (SELECT count(*) FROM refunded), (SELECT count(*) FROM uncharged)";

/// What one refund did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refunded {
    /// Attempts turned from `recovered` into `released`.
    pub attempts: u64,
    /// Of their jobs, those still live, whose count went down.
    pub live_jobs: u64,
}

/// Refunds what recovery took from `owner_id`'s incarnation that started at `since` (see
/// [`REFUND_SQL`]).
///
/// # Errors
/// The database error of the statement.
pub async fn refund(
    client: &impl GenericClient,
    owner_id: &str,
    since: SystemTime,
) -> Result<Refunded, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            REFUND_SQL,
            &[(&owner_id, Type::TEXT), (&since, Type::TIMESTAMPTZ)],
        )
        .await?;
    let count = |i| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    Ok(Refunded {
        attempts: count(0),
        live_jobs: count(1),
    })
}

/// How long after a refund the replica refunds once more: a silence, so a judgement that began
/// before the beat that proved the replica alive has committed.
pub const REFUND_AGAIN_AFTER: Duration = SILENCE;

/// The refund role: refunds when [`Shared::refund_due`] or the beats' regained trust asks
/// (see the module's invariants), and once more [`REFUND_AGAIN_AFTER`] later, until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut again_at: Option<tokio::time::Instant> = None;
    loop {
        let regained = async {
            match shared.signals.as_deref() {
                Some(signals) => signals.beats.regained.notified().await,
                None => pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.refund_due.notified() => {}
            () = regained => {}
            () = sleep_until_opt(again_at) => {}
        }
        // The follow-up came due: this refund is the last unless it fails.
        let followed_up = again_at.is_some_and(|at| tokio::time::Instant::now() >= at);
        again_at = match once(&shared).await {
            Ok(_) if followed_up => None,
            _ => Some(tokio::time::Instant::now() + REFUND_AGAIN_AFTER),
        };
    }
}

/// One refund on the replica's pool, counted and logged.
async fn once(shared: &Shared) -> Result<Refunded, ()> {
    let refunded = async {
        let conn = db::checkout(&shared.pool).await?;
        shared.stats.record_round_trips(1);
        let since = shared.orphans.since();
        db::bounded(
            shared.statement_bound,
            refund(&*conn, shared.owner_id(), since),
        )
        .await
    };
    match refunded.await {
        Ok(r) => {
            shared.stats.record_refunded(r.attempts);
            if r.attempts > 0 {
                tracing::info!(
                    attempts = r.attempts,
                    live_jobs = r.live_jobs,
                    "refunded the attempts recovery took from this live replica"
                );
            }
            Ok(r)
        }
        Err(e) => {
            tracing::warn!(code = %e.code(), "refund failed; trying again");
            Err(())
        }
    }
}
