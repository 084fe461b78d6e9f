//! Typed handlers: a [`Perform`] runs one [`Job`] kind in the two phases the fence needs, written
//! with `async fn`; [`Registry::perform`] turns it into the [`Handler`] a worker runs.
//!
//! Invariants this module keeps:
//! - [`Perform::compute`] runs with no connection held; its [`Apply`] value runs inside the
//!   fenced transaction that also records the job's success, so the effects commit with it or
//!   not at all ([`crate::handler`]'s contract, unchanged).
//! - A payload that does not decode as the kind's type fails the job at once with
//!   `invalid_payload`: retrying cannot change it.
//! - Effects that write nothing (`()`) let the worker commit the job without an explicit
//!   transaction, together with others in one statement.

use super::kind::Job;
use crate::codes::Code;
use crate::handler::{Effects, Handler, JobContext, JobError, LedgerEntry, Registry};
use futures::future::BoxFuture;
use std::future::Future;
use std::marker::PhantomData;
use tokio_postgres::Transaction;

/// What a job kind does: compute from the typed job with no connection held, then hand back the
/// effects to apply inside the fenced transaction.
///
/// Implement it with `async fn`:
///
/// ```
/// use durable_etl::{Apply, Job, JobContext, JobError, Perform};
/// use tokio_postgres::Transaction;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Resize { image: i64 }
/// impl Job for Resize { const KIND: &'static str = "resize"; }
///
/// struct Thumbnail(i64, Vec<u8>);
/// impl Apply for Thumbnail {
///     async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
///         tx.execute("UPDATE images SET thumbnail = $2 WHERE id = $1", &[&self.0, &self.1]).await?;
///         Ok(())
///     }
/// }
///
/// struct Resizer;
/// impl Perform for Resizer {
///     type Job = Resize;
///     type Effects = Thumbnail;
///     async fn compute(&self, job: Resize, _ctx: &JobContext) -> Result<Thumbnail, JobError> {
///         Ok(Thumbnail(job.image, vec![0; 16]))
///     }
/// }
/// ```
pub trait Perform: Send + Sync + 'static {
    /// The kind this performs.
    type Job: Job;
    /// What the compute phase hands to the fenced transaction (`()`: nothing to write).
    type Effects: Apply;

    /// Computes the job's effects from its typed payload, holding no database connection. A
    /// [`JobError::Transient`] is retried within the job's attempt bound; a
    /// [`JobError::Permanent`] ends it `failed` with its code at once.
    fn compute(
        &self,
        job: Self::Job,
        ctx: &JobContext,
    ) -> impl Future<Output = Result<Self::Effects, JobError>> + Send;
}

/// The writes of one attempt, applied inside the fenced transaction that also records the job's
/// success: they commit together or not at all, and never after another claim took the job.
pub trait Apply: Send + 'static {
    /// Whether [`Apply::apply`] writes anything (`false` lets the worker commit the job without
    /// an explicit transaction). Defaults to `true`.
    const WRITES: bool = true;

    /// Writes the effects on `tx`.
    fn apply(
        self,
        tx: &Transaction<'_>,
        job: &JobContext,
    ) -> impl Future<Output = Result<(), JobError>> + Send;
}

impl Apply for () {
    const WRITES: bool = false;

    async fn apply(self, _tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

impl Registry {
    /// Adds the typed handler `performer` for its job kind ([`Job::KIND`]), replacing any
    /// handler of the same kind.
    pub fn perform<P: Perform>(self, performer: P) -> Registry {
        self.register(Typed {
            performer,
            kind: PhantomData,
        })
    }
}

/// A [`Perform`] as the untyped [`Handler`] the worker runs.
struct Typed<P: Perform> {
    /// The typed handler.
    performer: P,
    /// The kind it performs.
    kind: PhantomData<fn() -> P::Job>,
}

impl<P: Perform> Handler for Typed<P> {
    fn kind(&self) -> &'static str {
        <P::Job as Job>::KIND
    }

    fn execution_timeout(&self) -> Option<std::time::Duration> {
        <P::Job as Job>::EXECUTION_TIMEOUT
    }

    fn codes(&self) -> &'static [&'static str] {
        <P::Job as Job>::CODES
    }

    fn retry_delay(&self, attempt: i32) -> Option<std::time::Duration> {
        <P::Job as Job>::retry_delay(attempt)
    }

    fn prepare<'a>(
        &'a self,
        job: &'a JobContext,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            let typed: P::Job = serde_json::from_value(payload)
                .map_err(|_| JobError::permanent(Code::InvalidPayload))?;
            let effects = self.performer.compute(typed, job).await?;
            Ok(Box::new(TypedEffects {
                effects,
                job: job.clone(),
            }) as Box<dyn Effects>)
        })
    }
}

/// An [`Apply`] value as the untyped [`Effects`] the worker commits.
struct TypedEffects<A> {
    /// The effects.
    effects: A,
    /// The job they belong to.
    job: JobContext,
}

impl<A: Apply> Effects for TypedEffects<A> {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<LedgerEntry>, JobError>> {
        Box::pin(async move {
            let TypedEffects { effects, job } = *self;
            effects.apply(tx, &job).await?;
            Ok(None)
        })
    }

    fn writes(&self) -> bool {
        A::WRITES
    }
}
