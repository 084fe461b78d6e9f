//! Heartbeats: one statement per replica per interval renews the leases of every job it runs.
//!
//! Invariants this module keeps:
//! - A heartbeat renews only rows still `running` under this owner AND one of the claim ids the
//!   replica holds; it never revives a lease another claim or recovery has taken.
//! - A claim the heartbeat reports as no longer held is lost: the caller abandons that job locally.
//! - A heartbeat never waits on a row lock: a row locked by this replica's own executor (committing
//!   right now) is reported as held but not renewed, and its commit settles it.

use crate::worker::lease::millis;
use std::collections::HashSet;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Renews the leases of owner `$1`'s claims `$2` by `$3` ms and returns the claims still held.
///
/// Locks: `held` is a plain snapshot read (no lock). `renew` row-locks the held rows with
/// `SKIP LOCKED`, so a row an executor is committing is skipped instead of waited for. The UPDATE
/// changes only `lease_expires_at`, which no index covers, so it is a HOT update.
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
       SET lease_expires_at = now() + $3 * interval '1 millisecond'
      FROM renew
     WHERE j.id = renew.id
)
SELECT lease_claim_id FROM held";

/// Renews `claims` for `owner_id`; returns the subset still held by this replica.
///
/// # Errors
/// The database error of the statement.
pub async fn beat(
    client: &impl GenericClient,
    owner_id: &str,
    claims: &[Uuid],
    lease: Duration,
) -> Result<HashSet<Uuid>, tokio_postgres::Error> {
    if claims.is_empty() {
        return Ok(HashSet::new());
    }
    let rows = client
        .query_typed(
            HEARTBEAT_SQL,
            &[
                (&owner_id, Type::TEXT),
                (&claims, Type::UUID_ARRAY),
                (&millis(lease), Type::INT8),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
