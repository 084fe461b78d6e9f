//! Giving jobs back: the shutdown release of the jobs a replica still holds when its grace
//! period ends, the release of buffered jobs that waited too long, and the give-back of a job the
//! replica abandoned because it stopped trusting its lease, or whose result an infrastructure
//! fault kept from committing ([`give_back`]), each through the fenced release
//! (`completer::release`).
//!
//! Invariants this module keeps:
//! - A release that includes a job whose owner asked to cancel it ends that job `cancelled`,
//!   including a request recorded while a commit held the job (`jobs::apply_deferred`, sent
//!   just before the release in the same round trip).
//! - Released jobs are announced on the replicas' channel once the release committed.
//! - The shutdown release is bounded by [`RELEASE_TIMEOUT`]: a replica never hangs at exit on
//!   it; leases it could not release expire and recovery returns them.
//! - A job abandoned with its lease lost is given back uncharged only while its claim is still
//!   the replica's own (the release is fenced): after an outage nobody judged (a server restart,
//!   where every judge waits out its reconnect grace) it runs again without losing an attempt;
//!   if another replica took it, nothing changes here, and the refund asks whether recovery
//!   charged this live replica (`maintain::refund`). The same holds for a job whose computed
//!   result an infrastructure fault kept from committing: never charged by this replica.

use crate::codes::Code;
use crate::db;
use crate::error::Error;
use crate::jobs;
use crate::worker::complete::completer::release::{release, RELEASE_TIMEOUT};
use crate::worker::complete::transition::Transition;
use crate::worker::lease::Lease;
use crate::worker::liveness::held::HeldJobs;
use crate::worker::shared::Shared;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

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
