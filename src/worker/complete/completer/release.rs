//! The release: the fenced statement that gives a replica's unfinished jobs back to `pending`,
//! their attempt not charged ([`RELEASE_SQL`]). What runs it (the shutdown release, the
//! give-back of an abandoned job) is `complete::give_back`.
//!
//! Invariants this module keeps:
//! - Only leases still held under their claim are touched; a job whose owner asked to cancel it
//!   ends `cancelled` instead (live row deleted, outcome appended in the same statement).
//! - Only a job whose handler had started gets an attempt in its history (`released`).

use crate::worker::lease::{self, Lease};
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
