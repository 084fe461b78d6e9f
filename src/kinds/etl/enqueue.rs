//! Enqueue of ETL requests: a validated [`EtlRequest`] becomes a job of kind [`KIND`] through the
//! core insert path every kind uses ([`crate::jobs::enqueue`]).
//!
//! Invariants this module keeps:
//! - Every ETL job carries the caller's idempotency key: the same key with the same
//!   (normalized) request returns the original job; with a different request it is refused with
//!   `idempotency_key_reused` (see [`crate::jobs::enqueue`] for the rest: one statement per chunk,
//!   replacement, the caller's transaction).

use crate::dead_letters::Retain;
use crate::digest::Secret;
use crate::error::Error;
use crate::jobs::enqueue::{self as core, Submission};
use crate::kinds::etl::request::EtlRequest;
use crate::kinds::etl::KIND;
use tokio_postgres::GenericClient;

pub use crate::jobs::enqueue::Enqueued;

/// Default attempt bound of an ETL job.
pub const MAX_ATTEMPTS_DEFAULT: i32 = 5;

/// One request to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    /// The client's idempotency key (1 to 255 characters); stored only as a keyed digest.
    pub idempotency_key: &'a str,
    /// The validated request.
    pub request: &'a EtlRequest,
    /// The attempt bound (1 to 100; another is refused with `ConfigError::MaxAttempts`).
    pub max_attempts: i32,
    /// Keep the request, sealed, to replay the job if it fails ([`crate::dead_letters`]).
    pub retain: Option<Retain<'a>>,
}

impl NewJob<'_> {
    /// The submission of this request: its normalized document, due time and replaced job.
    fn submission(&self) -> Submission<'_> {
        Submission {
            payload: self.request.to_value(),
            idempotency_key: Some(self.idempotency_key),
            max_attempts: self.max_attempts,
            run_at: self.request.run_at,
            replaces: self.request.replaces,
            queue: None,
            priority: 0,
            concurrency_key: None,
            dated: false,
            retain: self.retain,
        }
    }
}

/// Enqueues one request for `owner_key` on `client` (a connection or the caller's transaction).
///
/// # Errors
/// As [`enqueue_many`].
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

/// Enqueues a batch of requests for `owner_key`; returns one [`Enqueued`] per job, in order.
///
/// # Errors
/// [`Error::Rejected`] with `idempotency_key_invalid`, `idempotency_key_reused`, or `not_found`
/// / `conflict` for a `replaces` that names no job of the owner / one that ended;
/// [`Error::Config`] for an attempt bound outside 1 to 100; database errors.
pub async fn enqueue_many(
    client: &impl GenericClient,
    secret: &Secret,
    owner_key: &[u8; 32],
    jobs: &[NewJob<'_>],
) -> Result<Vec<Enqueued>, Error> {
    let submissions = jobs.iter().map(NewJob::submission).collect();
    core::submit(client, secret, owner_key, KIND, submissions).await
}
