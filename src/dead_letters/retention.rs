//! Which jobs keep their payload, sealed, for a replay: a [`Retention`] policy names kinds and
//! queues, the key that seals and how long a payload is kept after its job fails.
//!
//! Invariants this module keeps:
//! - Nothing is retained unless a policy names the job's kind or queue: the default keeps no
//!   payload, and every terminal transition still clears the live row's.
//! - A kept payload's life is bounded: [`RETAIN_TTL_MAX`] at most after its job failed, however
//!   the policy is set. Maintenance ([`prune`]) deletes it once its time has passed, and at
//!   once when its job ended other than `failed` (nothing is left to replay).

use crate::dead_letters::seal::PayloadKey;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// The most retained payloads one [`prune`] deletes.
pub const PRUNE_BATCH: i64 = 1_000;

/// Deletes up to `$1` retained payloads whose job ended other than `failed`, or failed longer
/// ago than its time to keep (`ttl_s`).
///
/// Locks: row-locks the payloads it deletes, skipping those another transaction holds (`SKIP
/// LOCKED`): a payload a replay or a discard is deleting is left to it.
pub const PRUNE_SQL: &str = "
WITH expired AS (
    SELECT r.job_id
      FROM etl_retained_payloads r
      JOIN etl_job_outcomes o ON o.job_id = r.job_id
     WHERE o.status <> 'failed' OR o.finished_at + r.ttl_s * interval '1 second' <= now()
     LIMIT $1
       FOR UPDATE OF r SKIP LOCKED
)
DELETE FROM etl_retained_payloads r USING expired e WHERE r.job_id = e.job_id";

/// Deletes the retained payloads that are no longer kept ([`PRUNE_SQL`], at most
/// [`PRUNE_BATCH`]); returns how many.
///
/// # Errors
/// The database error of the statement.
pub async fn prune(client: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(PRUNE_SQL, &[(&PRUNE_BATCH, Type::INT8)])
        .await
}

/// How long a retained payload is kept after its job failed, unless a policy says otherwise:
/// seven days.
pub const RETAIN_TTL_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);

pub use crate::config::RETAIN_TTL_MAX;

/// One job's retention, as its enqueue sees it: the key that seals its payload, and how long it
/// is kept after the job fails.
#[derive(Debug, Clone, Copy)]
pub struct Retain<'a> {
    /// The key that seals the payload.
    pub key: &'a PayloadKey,
    /// How long the sealed payload is kept after the job fails.
    pub ttl: Duration,
}

impl Retain<'_> {
    /// The time to keep, in whole seconds, within 1 second and [`RETAIN_TTL_MAX`].
    pub(crate) fn ttl_seconds(&self) -> i32 {
        let secs = self.ttl.as_secs().clamp(1, RETAIN_TTL_MAX.as_secs());
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// Which kinds and queues keep their jobs' payloads, sealed under one key, for how long.
#[derive(Debug, Clone)]
pub struct Retention {
    /// The key that seals.
    key: PayloadKey,
    /// How long a payload is kept after its job fails.
    ttl: Duration,
    /// The kinds whose jobs keep theirs.
    kinds: Vec<String>,
    /// The queues whose jobs keep theirs.
    queues: Vec<String>,
}

impl Retention {
    /// A policy that seals under `key`, keeps payloads [`RETAIN_TTL_DEFAULT`], and names no
    /// kind or queue yet.
    pub fn new(key: PayloadKey) -> Retention {
        Retention {
            key,
            ttl: RETAIN_TTL_DEFAULT,
            kinds: Vec::new(),
            queues: Vec::new(),
        }
    }

    /// Keeps payloads `ttl` after their job fails (at most [`RETAIN_TTL_MAX`]).
    pub fn ttl(mut self, ttl: Duration) -> Retention {
        self.ttl = ttl.min(RETAIN_TTL_MAX);
        self
    }

    /// Also keeps the payloads of the jobs of `kind`.
    pub fn kind(mut self, kind: &str) -> Retention {
        self.kinds.push(kind.to_owned());
        self
    }

    /// Also keeps the payloads of the jobs that wait in `queue`.
    pub fn queue(mut self, queue: &str) -> Retention {
        self.queues.push(queue.to_owned());
        self
    }

    /// The key that seals.
    pub fn key(&self) -> &PayloadKey {
        &self.key
    }

    /// The retention of a job of `kind` in `queue`, if the policy names either.
    pub fn of(&self, kind: &str, queue: &str) -> Option<Retain<'_>> {
        let named = self.kinds.iter().any(|k| k == kind) || self.queues.iter().any(|q| q == queue);
        named.then_some(Retain {
            key: &self.key,
            ttl: self.ttl,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Secret;

    #[test]
    fn a_policy_names_kinds_and_queues_and_bounds_its_ttl() {
        let key = PayloadKey::derive(&Secret::new("0123456789abcdef").unwrap(), "k1").unwrap();
        let policy = Retention::new(key).kind("mail").queue("billing");
        assert!(policy.of("etl", "default").is_none());
        let by_kind = policy.of("mail", "default").unwrap();
        assert_eq!(by_kind.ttl, RETAIN_TTL_DEFAULT);
        assert_eq!(by_kind.ttl_seconds(), 7 * 24 * 3600);
        assert!(policy.of("etl", "billing").is_some());
        assert_eq!(policy.key().id(), "k1");
        let long = policy.clone().ttl(Duration::from_secs(u64::MAX));
        assert_eq!(long.of("mail", "x").unwrap().ttl, RETAIN_TTL_MAX);
        let short = policy.ttl(Duration::from_millis(10));
        assert_eq!(short.of("mail", "x").unwrap().ttl_seconds(), 1);
    }
}
