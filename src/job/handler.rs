//! The handler contract: what a job kind does, split into a compute phase that holds no database
//! connection and an effects phase that runs inside the fenced execution transaction.
//!
//! Invariants this module keeps:
//! - [`Handler::prepare`] runs with no transaction and no pooled connection held, so a slow
//!   computation can never starve the pool or hold a row lock.
//! - [`Effects::apply`] runs inside the one transaction that also re-checks the lease, writes the
//!   kind's recorded output and sets `succeeded`: its writes commit with them or not at all.
//! - Effects are skipped only when their type is [`NoEffects`], which writes nothing: whether
//!   effects write is read off their type, never asked of them, so no implementation of
//!   [`Effects`] can have its `apply` dropped by claiming to write nothing.
//! - Effects whose kind offers an [`EffectsSet`] ([`Effects::set`]) may be applied together with
//!   other jobs' effects of the same type, in set-based statements, with the same results as one
//!   by one; the default is none, so every other kind's effects apply alone, under their own
//!   savepoint, as before.
//! - A handler decides retryability by the [`JobError`] it returns; database errors are classified
//!   by SQLSTATE (see [`crate::error::is_transient`]). Errors keep their source for the caller but
//!   only their [`Code`] and their diagnosis (`job::diagnosis`: the names of their source's
//!   types, never its text, and the kind's declared detail) ever leave the process.

use crate::codes::Code;
#[cfg(doc)]
use crate::job::diagnosis::Diagnosis;
use crate::job::diagnosis::{probed_chain, Chain, Described, Detail};
use crate::names::is_identifier;
pub use crate::names::is_kind_name;
use futures::future::BoxFuture;
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Transaction;
use uuid::Uuid;

/// A boxed error source kept for programmatic inspection (never logged or stored: a diagnosis
/// keeps only the names of its types).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a handler learns about the job it runs: one per claim, shared (an [`Arc`]) by the job's
/// task, its handler and its effects, never copied per job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobContext {
    /// The job's id.
    pub id: Uuid,
    /// The job's kind (the handler's [`Handler::kind`]).
    pub kind: String,
    /// The id of this claim: unique per claim, and what this crate's own fences compare. It is
    /// random, so it says nothing about which of two claims is newer: give external systems
    /// [`JobContext::fencing_token`] instead.
    pub lease_claim_id: Uuid,
    /// The fencing token of this claim: it grows with every claim of this job and never
    /// decreases, not even when a shutdown gives the attempt back. Pass it, with the job id, to
    /// an external system that can refuse a write carrying a token lower than the highest it has
    /// seen for the job: a replica that stalled past its lease then cannot overwrite the work of
    /// the attempt that replaced it.
    pub fencing_token: i64,
    /// Which attempt this is, from 1.
    pub attempt: i32,
    /// The job's attempt bound.
    pub max_attempts: i32,
    /// The owner digest of the job (never the raw principal).
    pub owner_key: Vec<u8>,
    /// When this attempt was due: the job's `run_at`, or its retry's.
    pub run_at: chrono::DateTime<chrono::Utc>,
    /// Fires when the replica stops trusting this claim's lease, before recovery may give the
    /// job to another replica (see [`LeaseLost`]).
    pub lease_lost: LeaseLost,
    /// What the job's effects recorded ([`JobContext::record`]); start it empty
    /// (`Default::default()`).
    pub recorded: Recorded,
}

impl JobContext {
    /// Records `output` as what this job's kind keeps of its success: one JSON document, stored
    /// with the job's outcome only if its effects commit, and shown as its `result` (the ETL
    /// kind records its ledger of rows written). Call it from [`crate::Apply::apply`] (or
    /// [`crate::Apply::apply_set`]); the last call wins. It must hold nothing a status reader
    /// may not see: no payload value, no secret.
    ///
    /// # Errors
    /// [`Code::HandlerFailed`] (permanent) if `output` does not serialize to JSON.
    pub fn record(&self, output: impl serde::Serialize) -> Result<(), JobError> {
        let value =
            serde_json::to_value(output).map_err(|_| JobError::permanent(Code::HandlerFailed))?;
        *self.recorded.slot() = Some(value);
        Ok(())
    }

    /// Empties what the job's effects recorded, before they apply (again).
    pub(crate) fn forget_recorded(&self) {
        *self.recorded.slot() = None;
    }

    /// What the job's effects recorded, taken out.
    pub(crate) fn take_recorded(&self) -> Option<Output> {
        self.recorded.slot().take()
    }
}

/// The slot of what a job's effects recorded ([`JobContext::record`]); shared by the clones of
/// one context.
#[derive(Debug, Clone, Default)]
pub struct Recorded(Arc<std::sync::Mutex<Option<Output>>>);

impl Recorded {
    /// What has been recorded so far, if anything.
    pub fn get(&self) -> Option<Output> {
        self.slot().clone()
    }

    /// The slot, locked (a panic while it was held left nothing half-written: a store is one
    /// assignment).
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Output>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PartialEq for Recorded {
    fn eq(&self, other: &Recorded) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.slot() == *other.slot()
    }
}

impl Eq for Recorded {}

/// What a kind's effects record with its success (the ETL kind: its ledger of rows written and
/// the data's checksum): one JSON document, stored on the job's outcome and shown as its
/// `result`. It must hold no payload value a status reader may not see.
pub type Output = serde_json::Value;

/// Why an attempt failed, as the handler sees it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// Worth retrying (a remote system was busy, say): back to `pending` with a growing delay,
    /// until the job's `max_attempts` is spent.
    #[error("transient failure")]
    Transient(#[source] BoxError),
    /// Worth retrying after `after` (a remote system said when): back to `pending`, due then
    /// (at most [`RETRY_AFTER_MAX`]), until the job's `max_attempts` is spent.
    #[error("transient failure, retry later")]
    RetryAfter {
        /// When to try again, from now.
        after: Duration,
        /// What went wrong (never stored or logged).
        #[source]
        source: BoxError,
    },
    /// Never worth retrying: the job ends `failed` with `code` at once.
    #[error("permanent failure: {code}")]
    Permanent {
        /// The stored failure code: one of the stored codes of [`Code`].
        code: Code,
        /// The index of the first bad record, for [`Code::RecordInvalid`].
        record_index: Option<i32>,
        /// What went wrong (never stored or logged).
        #[source]
        source: Option<BoxError>,
    },
    /// Never worth retrying, for a reason of the kind's own: the job ends `failed` with `code`,
    /// one of the codes the kind declares ([`Handler::codes`]); an undeclared code is stored as
    /// `handler_failed`.
    #[error("permanent failure of the kind: {code}")]
    KindFailure {
        /// A code the kind declares.
        code: &'static str,
        /// What went wrong (never stored or logged).
        #[source]
        source: Option<BoxError>,
    },
    /// A database error inside the effects; transient or permanent by its SQLSTATE.
    #[error("database error in effects")]
    Database(#[from] tokio_postgres::Error),
}

impl JobError {
    /// A transient failure with this source. The name of the source's type is kept for the
    /// attempt's diagnosis (never its message): see [`Diagnosis`].
    pub fn transient<E: Into<BoxError>>(source: E) -> JobError {
        JobError::Transient(Box::new(Described::of(source)))
    }

    /// A transient failure to retry after `after` (at most [`RETRY_AFTER_MAX`]), whatever the
    /// kind's or the replica's retry policy says. The name of the source's type is kept for the
    /// attempt's diagnosis, as by [`JobError::transient`].
    pub fn retry_after<E: Into<BoxError>>(after: Duration, source: E) -> JobError {
        JobError::RetryAfter {
            after,
            source: Box::new(Described::of(source)),
        }
    }

    /// A permanent failure with a stored code (`handler_failed` if `code` is not a stored code).
    pub fn permanent(code: Code) -> JobError {
        let code = if code.is_stored_failure() {
            code
        } else {
            Code::HandlerFailed
        };
        JobError::Permanent {
            code,
            record_index: None,
            source: None,
        }
    }

    /// A permanent failure with `code`, one of the codes the job's kind declares
    /// ([`Handler::codes`], `Job::CODES`): stored as it is, and shown by the job's status.
    pub fn failed(code: &'static str) -> JobError {
        JobError::KindFailure { code, source: None }
    }

    /// A permanent `record_invalid` failure naming the first bad record by index.
    pub fn record_invalid(index: usize) -> JobError {
        JobError::Permanent {
            code: Code::RecordInvalid,
            record_index: Some(i32::try_from(index).unwrap_or(i32::MAX)),
            source: None,
        }
    }

    /// This failure with `source` as its source (a permanent or a kind's failure has none until
    /// given one; a transient one's is replaced), its type's name kept for the attempt's
    /// diagnosis as by [`JobError::transient`], and any detail declared before kept. A
    /// database error ([`JobError::Database`]) keeps its own.
    ///
    /// ```
    /// use durable_etl::{Code, JobError};
    ///
    /// let bad: Result<u32, _> = "x".parse::<u32>();
    /// let error = JobError::permanent(Code::HandlerFailed).with_source(bad.unwrap_err());
    /// # drop(error);
    /// ```
    #[must_use]
    pub fn with_source<E: Into<BoxError>>(self, source: E) -> JobError {
        let mut given = Described::of(source);
        let detail = self.described().and_then(|d| d.detail().cloned());
        if let Some(detail) = detail {
            given = given.with_detail(detail);
        }
        self.replace_source(Box::new(given))
    }

    /// This failure carrying `detail`, the structured detail its kind declares (integers,
    /// booleans and `&'static str` tags only: see [`Detail`]), stored in the attempt's
    /// diagnosis; replaces any detail given before. A database error
    /// ([`JobError::Database`]) carries none.
    #[must_use]
    pub fn with_detail(mut self, detail: Detail) -> JobError {
        let source = match &mut self {
            JobError::Transient(source) | JobError::RetryAfter { source, .. } => Some(
                std::mem::replace(source, Box::new(Described::detail_only(Detail::new()))),
            ),
            JobError::Permanent { source, .. } | JobError::KindFailure { source, .. } => {
                source.take()
            }
            JobError::Database(_) => return self,
        };
        let described = match source {
            Some(source) => Box::new(Described::from_box(source).with_detail(detail)),
            None => Box::new(Described::detail_only(detail)),
        };
        self.replace_source(described)
    }

    /// The error the handler gave as this failure's source, as it gave it (its `source()` chain
    /// is this error's), if any: the database error of [`JobError::Database`].
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        if let JobError::Database(e) = self {
            return Some(e);
        }
        let source = self.source_box()?;
        match source.downcast_ref::<Described>() {
            Some(described) => described.inner(),
            None => Some(source.as_ref()),
        }
    }

    /// The chain a diagnosis names for this failure: its source's type and the types of that
    /// source's sources (see [`Diagnosis`]); empty when it has no source.
    pub(crate) fn chain(&self) -> Chain {
        match self {
            JobError::Database(e) => probed_chain(e),
            _ => match self.source_box() {
                None => Chain::default(),
                Some(source) => match source.downcast_ref::<Described>() {
                    Some(described) => described.chain(),
                    None => probed_chain(source.as_ref()),
                },
            },
        }
    }

    /// The detail the kind declared with this failure ([`JobError::with_detail`]).
    pub(crate) fn detail(&self) -> Option<&Detail> {
        self.described()?.detail()
    }

    /// The source as its constructors keep it, if it is kept that way.
    fn described(&self) -> Option<&Described> {
        self.source_box()?.downcast_ref::<Described>()
    }

    /// The boxed source of every variant but [`JobError::Database`].
    fn source_box(&self) -> Option<&BoxError> {
        match self {
            JobError::Transient(source) | JobError::RetryAfter { source, .. } => Some(source),
            JobError::Permanent { source, .. } | JobError::KindFailure { source, .. } => {
                source.as_ref()
            }
            JobError::Database(_) => None,
        }
    }

    /// This failure with its source set to `given` (not for [`JobError::Database`], which keeps
    /// its own).
    fn replace_source(mut self, given: Box<Described>) -> JobError {
        match &mut self {
            JobError::Transient(source) | JobError::RetryAfter { source, .. } => *source = given,
            JobError::Permanent { source, .. } | JobError::KindFailure { source, .. } => {
                *source = Some(given);
            }
            JobError::Database(_) => {}
        }
        self
    }
}

impl From<crate::error::Error> for JobError {
    /// An error of this crate's own calls inside a handler, such as an effects' enqueue of a
    /// follow-up job ([`crate::Jobs::enqueue`] on the fenced transaction), so that `?` is
    /// enough: a database error keeps its SQLSTATE's verdict ([`JobError::Database`]); a lost
    /// connection or a contended job is transient; anything else (a refused enqueue, an option
    /// out of its bounds) is permanent, stored as `handler_failed`. The error is kept as the
    /// source only, never stored or logged: no database text reaches a stored code.
    fn from(e: crate::error::Error) -> JobError {
        use crate::error::Error;
        match e {
            Error::Database(db) | Error::Unavailable(Some(db)) => JobError::Database(db),
            e if matches!(
                e.code(),
                Code::TransientDatabase | Code::DatabaseUnavailable
            ) =>
            {
                JobError::transient(e)
            }
            e => JobError::Permanent {
                code: Code::HandlerFailed,
                record_index: None,
                source: Some(Box::new(Described::of(e))),
            },
        }
    }
}

/// The longest retry delay a kind or a handler's [`JobError::RetryAfter`] may ask for (a
/// week): every delay stays finite, and inside what a timestamp can hold.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// Whether `code` may be a kind's own failure code: a lower-case identifier (`[a-z][a-z0-9_]*`,
/// at most 63 characters; unlike a kind's name, no `.`) that is not one of the crate's codes, so
/// it can never be mistaken for one.
pub fn is_kind_code(code: &str) -> bool {
    is_identifier(code, &[]) && Code::parse(code).is_none()
}

/// The writes a prepared job makes, applied inside the fenced execution transaction. Every
/// implementation's [`Effects::apply`] runs there; only [`NoEffects`] skips it (see
/// [`writes`](#method.writes)). Implementations are `'static`, as the boxed effects a handler
/// returns are.
///
/// No implementation can claim to write nothing (a `fn writes` of old is refused):
///
/// ```compile_fail,E0407
/// use durable_etl::job::handler::{Effects, Output};
/// use durable_etl::JobError;
/// use futures::future::BoxFuture;
/// use tokio_postgres::Transaction;
///
/// struct Mark(i64);
/// impl Effects for Mark {
///     fn apply<'a>(
///         self: Box<Self>,
///         tx: &'a Transaction<'a>,
///     ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
///         Box::pin(async move {
///             tx.execute("UPDATE users SET marked = true WHERE id = $1", &[&self.0]).await?;
///             Ok(None)
///         })
///     }
///     fn writes(&self) -> bool {
///         false
///     }
/// }
/// ```
pub trait Effects: Send + sealed::Typed {
    /// Writes the job's effects on `tx` and returns what the kind records of them, if anything.
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>>;

    /// How several jobs' effects of this type apply together in one batch of the group commit
    /// (set-based statements instead of one job at a time), or `None` (the default): these
    /// effects then always apply alone, through [`Effects::apply`], under their own savepoint.
    /// The jobs of a batch whose effects are of one type and answer `Some` form one set, applied
    /// through the set the first of them returned.
    fn set(&self) -> Option<&'static dyn EffectsSet> {
        None
    }

    /// A copy of these effects for the worker to apply again, under the same claim, after an
    /// infrastructure fault (a lost connection, a terminated backend, a failover, a statement
    /// bound) rolled back the transaction they applied in; `None` (the default): the job is then
    /// given back, its attempt not charged, and computed again.
    fn replay(&self) -> Option<Box<dyn Effects>> {
        None
    }
}

/// Applies the effects of several jobs of one type (the type whose [`Effects::set`] returned
/// it) together, inside the fenced execution transaction of a group commit.
///
/// Its contract: each member's output must be the one its own [`Effects::apply`] would have
/// returned had the members applied one by one, in the order given, and the rows written the
/// same. The worker runs it under a savepoint of its own: on an error (or a panic, or an
/// overrun of the smallest budget of its members) that savepoint is rolled back, whatever the
/// set wrote with it, and each member then applies alone, under its own savepoint, so one
/// member's failure still fails only that member.
pub trait EffectsSet: Send + Sync {
    /// Applies every member on `tx` (reading each through `<dyn Effects>::downcast_ref`; lent
    /// mutably only so that the future is `Send` without effects being `Sync`: a set changes no
    /// member); returns one output per member, in order.
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        members: &'a mut [Box<dyn Effects>],
    ) -> BoxFuture<'a, Result<Vec<Option<Output>>, JobError>>;
}

impl dyn Effects {
    /// Whether these effects need the execution transaction: `false` only for [`NoEffects`],
    /// which writes nothing, so the worker commits its job together with others in one
    /// statement without applying it. Read off the effects' type, not asked of them: no other
    /// implementation can opt out, and its [`Effects::apply`] always runs.
    pub fn writes(&self) -> bool {
        sealed::Typed::type_of(self) != TypeId::of::<NoEffects>()
    }

    /// The type of these effects: only effects of one type are applied together as a set.
    pub(crate) fn effects_type(&self) -> TypeId {
        sealed::Typed::type_of(self)
    }

    /// These effects as a `T`, if they are one (an [`EffectsSet`] reads its members this way).
    pub fn downcast_ref<T: Effects + 'static>(&self) -> Option<&T> {
        sealed::Typed::as_any(self).downcast_ref()
    }

    /// These effects as a mutable `T`, if they are one.
    pub(crate) fn downcast_mut<T: Effects + 'static>(&mut self) -> Option<&mut T> {
        sealed::Typed::as_any_mut(self).downcast_mut()
    }
}

/// What this crate reads off the type of a value, which no other crate can implement.
mod sealed {
    use std::any::{Any, TypeId};

    /// The type of a value (whether it is [`super::NoEffects`], which effects form one set):
    /// implemented once, for every `'static` type, so no implementation of [`super::Effects`]
    /// can answer for itself. Public only so it can bound the public trait; its module is
    /// private, so no other crate can name it.
    #[allow(unreachable_pub)]
    pub trait Typed {
        /// The type of `self`.
        fn type_of(&self) -> TypeId;

        /// `self`, to downcast.
        fn as_any(&self) -> &dyn Any;

        /// `self`, to downcast mutably.
        fn as_any_mut(&mut self) -> &mut dyn Any;
    }

    impl<T: 'static> Typed for T {
        fn type_of(&self) -> TypeId {
            TypeId::of::<T>()
        }

        fn as_any(&self) -> &dyn Any {
            self
        }

        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }
}

/// Effects that write nothing (a job whose work happens outside PostgreSQL, or a no-op): the
/// only effects the worker commits without the execution transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEffects;

impl Effects for NoEffects {
    fn apply<'a>(
        self: Box<Self>,
        _tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async { Ok(None) })
    }
    fn replay(&self) -> Option<Box<dyn Effects>> {
        Some(Box::new(NoEffects))
    }
}

/// The built-in kind that does nothing: every replica runs it, so a deployment can be smoke-tested
/// and benchmarked without side effects.
pub const NOOP_KIND: &str = "noop";

/// The longest pause a [`NOOP_KIND`] job's payload may ask for (an hour); a longer one pauses
/// this long.
pub const NOOP_PAUSE_MAX: Duration = Duration::from_secs(3600);

/// The handler of [`NOOP_KIND`]: writes nothing. Its compute phase first waits the payload's
/// `pause_ms` milliseconds, if it has that member (at most [`NOOP_PAUSE_MAX`]), holding no
/// connection, so that a test or a bench can catch a job computing (a crash, a restart). A
/// payload whose `fail` member is `true` then fails the job permanently (`handler_failed`, with
/// an I/O error as its source and the detail `asked = true`), so a deployment's dead-letter path
/// and a bench of failing jobs need no kind of their own; every other payload is ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

impl Handler for Noop {
    fn kind(&self) -> &'static str {
        NOOP_KIND
    }

    fn prepare<'a>(
        &'a self,
        _job: &'a Arc<JobContext>,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        let pause = payload
            .get("pause_ms")
            .and_then(serde_json::Value::as_u64)
            .map_or(Duration::ZERO, |ms| {
                Duration::from_millis(ms).min(NOOP_PAUSE_MAX)
            });
        let fail = payload.get("fail") == Some(&serde_json::Value::Bool(true));
        Box::pin(async move {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if fail {
                return Err(JobError::permanent(Code::HandlerFailed)
                    .with_source(std::io::Error::other("the noop job was asked to fail"))
                    .with_detail(Detail::new().field("asked", true)));
            }
            Ok(Box::new(NoEffects) as Box<dyn Effects>)
        })
    }
}

/// A job kind's behaviour.
pub trait Handler: Send + Sync + 'static {
    /// The job kind this handler runs (matches `etl_job_records.kind`).
    fn kind(&self) -> &'static str;

    /// Computes the job's effects from its payload, holding no database connection. `job` is
    /// shared: effects that need it when they apply keep a clone of the [`Arc`] (a reference
    /// count), never a copy of the context.
    fn prepare<'a>(
        &'a self,
        job: &'a Arc<JobContext>,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>>;

    /// How long one attempt's compute phase may take, and then its effects (each phase its
    /// own budget); `None` (the default) is the replica's execution timeout.
    fn execution_timeout(&self) -> Option<Duration> {
        None
    }

    /// The failure codes of the kind's own ([`JobError::failed`]): each a lower-case
    /// identifier (`[a-z][a-z0-9_]*`, at most 63 characters) that is not one of the crate's
    /// codes. Stored and shown as they are; metrics count them as `handler_failed`.
    fn codes(&self) -> &'static [&'static str] {
        &[]
    }

    /// The delay before retrying a job of this kind after its failed attempt `attempt` (from
    /// 1), at most [`RETRY_AFTER_MAX`]; `None` (the default) is the replica's policy (its retry
    /// delays, growing with jitter).
    fn retry_delay(&self, _attempt: i32) -> Option<Duration> {
        None
    }
}

/// The handlers a worker runs, by kind.
#[derive(Clone, Default)]
pub struct Registry {
    /// Handlers by kind.
    handlers: HashMap<&'static str, Arc<dyn Handler>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("kinds", &self.kinds())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds `handler` for its kind, replacing any handler of the same kind.
    pub fn register(mut self, handler: impl Handler) -> Registry {
        self.handlers.insert(handler.kind(), Arc::new(handler));
        self
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut kinds: Vec<_> = self.handlers.keys().copied().collect();
        kinds.sort_unstable();
        kinds
    }

    /// Checks that every registered kind's name is one the schema stores ([`is_kind_name`]).
    ///
    /// # Errors
    /// [`crate::ConfigError::KindName`] for the first that is not.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.handlers.keys().all(|kind| is_kind_name(kind)) {
            Ok(())
        } else {
            Err(crate::ConfigError::KindName)
        }
    }

    /// The handler of `kind`, if one is registered.
    pub fn get(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(kind).cloned()
    }
}

mod lease_lost;
pub use lease_lost::LeaseLost;

#[cfg(test)]
mod tests;
