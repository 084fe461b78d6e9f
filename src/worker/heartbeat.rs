//! Heartbeats: one statement per replica per interval renews the leases of every job it runs.
//!
//! Invariants this module keeps:
//! - A heartbeat renews only rows still `running` under this owner AND one of the claim ids the
//!   replica holds; it never revives a lease another claim or recovery has taken.
//! - A claim the heartbeat reports as no longer held is lost: the caller abandons that job locally.
//! - A heartbeat re-stamps `lease_owner_locked` from the session's real lock state, and
//!   `lease_renewed_at`, the evidence recovery needs before it takes a lock-less owner for dead.
//! - A heartbeat never waits on a row lock: a row locked by this replica's own executor (committing
//!   right now) is reported as held but not renewed, and its commit settles it.

use crate::worker::lease::millis;
use std::collections::HashMap;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Renews the leases of owner `$1`'s claims `$2` by `$3` ms, stamps whether the owner holds its
/// owner lock right now (`$4`), and returns the claims still held, each with whether it was
/// renewed (a held row that this replica's own commit has locked is not).
///
/// Locks: `held` is a plain snapshot read (no lock). `renew` row-locks the held rows with
/// `SKIP LOCKED`, so a row an executor is committing is skipped instead of waited for. The UPDATE
/// changes only lease columns that no index covers, so it is a HOT update.
pub const HEARTBEAT_SQL: &str = "
WITH held AS (
    SELECT id, lease_claim_id
      FROM etl_job_records
     WHERE lease_owner_id = $1 AND status = 'running' AND lease_claim_id = ANY($2)
),
renew AS (
    SELECT j.id
      FROM etl_job_records j JOIN held h ON h.id = j.id
     WHERE j.lease_claim_id = h.lease_claim_id AND j.status = 'running'
       FOR UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE etl_job_records j
       SET lease_expires_at = now() + $3 * interval '1 millisecond',
           lease_renewed_at = now(),
           lease_owner_locked = $4
      FROM renew
     WHERE j.id = renew.id
 RETURNING j.id
)
SELECT h.lease_claim_id, EXISTS (SELECT 1 FROM renewed r WHERE r.id = h.id) FROM held h";

/// Renews `claims` for `owner_id`, stamping `owner_locked`; returns the subset still held by
/// this replica, each with whether its lease was renewed now.
///
/// # Errors
/// The database error of the statement.
pub async fn beat(
    client: &impl GenericClient,
    owner_id: &str,
    claims: &[Uuid],
    lease: Duration,
    owner_locked: bool,
) -> Result<HashMap<Uuid, bool>, tokio_postgres::Error> {
    if claims.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = client
        .query_typed(
            HEARTBEAT_SQL,
            &[
                (&owner_id, Type::TEXT),
                (&claims, Type::UUID_ARRAY),
                (&millis(lease), Type::INT8),
                (&owner_locked, Type::BOOL),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
