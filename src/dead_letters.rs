//! Dead letters: the jobs that ended `failed`, kept inspectable and replayable without keeping
//! their payloads in plaintext.
//!
//! A job that ends `failed` (attempts or leases exhausted, a permanent failure, an invalid
//! payload, an unknown kind) becomes a letter in the same fenced statement that records its
//! outcome and clears its payload. [`DeadLetters`] lists, counts, discards and replays them, for
//! one owner ([`crate::Jobs::dead_letters`]) or, for an operator, for all
//! ([`DeadLetters::all_owners`]).
//!
//! A replay makes one new job of the letter's kind, queue, priority and attempt bound, for the
//! letter's owner, with either
//! - the job's payload sent again by its owner, accepted only when its keyed fingerprint is the
//!   one the job stored (nothing is retained by default), or
//! - the payload retained for it, when its kind or queue opted in ([`Retention`]): sealed with
//!   an AEAD under a key derived from the deployment's secret and a key id, never in plaintext,
//!   and deleted by maintenance once its time to keep has passed.
//!
//! Invariants this module keeps:
//! - Each letter makes at most one job, however many replays of it run at once, repeat or
//!   crash: [`DeadLetters::replay`] row-locks the letter, and the job it makes carries a key
//!   derived from the letter.
//! - Every call is scoped to its handle's owner; an operator's handle sees every owner's.
//! - Only metadata is shown: queue, kind, stable code, attempts, times and ids. Never a payload,
//!   an owner or an error message.

use crate::digest::{DigestKind, Secret};
use crate::error::Error;
use tokio_postgres::GenericClient;
use uuid::Uuid;

#[macro_use]
mod letters;
mod replay;
pub mod retention;
pub mod seal;

pub use letters::{Letter, LetterCount, LetterCursor, LetterFilter, LetterPage, PAGE_MAX};
pub use replay::{BulkReplay, ReplayPreview, Replayed, REPLAYED_BY_MAX, REPLAY_CHUNK};
pub use retention::{Retain, Retention, RETAIN_TTL_DEFAULT, RETAIN_TTL_MAX};
pub use seal::{is_key_id, PayloadKey};

// The statements, for the test suite's plan checks.
#[doc(hidden)]
pub use letters::{COUNTS_SQL, DISCARD_SQL, GET_SQL, LIST_SQL};
#[doc(hidden)]
pub use replay::{ELIGIBLE_SQL, LOCK_CHUNK_SQL, LOCK_ONE_SQL, MARK_SQL, UNREPLAYABLE_SQL};

/// The dead letters one owner sees, or all owners' for an operator; with the key that opens
/// retained payloads, if the deployment retains any.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    /// The deployment's digest key (fingerprints, owners).
    secret: Secret,
    /// The owner digest calls are scoped to; `None` for an operator's handle.
    owner: Option<[u8; 32]>,
    /// The key retained payloads open under.
    key: Option<PayloadKey>,
}

impl DeadLetters {
    /// The letters of the owner whose digest is `owner`.
    pub(crate) fn of(secret: Secret, owner: [u8; 32]) -> DeadLetters {
        DeadLetters {
            secret,
            owner: Some(owner),
            key: None,
        }
    }

    /// The letters of the owner `principal` (an API key's owner name).
    pub fn for_owner(secret: Secret, principal: &str) -> DeadLetters {
        let owner = secret.digest(DigestKind::Principal, principal.as_bytes());
        DeadLetters::of(secret, owner)
    }

    /// Every owner's letters: an operator's handle.
    pub fn all_owners(secret: Secret) -> DeadLetters {
        DeadLetters {
            secret,
            owner: None,
            key: None,
        }
    }

    /// The same letters, narrowed to the owner whose digest is `owner` (for an operator's
    /// filter by owner); an owner's handle stays its own owner's.
    pub fn narrowed_to(mut self, owner: [u8; 32]) -> DeadLetters {
        if self.owner.is_none() {
            self.owner = Some(owner);
        }
        self
    }

    /// The same handle, opening retained payloads under `key` (the key they were sealed
    /// under: [`Retention::key`]).
    pub fn with_key(mut self, key: PayloadKey) -> DeadLetters {
        self.key = Some(key);
        self
    }

    /// A page of at most `size` (1 to [`PAGE_MAX`]) open letters matching `filter`, newest
    /// first, after `after` (from the newest when `None`).
    ///
    /// # Errors
    /// Database errors.
    pub async fn list(
        &self,
        client: &impl GenericClient,
        filter: &LetterFilter<'_>,
        after: Option<LetterCursor>,
        size: i64,
    ) -> Result<LetterPage, Error> {
        letters::page(client, self.owner.as_ref(), filter, after, size).await
    }

    /// The open letters matching `filter`, counted per queue and code, the largest first.
    ///
    /// # Errors
    /// Database errors.
    pub async fn counts(
        &self,
        client: &impl GenericClient,
        filter: &LetterFilter<'_>,
    ) -> Result<Vec<LetterCount>, Error> {
        letters::counts(client, self.owner.as_ref(), filter).await
    }

    /// Letter `id`, open or replayed, or `None` (none of this handle's owner).
    ///
    /// # Errors
    /// Database errors.
    pub async fn get(
        &self,
        client: &impl GenericClient,
        id: Uuid,
    ) -> Result<Option<Letter>, Error> {
        letters::get(client, self.owner.as_ref(), id).await
    }

    /// Discards open letter `id` (with its retained payload; the job's outcome stays); whether
    /// there was one to discard.
    ///
    /// # Errors
    /// Database errors.
    pub async fn discard(&self, client: &impl GenericClient, id: Uuid) -> Result<bool, Error> {
        let n = letters::discard(
            client,
            self.owner.as_ref(),
            &LetterFilter::default(),
            Some(id),
        )
        .await?;
        Ok(n > 0)
    }

    /// Discards every open letter matching `filter`; returns how many.
    ///
    /// # Errors
    /// Database errors (the letters discarded before stay discarded).
    pub async fn discard_matching(
        &self,
        client: &impl GenericClient,
        filter: &LetterFilter<'_>,
    ) -> Result<u64, Error> {
        letters::discard(client, self.owner.as_ref(), filter, None).await
    }

    /// Replays letter `id` once, as `by` asked (an API key's id, or a label of the caller's:
    /// 1 to [`REPLAYED_BY_MAX`] characters, never an owner): with `body`, the job's payload
    /// sent again, or without it from its retained payload. A letter replayed before answers
    /// the job its first replay made. Runs in a transaction of its own on `client` (a savepoint
    /// when `client` is a transaction).
    ///
    /// # Errors
    /// [`Error::Rejected`] with `not_found`, `replay_body_mismatch`, `payload_not_retained`,
    /// `payload_unreadable` or `request_invalid`; database errors. Nothing is written on an
    /// error.
    pub async fn replay(
        &self,
        client: &mut impl GenericClient,
        id: Uuid,
        by: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Replayed, Error> {
        let owner = self.owner.as_ref();
        replay::replay(client, &self.secret, self.key.as_ref(), owner, id, by, body).await
    }

    /// What [`DeadLetters::replay_matching`] would take and leave of the open letters matching
    /// `filter`, counted now (a preview to confirm a bulk replay with).
    ///
    /// # Errors
    /// [`Error::Config`] when the handle holds no key; database errors.
    pub async fn replay_preview(
        &self,
        client: &impl GenericClient,
        filter: &LetterFilter<'_>,
    ) -> Result<ReplayPreview, Error> {
        let key = self
            .key
            .as_ref()
            .ok_or(Error::Config(crate::ConfigError::PayloadKey))?;
        replay::preview(client, key, self.owner.as_ref(), filter).await
    }

    /// Replays every open letter matching `filter` whose payload is retained under this
    /// handle's key, as `by` asked, each once; says how many it made and how many it left, and
    /// why.
    ///
    /// # Errors
    /// [`Error::Config`] when the handle holds no key; `request_invalid` for a bad `by`;
    /// database errors (the letters replayed before stay replayed; run it again for the rest).
    pub async fn replay_matching(
        &self,
        client: &mut impl GenericClient,
        filter: &LetterFilter<'_>,
        by: &str,
    ) -> Result<BulkReplay, Error> {
        let key = self
            .key
            .as_ref()
            .ok_or(Error::Config(crate::ConfigError::PayloadKey))?;
        let owner = self.owner.as_ref();
        replay::replay_matching(client, &self.secret, key, owner, filter, by).await
    }
}
