//! Transactional, idempotent enqueue of ETL requests on the caller's own connection or
//! transaction.
//!
//! Invariants this module keeps:
//! - The enqueue runs on the caller's client: inside the caller's transaction, the caller's domain
//!   writes and the job commit or roll back together.
//! - Owner + idempotency key identify a request: the same key with the same (normalized) request
//!   returns the original job; with a different request it is refused with
//!   `idempotency_key_reused`. Keys, principals and requests are stored only as keyed digests
//!   (and the request itself as the job payload, cleared when the job ends).
//! - A batch is one INSERT statement, so the enqueue trigger notifies at most once, when the
//!   caller's transaction commits; not at all if that transaction ran
//!   [`crate::notifier::skip_trigger_notify`] (the caller then wakes the replicas itself, or
//!   leaves the jobs to their poll).
//! - A request that `replaces` a job cancels it (as `replaced`) before it is inserted; on the
//!   caller's transaction both commit or neither does. A replaced running job ends `cancelled`
//!   when its worker next settles it, and its effects never commit.
//! - Two concurrent submissions replacing one job under the same key answer as if they came one
//!   after the other: the loser waits for the replaced job's row lock, finds the job ended, sees
//!   the winner's key and replays it. This holds on a transaction; on a bare connection the cancel
//!   commits before the insert, and the loser may find neither the job pending nor the key
//!   (`conflict`).

use crate::codes::Code;
use crate::digest::{DigestKind, Secret};
use crate::error::Error;
use crate::etl::request::EtlRequest;
use crate::etl::KIND;
use crate::intake::Rejection;
use crate::jobs::{self, Cancel};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Default attempt bound of an ETL job.
pub const MAX_ATTEMPTS_DEFAULT: i32 = 5;

/// One request to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    /// The client's idempotency key (1 to 255 characters); stored only as a keyed digest.
    pub idempotency_key: &'a str,
    /// The validated request.
    pub request: &'a EtlRequest,
    /// The attempt bound (1 to 100).
    pub max_attempts: i32,
}

/// What an enqueue did for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id.
    pub id: Uuid,
    /// Whether the job existed already (an idempotent replay).
    pub replayed: bool,
}

/// Inserts the jobs of one batch in one statement, skipping any whose owner + idempotency key
/// exists already: each new job's intake row and its live (`pending`) row with the payload.
/// `$1..$6` and `$9` are parallel arrays; `$7` is the owner digest, `$8` the kind. A `run_at` in
/// the past (or none) becomes `now()`: a job cannot be dated before the jobs already due, jump
/// ahead of them, or skew the enqueue-to-start latency.
///
/// Locks: inserts new rows (and their unique-index entries). A concurrent insert of the same
/// owner + key waits for the other transaction, then is skipped if it committed; only the intake
/// rows actually inserted get a live row. The live table's statement-level trigger notifies
/// once, and only if a due job was inserted.
pub const INSERT_SQL: &str = "
WITH batch AS (
    SELECT b.*, greatest(b.run_at_asked, now()) AS run_at
      FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::jsonb[], $5::int4[],
                  $6::timestamptz[], $9::uuid[])
           AS b(id, key_digest, fingerprint, payload, max_attempts, run_at_asked, replaces)
), accepted AS (
    INSERT INTO etl_job_intake
           (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts, run_at,
            replaces_job_id)
    SELECT id, $7, key_digest, fingerprint, $8, max_attempts, run_at, replaces FROM batch
        ON CONFLICT (owner_key, idempotency_key_digest) DO NOTHING
    RETURNING id
)
INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
SELECT b.id, $7, $8, b.payload, b.max_attempts, b.run_at
  FROM batch b JOIN accepted a ON a.id = b.id
RETURNING id";

/// The existing jobs of an owner (`$1`) for idempotency key digests (`$2`).
///
/// Locks: none (a read through the intake's idempotency unique index).
pub const EXISTING_SQL: &str = "
SELECT idempotency_key_digest, id, request_fingerprint
  FROM etl_job_intake
 WHERE owner_key = $1 AND idempotency_key_digest = ANY($2)";

/// Enqueues one request for `owner_key` on `client` (a connection or the caller's transaction).
/// The enqueue trigger wakes the replicas when the transaction commits, unless the transaction
/// opted out with [`crate::notifier::skip_trigger_notify`].
///
/// # Errors
/// [`Error::Rejected`] with `idempotency_key_invalid` or `idempotency_key_reused`; database errors.
pub async fn enqueue(
    client: &impl GenericClient,
    secret: &Secret,
    owner_key: &[u8; 32],
    job: NewJob<'_>,
) -> Result<Enqueued, Error> {
    let done = enqueue_many(client, secret, owner_key, &[job]).await?;
    // `enqueue_many` answers once per job it was given: here, exactly once.
    done.into_iter().next().ok_or(Error::Internal)
}

/// Enqueues a batch for `owner_key` in one INSERT; returns one [`Enqueued`] per job, in order.
/// If any job reuses a key with a different request, nothing is returned but the error (the
/// caller's transaction should be rolled back; on a bare connection the new jobs stay).
///
/// # Errors
/// [`Error::Rejected`] with `idempotency_key_invalid` or `idempotency_key_reused`; database errors.
pub async fn enqueue_many(
    client: &impl GenericClient,
    secret: &Secret,
    owner_key: &[u8; 32],
    jobs: &[NewJob<'_>],
) -> Result<Vec<Enqueued>, Error> {
    let mut ids = Vec::with_capacity(jobs.len());
    let mut key_digests = Vec::with_capacity(jobs.len());
    let mut fingerprints = Vec::with_capacity(jobs.len());
    let mut payloads = Vec::with_capacity(jobs.len());
    let mut max_attempts = Vec::with_capacity(jobs.len());
    let mut run_ats: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(jobs.len());
    let mut replaces: Vec<Option<Uuid>> = Vec::with_capacity(jobs.len());
    for job in jobs {
        if !(1..=255).contains(&job.idempotency_key.chars().count()) {
            return Err(Rejection::new(Code::IdempotencyKeyInvalid, "").into());
        }
        let payload = job.request.to_value();
        ids.push(Uuid::now_v7());
        key_digests.push(
            secret
                .digest(DigestKind::IdempotencyKey, job.idempotency_key.as_bytes())
                .to_vec(),
        );
        fingerprints.push(fingerprint(secret, &payload).to_vec());
        payloads.push(payload);
        max_attempts.push(job.max_attempts.clamp(1, 100));
        run_ats.push(job.request.run_at);
        replaces.push(job.request.replaces);
    }
    let owner: &[u8] = owner_key;
    replace_olds(client, owner_key, &key_digests, &replaces).await?;
    let inserted: Vec<Uuid> = client
        .query_typed(
            INSERT_SQL,
            &[
                (&ids, Type::UUID_ARRAY),
                (&key_digests, Type::BYTEA_ARRAY),
                (&fingerprints, Type::BYTEA_ARRAY),
                (&payloads, Type::JSONB_ARRAY),
                (&max_attempts, Type::INT4_ARRAY),
                (&run_ats, Type::TIMESTAMPTZ_ARRAY),
                (&owner, Type::BYTEA),
                (&KIND, Type::TEXT),
                (&replaces, Type::UUID_ARRAY),
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let existing: HashMap<Vec<u8>, (Uuid, Vec<u8>)> = if inserted.len() == jobs.len() {
        HashMap::new()
    } else {
        client
            .query_typed(
                EXISTING_SQL,
                &[(&owner, Type::BYTEA), (&key_digests, Type::BYTEA_ARRAY)],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    };
    let mut out = Vec::with_capacity(jobs.len());
    for i in 0..jobs.len() {
        if inserted.contains(&ids[i]) {
            out.push(Enqueued {
                id: ids[i],
                replayed: false,
            });
            continue;
        }
        match existing.get(&key_digests[i]) {
            Some((id, stored)) if *stored == fingerprints[i] => {
                out.push(Enqueued {
                    id: *id,
                    replayed: true,
                });
            }
            _ => return Err(Rejection::new(Code::IdempotencyKeyReused, "").into()),
        }
    }
    Ok(out)
}

/// Cancels (as `replaced`) the jobs the batch replaces, unless the replacing job exists already
/// (an idempotent replay replaces nothing again). Atomic with the insert when the caller passes a
/// transaction.
async fn replace_olds(
    client: &impl GenericClient,
    owner_key: &[u8; 32],
    key_digests: &[Vec<u8>],
    replaces: &[Option<Uuid>],
) -> Result<(), Error> {
    for (digest, old) in key_digests.iter().zip(replaces) {
        let Some(old) = *old else { continue };
        if key_exists(client, owner_key, digest).await? {
            continue;
        }
        match jobs::cancel(client, owner_key, old, Code::Replaced).await? {
            Cancel::Cancelled | Cancel::Requested => {}
            Cancel::NotFound => return Err(Rejection::new(Code::NotFound, "/replaces").into()),
            // Lost the race to a concurrent submission with the same key, which replaced the job
            // and committed while this cancel waited for its row lock: the insert then replays
            // it (or refuses a different request), as if it had come first.
            Cancel::AlreadyEnded(_) if key_exists(client, owner_key, digest).await? => {}
            Cancel::AlreadyEnded(_) => {
                return Err(Rejection::new(Code::Conflict, "/replaces").into())
            }
        }
    }
    Ok(())
}

/// Whether owner `owner_key` has a job under the idempotency key digest `digest` (committed, or
/// inserted earlier in the caller's transaction).
async fn key_exists(
    client: &impl GenericClient,
    owner_key: &[u8; 32],
    digest: &[u8],
) -> Result<bool, Error> {
    let owner: &[u8] = owner_key;
    let digests: &[&[u8]] = &[digest];
    let found = client
        .query_typed_opt(
            EXISTING_SQL,
            &[(&owner, Type::BYTEA), (&digests, Type::BYTEA_ARRAY)],
        )
        .await?;
    Ok(found.is_some())
}

/// The keyed fingerprint of a normalized request document (object keys sorted).
pub fn fingerprint(secret: &Secret, payload: &serde_json::Value) -> [u8; 32] {
    secret.digest(DigestKind::Request, payload.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::fingerprint;
    use crate::digest::Secret;

    #[test]
    fn fingerprints_ignore_member_order() {
        let secret = Secret::new("0123456789abcdef").unwrap();
        let a: serde_json::Value =
            serde_json::from_str(r#"{"a": 1, "b": {"x": 1, "y": 2}}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{"b": {"y": 2, "x": 1}, "a": 1}"#).unwrap();
        assert_eq!(fingerprint(&secret, &a), fingerprint(&secret, &b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a": 2}"#).unwrap();
        assert_ne!(fingerprint(&secret, &a), fingerprint(&secret, &c));
    }
}
