//! The shutdown release: the jobs a replica still holds when its grace period ends go back to
//! `pending`, their attempt not charged, in one fenced statement; and the give-back of a job the
//! replica abandoned because it stopped trusting its lease, or whose result an infrastructure
//! fault kept from committing ([`give_back`]).
//!
//! Invariants this module keeps:
//! - Only leases still held under their claim are touched; a job whose owner asked to cancel it
//!   ends `cancelled` instead (live row deleted, outcome appended in the same statement),
//!   including a request recorded while a commit held the job (`jobs::apply_deferred`, sent
//!   just before the release in the same round trip).
//! - Released jobs are announced on the replicas' channel once the release committed.
//! - The release is bounded by [`RELEASE_TIMEOUT`]: a replica never hangs at exit on it; leases
//!   it could not release expire and recovery returns them.
//! - A job abandoned with its lease lost is given back uncharged only while its claim is still
//!   the replica's own (the release is fenced): after an outage nobody judged (a server restart,
//!   where every judge waits out its reconnect grace) it runs again without losing an attempt;
//!   if another replica took it, nothing changes. The same holds for a job whose computed result
//!   an infrastructure fault kept from committing: never charged by this replica.

use crate::codes::Code;
use crate::db;
use crate::error::Error;
use crate::jobs;
use crate::worker::complete::transition::Transition;
use crate::worker::lease::{self, Lease};
use crate::worker::liveness::held::HeldJobs;
use crate::worker::shared::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Gives unfinished jobs back: `pending`, attempt not charged, lease cleared, for every
/// `(id, claim id)` pair in `$1`/`$2` still running under that claim; a job whose owner asked
/// to cancel it ends `cancelled` instead of running again. A released job whose claim is in `$3`
/// (its handler had started) gets its attempt appended to its history (`released`); a job that
/// only waited in a replica's buffer started no attempt and gets none. Returns how many were
/// still held.
///
/// Locks: `decided` row-locks the fenced rows (`FOR NO KEY UPDATE`, in id order, as a group
/// commit does), so it reads each row's current version and a cancel request that committed
/// while it waited is honoured; `released` and `ended` then change the rows it holds; rows whose
/// claim changed are not touched. `history` takes
/// `FOR KEY SHARE` on each started job's intake row (its foreign key; see `attempt_ended!`).
pub const RELEASE_SQL: &str = concat!(
    "
WITH decided AS (
    SELECT j.id, j.lease_claim_id AS claim_id, j.queue, j.permit_slot, ",
    cancel_requested!(),
    " AS cancel
      FROM etl_job_records j
     WHERE j.id = ANY($1::uuid[]) AND j.lease_claim_id = ANY($2::uuid[])
       AND j.status = 'running'
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
), released AS (
    UPDATE etl_job_records AS j
       SET status = 'pending', attempts = j.attempts - 1, updated_at = now(), ",
    lease_cleared!(),
    "
      FROM decided d
     WHERE j.id = d.id AND NOT d.cancel AND j.lease_claim_id = d.claim_id AND j.status = 'running'
 RETURNING j.id, j.attempts + 1 AS attempts, j.started_at, j.run_at, d.claim_id
), history AS (
    ",
    attempt_ended!(
        "(SELECT * FROM released WHERE claim_id = ANY($3::uuid[]))",
        "released"
    ),
    "
), ended AS (
    DELETE FROM etl_job_records AS j
     USING decided d
     WHERE j.id = d.id AND d.cancel AND j.lease_claim_id = d.claim_id AND j.status = 'running'
 RETURNING ",
    ended_columns!(),
    "
), outcome AS (
    ",
    outcome_of!("ended", "'cancelled'", "cancel_code", "NULL::int4"),
    "
), ",
    permits_freed!(
        "SELECT d.queue, d.permit_slot, d.claim_id FROM decided d
          WHERE d.id IN (SELECT id FROM released UNION ALL SELECT id FROM ended)"
    ),
    "
SELECT (SELECT count(*) FROM released) + (SELECT count(*) FROM outcome)"
);

/// Releases the given `(id, claim id)` leases, recording an attempt for those whose claim is in
/// `started` (their handler had started); returns how many were still held.
///
/// # Errors
/// The database error of the statement.
pub async fn release(
    client: &impl GenericClient,
    held: &[Lease],
    started: &[Uuid],
) -> Result<u64, tokio_postgres::Error> {
    let (ids, claims) = lease::unzip(held);
    let row = client
        .query_typed_one(
            RELEASE_SQL,
            &[
                (&ids, Type::UUID_ARRAY),
                (&claims, Type::UUID_ARRAY),
                (&started, Type::UUID_ARRAY),
            ],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

/// How long the shutdown release may wait (for a row lock, say) before the replica exits anyway
/// and leaves the unreleased leases to expire.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Releases, at shutdown, the leases of the jobs still `held` after the grace period, within
/// [`RELEASE_TIMEOUT`]; a release that fails or times out is logged by code, and those leases
/// expire instead.
pub(crate) async fn release_held(shared: &Shared, held: &HeldJobs) {
    if tokio::time::timeout(RELEASE_TIMEOUT, release_now(shared, held))
        .await
        .is_err()
    {
        tracing::warn!("release timed out; leases will expire");
    }
}

/// [`release_held`] without its time bound.
async fn release_now(shared: &Shared, held: &HeldJobs) {
    let leases = held.leases();
    if leases.is_empty() {
        return;
    }
    crash_point!("release");
    match release_leases(shared, &leases, &held.started()).await {
        Ok(n) => tracing::info!(released = n, "released unfinished jobs"),
        Err(e) => tracing::warn!(code = %e.code(), "release failed; leases will expire"),
    }
}

/// Releases `leases` on a pooled connection within the replica's statement bound (the shutdown
/// release, and the producer's release of jobs that waited too long in its prefetch buffer),
/// recording an attempt for the claims in `started`; counts and returns how many were still
/// held. The release's own statement wakes the replicas waiting for the released jobs' queues
/// (migration 0028's given-back trigger), so an idle one claims them at once rather than at its
/// next poll.
///
/// # Errors
/// Pool and database errors.
pub(crate) async fn release_leases(
    shared: &Shared,
    leases: &[Lease],
    started: &[Uuid],
) -> Result<u64, Error> {
    shared.stats.record_round_trips(1);
    let conn = db::checkout(&shared.pool).await?;
    // Pipelined before the release, in the same round trip: cancels recorded while a commit held
    // their job are set on the rows first, and the release ends those jobs `cancelled`.
    let (applied, n) = futures::join!(
        db::bounded(shared.statement_bound, jobs::apply_deferred(&*conn, None)),
        db::bounded(shared.statement_bound, release(&*conn, leases, started))
    );
    if let Err(e) = applied {
        tracing::warn!(code = %e.code(), "applying deferred cancel requests failed");
    }
    let n = n?;
    shared.stats.record_released(n);
    Ok(n)
}

/// How often a replica tries to give back a job it abandoned with its lease lost.
const GIVE_BACK_EVERY: Duration = Duration::from_millis(250);

/// Gives back, uncharged, a job this replica could not finish through no fault of the job's:
/// one it abandoned because it stopped trusting its lease (`transition` is
/// [`Transition::LeaseLost`]: its clocks ran out in a lost database or a cut of every
/// connection, or the heartbeat found the lease gone), or one whose computed result an
/// infrastructure fault kept from committing ([`Transition::GivenBack`]). Logs it, and, on a
/// task of its own, tries every [`GIVE_BACK_EVERY`] until the fenced release answers or the
/// lease has run out (recovery then returns the job, charged): the release changes the job only
/// while its claim is still this replica's own, and counts it (`given_back`) when it did.
pub(crate) fn give_back(shared: &Arc<Shared>, lease: Lease, transition: Transition) {
    if transition == Transition::LeaseLost {
        tracing::warn!(job_id = %lease.job_id, code = "lease_lost", "abandoned job: lease lost");
    } else {
        tracing::warn!(
            job_id = %lease.job_id,
            code = %Code::TransientDatabase,
            "giving back a job an infrastructure fault kept from committing"
        );
    }
    let shared = Arc::clone(shared);
    // Adoption leaves the claim alone meanwhile (`claimer::adopt`).
    shared.orphans.giving_back(lease.claim_id);
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + shared.config.lease;
        while tokio::time::Instant::now() < until {
            match release_leases(&shared, &[lease], &[lease.claim_id]).await {
                Ok(0) => {
                    // Taken by recovery, perhaps from this live replica: refund what it charged.
                    shared.refund_due.notify_one();
                    break;
                }
                Ok(_) => {
                    shared.stats.record_given_back();
                    tracing::info!(job_id = %lease.job_id, "gave back a job uncharged");
                    break;
                }
                Err(_) => tokio::time::sleep(GIVE_BACK_EVERY).await,
            }
        }
        shared.orphans.given_back(lease.claim_id);
    });
}
