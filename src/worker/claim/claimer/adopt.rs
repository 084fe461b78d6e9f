//! Adoption: the jobs a claim took whose reply never reached the replica. A claim is one
//! statement that commits on the server; when the connection is lost after the server ran it and
//! before its rows came back (a cut of every connection, a proxy restart, a statement bound), its
//! rows are `running` under this replica's owner id and fresh claim ids it never saw. Nothing
//! renews them, and the replica beats, so before adoption they waited out their whole lease and
//! were then recovered, charged.
//!
//! Invariants this module keeps:
//! - After a claim that failed, the replica's next statement on its claim sessions adopts, and
//!   nothing else: it takes into its slots every `running` row of its owner id that this
//!   incarnation claimed (started at or after its start-up, [`Orphans::since`]) under a claim id
//!   it neither holds nor is giving back, renewing each lease. Only then does it claim again, so
//!   no claim is ever sent while another's rows may be unaccounted for, and the jobs adopted
//!   never exceed the room the failed claim asked for.
//! - Adoption never changes a claim: the claim id, the fencing token and the attempt stay the
//!   ones the lost claim wrote, so every fence holds as if its reply had arrived; an adopted job is
//!   charged nothing more.
//! - A previous incarnation's rows are never adopted (they started before this one's start-up:
//!   released then, or left to their leases when a silent holder may still run them), nor a claim
//!   this replica abandoned and is giving back ([`Orphans::giving_back`]).
//! - The statement never waits: it skips rows another session holds (a rescuer that took them).

use super::rows::claimed_job;
use crate::worker::lease::{millis, ClaimedJob};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Renews and returns the `running` rows of owner `$1` claimed at or after `$2` under a claim
/// id not in `$3`, with a lease of `$4` ms; each row as a claim's (see `rows`), the ask's
/// position 1, and the job's queue last.
///
/// Locks: walks the small `status = 'running'` partial index and row-locks the candidates with
/// `SKIP LOCKED`; the UPDATE changes only lease columns that no index covers (a HOT update).
pub const ADOPT_SQL: &str = "
WITH orphan AS (
    SELECT j.id
      FROM etl_job_records j
     WHERE j.status = 'running' AND j.lease_owner_id = $1 AND j.started_at >= $2
       AND NOT (j.lease_claim_id = ANY($3))
       FOR UPDATE OF j SKIP LOCKED
)
UPDATE etl_job_records AS j
   SET lease_expires_at = now() + $4 * interval '1 millisecond',
       lease_renewed_at = now()
  FROM orphan o
 WHERE j.id = o.id
RETURNING j.id, j.kind, j.request_payload, j.attempts, j.max_attempts, j.lease_claim_id,
          j.owner_key, greatest(extract(epoch FROM j.started_at - j.run_at), 0)::float8,
          j.fencing_token, j.run_at, 1::int8,
          j.permit_slot IS NOT NULL
              OR EXISTS (SELECT 1 FROM etl_key_permits k WHERE k.claim_id = j.lease_claim_id),
          j.queue";

/// What adoption needs to tell this incarnation's lost claims from everything else.
#[derive(Debug)]
pub(crate) struct Orphans {
    /// The database's time once the start-up released the previous incarnation's rows: every
    /// row this incarnation claims starts at or after it.
    since: SystemTime,
    /// The claims this replica abandoned and is giving back (`complete::give_back`).
    giving_back: Mutex<HashSet<Uuid>>,
}

impl Orphans {
    /// Adoption for an incarnation that started claiming at `since` (the database's clock).
    pub(crate) fn new(since: SystemTime) -> Orphans {
        Orphans {
            since,
            giving_back: Mutex::default(),
        }
    }

    /// The database's time once the start-up released the previous incarnation's rows.
    pub(crate) fn since(&self) -> SystemTime {
        self.since
    }

    /// The set, locked (each operation is one set call, so a panic left it consistent).
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<Uuid>> {
        self.giving_back
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `claim` is being given back: adoption leaves it alone until [`Orphans::given_back`].
    pub(crate) fn giving_back(&self, claim: Uuid) {
        self.set().insert(claim);
    }

    /// The give-back of `claim` is over (done, or left to the lease).
    pub(crate) fn given_back(&self, claim: Uuid) {
        self.set().remove(&claim);
    }

    /// The claims adoption must leave alone: `held`, and those being given back.
    fn known(&self, held: Vec<Uuid>) -> Vec<Uuid> {
        let mut known = held;
        known.extend(self.set().iter().copied());
        known
    }
}

/// Adopts, for `owner_id` with `lease`, the rows of its lost claims (see [`ADOPT_SQL`]), leaving
/// `held` and the claims `orphans` says are being given back; returns each job with its queue.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn adopt(
    client: &impl GenericClient,
    owner_id: &str,
    orphans: &Orphans,
    held: Vec<Uuid>,
    lease: Duration,
) -> Result<Vec<(ClaimedJob, String)>, tokio_postgres::Error> {
    let known = orphans.known(held);
    let rows = client
        .query_typed(
            ADOPT_SQL,
            &[
                (&owner_id, Type::TEXT),
                (&orphans.since, Type::TIMESTAMPTZ),
                (&known, Type::UUID_ARRAY),
                (&millis(lease), Type::INT8),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let mut job = claimed_job(row);
            let queue: String = row.get(12);
            job.queue = Arc::from(queue.as_str());
            (job, queue)
        })
        .collect())
}
