//! What a user does with jobs: [`Jobs`] enqueues a typed [`Job`] on the caller's own
//! transaction (or connection) and reads, lists and cancels jobs by id, all scoped to an owner.
//!
//! Invariants this module keeps:
//! - Payloads are typed end to end: what [`Jobs::enqueue`] stores is the job serialized by
//!   `serde`, and what a [`crate::Perform`] gets is that document decoded as the same type.
//! - The caller never computes a digest or names an internal table: owners (principals) and
//!   idempotency keys are digested here under the deployment's secret, and only the digests are
//!   stored ([`crate::digest`]).
//! - Every read and control call is owner-scoped: a job of another owner is indistinguishable
//!   from one that does not exist (`view`, `cancel`).
//! - Enqueue inherits `enqueue`'s guarantees: atomic with the caller's transaction, durable
//!   dedup by owner + idempotency key for the job's whole life, one statement per chunk.
//! - Cancellation (`cancel`) is decided under the job's row lock: a pending job ends `cancelled`
//!   at once (payload cleared); a running job gets a cancel request that its fenced commit
//!   honours; a terminal job is left alone. A request on the job's row and a commit can never
//!   both win; an owner's cancel never waits for a commit that holds the row, and says so
//!   ([`Cancel::Deferred`]: recorded, the job may still succeed).

use crate::codes::Code;
use crate::dead_letters::{DeadLetters, Retention};
use crate::digest::{DigestKind, Secret};
use crate::error::Error;
use crate::intake::Rejection;
use crate::job::Job;
use backend::{Backend, Pg};
use chrono::{DateTime, Utc};
use enqueue::Submission;
use tokio_postgres::GenericClient;
use uuid::Uuid;

mod backend;
#[doc(hidden)]
pub mod cancel;
#[doc(hidden)]
pub mod enqueue;
#[doc(hidden)]
pub mod history;
#[doc(hidden)]
pub mod notifier;
pub mod state;
#[doc(hidden)]
pub mod view;

pub use cancel::Cancel;
pub use enqueue::Enqueued;
pub use history::{AttemptEnding, Attempts, LastAttempt, PastAttempt};
pub use state::JobState;
pub use view::{JobFailure, JobStatus, Page, Window};

// The statements and owner-scoped calls under [`Jobs`], for the service and the test suite.
#[doc(hidden)]
pub use cancel::{
    apply_deferred, await_deferred, cancel, Applied, APPLY_DEFERRED_SQL, AWAIT_DEFERRED_SQL,
    CANCEL_NOWAIT_SQL, CANCEL_SQL,
};
#[doc(hidden)]
pub use history::{
    attempts, last_attempt, past_attempts, replaced_by, ATTEMPTS_SQL, LAST_ATTEMPT_SQL,
    REPLACED_BY_SQL,
};
#[doc(hidden)]
pub use view::{list, page, status, LIST_ENDED_SQL, LIST_LIVE_SQL, LIST_SQL, STATUS_SQL};

/// How one job is enqueued; every field may be left out.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnqueueOptions<'a> {
    /// When the job is due (UTC); `None` or a past instant means now.
    pub run_at: Option<DateTime<Utc>>,
    /// The attempt bound (1 to 100: another is refused with [`crate::ConfigError::MaxAttempts`]);
    /// `None` is the kind's [`Job::MAX_ATTEMPTS`].
    pub max_attempts: Option<i32>,
    /// An idempotency key (1 to 255 characters): a second enqueue of the same owner with the same
    /// key returns the existing job, whatever state it is in; with a different payload it is
    /// refused (`idempotency_key_reused`). Stored only as a keyed digest.
    pub idempotency_key: Option<&'a str>,
    /// A job of the same owner this one replaces: it is cancelled (`replaced`) in the same
    /// transaction; if it is running, its effects never commit.
    pub replaces: Option<Uuid>,
    /// The owner (a principal, digested here); `None` is the [`Jobs`] handle's owner.
    pub owner: Option<&'a str>,
    /// The queue the job waits in; `None` is the kind's [`Job::QUEUE`].
    pub queue: Option<&'a str>,
    /// The job's priority within its queue (0, the most urgent, to 9; see [`crate::queue`]);
    /// `None` is the kind's [`Job::PRIORITY`].
    pub priority: Option<i16>,
    /// The job's concurrency key (1 to 255 bytes, e.g. a customer's id): in a queue with a key
    /// cap ([`crate::queue::set_key_cap`]), at most that many jobs of one key run at once, across
    /// all replicas. `None`: the job counts against no key. Stored on the job's live row only;
    /// never logged, labelled or shown.
    pub concurrency_key: Option<&'a str>,
}

/// Enqueues, reads and controls jobs of any kind for one owner: the library's front door.
///
/// Cheap to clone; [`Jobs::for_owner`] gives the same handle for another owner.
#[derive(Debug, Clone)]
pub struct Jobs {
    /// The deployment's digest key.
    secret: Secret,
    /// The digest of the owner calls act for.
    owner: [u8; 32],
    /// Which jobs keep their payloads, sealed, for a replay (none by default).
    retention: Option<std::sync::Arc<Retention>>,
}

impl Jobs {
    /// A handle that digests under `secret` and acts for `owner` (a principal: the name an API
    /// key of the HTTP API maps to, so the jobs show there too), unless a call names another.
    pub fn new(secret: Secret, owner: &str) -> Jobs {
        let owner = secret.digest(DigestKind::Principal, owner.as_bytes());
        Jobs {
            secret,
            owner,
            retention: None,
        }
    }

    /// The same handle, keeping the payloads of the jobs `retention` names, sealed, so that
    /// their dead letters can be replayed without the body ([`crate::dead_letters`]).
    pub fn retaining(mut self, retention: Retention) -> Jobs {
        self.retention = Some(std::sync::Arc::new(retention));
        self
    }

    /// The dead letters of this handle's owner, opening retained payloads under the handle's
    /// retention key, if it has one.
    pub fn dead_letters(&self) -> DeadLetters {
        let letters = DeadLetters::of(self.secret.clone(), self.owner);
        match &self.retention {
            Some(retention) => letters.with_key(retention.key().clone()),
            None => letters,
        }
    }

    /// The schedules of this handle's owner ([`crate::schedule`]).
    pub fn schedules(&self) -> crate::schedule::Schedules {
        crate::schedule::Schedules::of(self.owner)
    }

    /// This handle, acting for `owner` instead.
    pub fn for_owner(&self, owner: &str) -> Jobs {
        Jobs {
            retention: self.retention.clone(),
            ..Jobs::new(self.secret.clone(), owner)
        }
    }

    /// The owner digest calls act for (what [`crate::job::handler::JobContext::owner_key`] shows).
    pub fn owner_key(&self) -> [u8; 32] {
        self.owner
    }

    /// Enqueues `job` on `client`: the caller's transaction (the job commits or rolls back with
    /// the caller's writes) or a connection. One round trip, unless `options.replaces` is set.
    /// The replicas wake when the transaction commits.
    ///
    /// # Errors
    /// [`Error::Config`] when the kind's name, or the queue's, is not one the schema stores
    /// ([`crate::job::handler::is_kind_name`]), the priority is outside
    /// [`crate::queue::PRIORITY_RANGE`] or the attempt bound outside
    /// [`enqueue::MAX_ATTEMPTS_RANGE`]; [`Error::Rejected`] with `idempotency_key_invalid`,
    /// `idempotency_key_reused`, `invalid_payload` (the job does not serialize as a JSON
    /// document), or `not_found` /
    /// `conflict` for a `replaces` that names no job of the owner / one that ended; database
    /// errors.
    pub async fn enqueue<J: Job>(
        &self,
        client: &impl GenericClient,
        job: &J,
        options: EnqueueOptions<'_>,
    ) -> Result<Enqueued, Error> {
        let done = self.enqueue_many_with(client, [(job, options)]).await?;
        done.into_iter().next().ok_or(Error::Internal)
    }

    /// Enqueues `jobs` with the default options on `client`, one statement per chunk of
    /// [`enqueue::CHUNK`] jobs; returns their ids, in order.
    ///
    /// # Errors
    /// As [`Jobs::enqueue`].
    pub async fn enqueue_many<'j, J: Job>(
        &self,
        client: &impl GenericClient,
        jobs: impl IntoIterator<Item = &'j J>,
    ) -> Result<Vec<Uuid>, Error> {
        let jobs = jobs.into_iter().map(|j| (j, EnqueueOptions::default()));
        let done = self.enqueue_many_with(client, jobs).await?;
        Ok(done.into_iter().map(|e| e.id).collect())
    }

    /// Enqueues `jobs`, each with its options, on `client`: one statement per chunk of
    /// [`enqueue::CHUNK`] jobs of one owner; returns one [`Enqueued`] per job, in order.
    ///
    /// # Errors
    /// As [`Jobs::enqueue`].
    pub async fn enqueue_many_with<'j, J: Job>(
        &self,
        client: &impl GenericClient,
        jobs: impl IntoIterator<Item = (&'j J, EnqueueOptions<'_>)>,
    ) -> Result<Vec<Enqueued>, Error> {
        self.submit(&mut Pg(client.client()), jobs).await
    }

    /// [`Jobs::enqueue`] on a sqlx connection, or a sqlx transaction through it (`&mut *tx`):
    /// the job commits or rolls back with the caller's transaction, with the same options,
    /// checks and dedup.
    ///
    /// # Errors
    /// As [`Jobs::enqueue`]; a sqlx database error is [`Error::Sqlx`].
    #[cfg(feature = "sqlx")]
    pub async fn enqueue_sqlx<J: Job>(
        &self,
        conn: &mut sqlx::PgConnection,
        job: &J,
        options: EnqueueOptions<'_>,
    ) -> Result<Enqueued, Error> {
        let done = self.enqueue_many_sqlx(conn, [(job, options)]).await?;
        done.into_iter().next().ok_or(Error::Internal)
    }

    /// [`Jobs::enqueue_many_with`] on a sqlx connection or transaction (`&mut *tx`).
    ///
    /// # Errors
    /// As [`Jobs::enqueue`]; a sqlx database error is [`Error::Sqlx`].
    #[cfg(feature = "sqlx")]
    pub async fn enqueue_many_sqlx<'j, J: Job>(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: impl IntoIterator<Item = (&'j J, EnqueueOptions<'_>)>,
    ) -> Result<Vec<Enqueued>, Error> {
        self.submit(&mut crate::jobs::backend::Sqlx(conn), jobs)
            .await
    }

    /// [`Jobs::cancel`] on a sqlx connection or transaction (`&mut *tx`).
    ///
    /// # Errors
    /// As [`Jobs::cancel`]; a sqlx database error is [`Error::Sqlx`].
    #[cfg(feature = "sqlx")]
    pub async fn cancel_sqlx(
        &self,
        conn: &mut sqlx::PgConnection,
        id: Uuid,
    ) -> Result<Cancel, Error> {
        let mut conn = crate::jobs::backend::Sqlx(conn);
        cancel::cancel_on(&mut conn, &self.owner, id, Code::Cancelled).await
    }

    /// Enqueues `jobs` on `client`, one statement per chunk of each run of one owner.
    async fn submit<'j, J: Job>(
        &self,
        client: &mut impl Backend,
        jobs: impl IntoIterator<Item = (&'j J, EnqueueOptions<'_>)>,
    ) -> Result<Vec<Enqueued>, Error> {
        if !crate::job::handler::is_kind_name(J::KIND) {
            return Err(Error::Config(crate::ConfigError::KindName));
        }
        // Runs of consecutive jobs of one owner go in one call; most batches are one run.
        let mut runs: Vec<([u8; 32], Vec<Submission<'_>>)> = Vec::new();
        for (job, options) in jobs {
            let owner = options.owner.map_or(self.owner, |o| {
                self.secret.digest(DigestKind::Principal, o.as_bytes())
            });
            let queue = options.queue.unwrap_or(J::QUEUE);
            let submission = Submission {
                payload: serde_json::to_value(job)
                    .map_err(|_| Error::from(Rejection::new(Code::InvalidPayload, "")))?,
                idempotency_key: options.idempotency_key,
                max_attempts: options.max_attempts.unwrap_or(J::MAX_ATTEMPTS),
                run_at: options.run_at,
                replaces: options.replaces,
                queue: Some(queue),
                priority: options.priority.unwrap_or(J::PRIORITY),
                concurrency_key: options.concurrency_key,
                dated: false,
                retain: self.retention.as_ref().and_then(|r| r.of(J::KIND, queue)),
            };
            match runs.last_mut() {
                Some((last, run)) if *last == owner => run.push(submission),
                _ => runs.push((owner, vec![submission])),
            }
        }
        let mut out = Vec::new();
        for (owner, run) in runs {
            out.extend(enqueue::submit_on(client, &self.secret, &owner, J::KIND, run).await?);
        }
        Ok(out)
    }

    /// The status of job `id`, if this handle's owner has it.
    ///
    /// # Errors
    /// Database errors.
    pub async fn status(
        &self,
        client: &impl GenericClient,
        id: Uuid,
    ) -> Result<Option<JobStatus>, Error> {
        view::status(client, &self.owner, id).await
    }

    /// The attempts of job `id` of this handle's owner that ended: those that did not end it
    /// (retried, recovered, released), oldest first, and the one that ended it `failed`, each
    /// with its diagnosis ([`crate::job::Diagnosis`]: the phase, the retry decision, the
    /// duration, the error's type names, the kind's declared detail; never a message). Empty for
    /// another owner's job.
    ///
    /// # Errors
    /// Database errors.
    pub async fn attempts(&self, client: &impl GenericClient, id: Uuid) -> Result<Attempts, Error> {
        history::attempts(client, &self.owner, id).await
    }

    /// Cancels job `id` of this handle's owner: a pending job ends `cancelled` at once; a
    /// running one ends `cancelled` when its worker settles it, and its effects never commit;
    /// a running one whose commit holds it (its effects being applied) is answered at once with
    /// [`Cancel::Deferred`]: recorded, and it may still succeed (see [`await_deferred`]).
    ///
    /// # Errors
    /// Database errors; [`Error::Contended`] when claims kept taking the job (nothing written).
    pub async fn cancel(&self, client: &impl GenericClient, id: Uuid) -> Result<Cancel, Error> {
        cancel::cancel(client, &self.owner, id, Code::Cancelled).await
    }

    /// A page of at most `size` of this handle's owner's jobs in `window` (of any kind), newest
    /// first, only those in `status` if given, and where the next page starts.
    ///
    /// # Errors
    /// Database errors.
    pub async fn list(
        &self,
        client: &impl GenericClient,
        window: Window,
        status: Option<crate::jobs::state::JobState>,
        size: i64,
    ) -> Result<Page, Error> {
        let status = status.map(crate::jobs::state::JobState::as_str);
        view::page(client, &self.owner, window, status, size).await
    }
}
