//! Typed handlers: a [`Perform`] runs one [`Job`] kind in the two phases the fence needs, written
//! with `async fn`; [`Registry::perform`] turns it into the [`Handler`] a worker runs.
//!
//! Invariants this module keeps:
//! - [`Perform::compute`] runs with no connection held; its [`Apply`] value runs inside the
//!   fenced transaction that also records the job's success, so the effects commit with it or
//!   not at all ([`crate::job::handler`]'s contract, unchanged).
//! - A payload that does not decode as the kind's type fails the job at once with
//!   `invalid_payload`: retrying cannot change it.
//! - The [`JobContext`] that [`Apply::apply`] gets is the one [`Perform::compute`] got, shared
//!   with the job's task (an `Arc`), never copied per job.
//! - Effects that write nothing (`()`) let the worker commit the job without an explicit
//!   transaction, together with others in one statement. `()` is the only [`Apply`] type that
//!   does, read off the type (`type Effects = ()`): no `Apply` value can claim to write nothing,
//!   and every other one's [`Apply::apply`] runs inside the fenced transaction.

use super::kind::Job;
use crate::codes::Code;
use crate::job::handler::{
    Effects, EffectsSet, Handler, JobContext, JobError, NoEffects, Output, Registry,
};
use futures::future::BoxFuture;
use std::any::TypeId;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
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
    /// What the compute phase hands to the fenced transaction (`()`: nothing to write, and the
    /// job commits without the transaction; any other type's [`Apply::apply`] always runs).
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
///
/// Effects may enqueue follow-up jobs on `tx`, so that they commit with the job's success or not
/// at all; the crate's [`Error`](crate::Error) converts into [`JobError`], so one `?` is enough:
///
/// ```
/// use durable_etl::{Apply, EnqueueOptions, Job, JobContext, JobError, Jobs};
/// use tokio_postgres::Transaction;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Welcome { user_id: i64 }
/// impl Job for Welcome { const KIND: &'static str = "welcome"; }
///
/// struct Registered { jobs: Jobs, user_id: i64 }
/// impl Apply for Registered {
///     async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
///         tx.execute("INSERT INTO users (id) VALUES ($1)", &[&self.user_id]).await?;
///         let welcome = Welcome { user_id: self.user_id };
///         self.jobs.enqueue(tx, &welcome, EnqueueOptions::default()).await?;
///         Ok(())
///     }
/// }
/// ```
///
/// There is no flag to skip them: only `()` writes nothing, and a type that can write always
/// has its [`Apply::apply`] run in the transaction (a `const WRITES` of old is refused):
///
/// ```compile_fail,E0438
/// use durable_etl::{Apply, JobContext, JobError};
/// use tokio_postgres::Transaction;
///
/// struct Mark(i64);
/// impl Apply for Mark {
///     const WRITES: bool = false;
///     async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
///         tx.execute("UPDATE users SET marked = true WHERE id = $1", &[&self.0]).await?;
///         Ok(())
///     }
/// }
/// ```
pub trait Apply: Send + 'static {
    /// Writes the effects on `tx`.
    fn apply(
        self,
        tx: &Transaction<'_>,
        job: &JobContext,
    ) -> impl Future<Output = Result<(), JobError>> + Send;

    /// A copy of these effects to apply again under the same claim after an infrastructure fault
    /// rolled back their first application ([`Effects::replay`]); `None` (the default): the job
    /// is then given back uncharged and computed again. Effects that are `Clone` can return
    /// `Some(self.clone())`.
    fn replay(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Whether these effects may be applied together with other jobs' effects of this type in
    /// one batch of the group commit, through [`Apply::apply_set`]; `false` (the default): they
    /// always apply alone, through [`Apply::apply`].
    fn in_set(&self) -> bool {
        false
    }

    /// Applies the effects of several jobs of this type together on `tx` (set-based statements
    /// instead of one job at a time), each with its job, in order. Its contract: the rows
    /// written, and what each job [records](JobContext::record), must be those of applying them
    /// one by one in that order. The worker runs it under a savepoint of its own: on an error,
    /// a panic or an overrun of the smallest budget of its jobs, that savepoint is rolled back
    /// and each job applies alone, so one job's failure fails only that job. The default fails,
    /// so effects that say they join a set ([`Apply::in_set`]) without one apply alone.
    fn apply_set<'a>(
        tx: &'a Transaction<'a>,
        set: Vec<(&'a mut Self, &'a JobContext)>,
    ) -> impl Future<Output = Result<(), JobError>> + Send + 'a
    where
        Self: Sized,
    {
        let _ = (tx, set);
        async { Err(JobError::permanent(Code::HandlerFailed)) }
    }
}

impl Apply for () {
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
        job: &'a Arc<JobContext>,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            let typed: P::Job = serde_json::from_value(payload)
                .map_err(|_| JobError::permanent(Code::InvalidPayload))?;
            let effects = self.performer.compute(typed, job).await?;
            if writes_nothing::<P::Effects>() {
                return Ok(Box::new(NoEffects) as Box<dyn Effects>);
            }
            Ok(Box::new(TypedEffects {
                effects,
                job: Arc::clone(job),
            }) as Box<dyn Effects>)
        })
    }
}

/// Whether effects of type `A` write nothing: only `()` (the worker then commits the job as
/// [`NoEffects`], without the transaction).
fn writes_nothing<A: Apply>() -> bool {
    TypeId::of::<A>() == TypeId::of::<()>()
}

/// An [`Apply`] value as the untyped [`Effects`] the worker commits.
struct TypedEffects<A> {
    /// The effects.
    effects: A,
    /// The job they belong to, shared with the job's task (not copied per job).
    job: Arc<JobContext>,
}

impl<A: Apply> Effects for TypedEffects<A> {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async move {
            let TypedEffects { effects, job } = *self;
            job.forget_recorded();
            effects.apply(tx, &job).await?;
            Ok(job.take_recorded())
        })
    }

    fn set(&self) -> Option<&'static dyn EffectsSet> {
        self.effects
            .in_set()
            .then_some(&TypedSet::<A> { kind: PhantomData })
    }

    fn replay(&self) -> Option<Box<dyn Effects>> {
        let effects = self.effects.replay()?;
        let job = Arc::clone(&self.job);
        Some(Box::new(TypedEffects { effects, job }))
    }
}

/// The [`EffectsSet`] of the typed effects `A`: [`Apply::apply_set`] over the members.
struct TypedSet<A> {
    /// The effects' type.
    kind: PhantomData<fn() -> A>,
}

impl<A: Apply> EffectsSet for TypedSet<A> {
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        members: &'a mut [Box<dyn Effects>],
    ) -> BoxFuture<'a, Result<Vec<Option<Output>>, JobError>> {
        Box::pin(async move {
            // The worker sets together only effects of one type; were one not, the set fails
            // and each member applies alone.
            let mut jobs = Vec::with_capacity(members.len());
            let mut set = Vec::with_capacity(members.len());
            for member in members.iter_mut() {
                let typed = member
                    .downcast_mut::<TypedEffects<A>>()
                    .ok_or_else(|| JobError::permanent(Code::HandlerFailed))?;
                let TypedEffects { effects, job } = typed;
                job.forget_recorded();
                jobs.push(Arc::clone(job));
                set.push((effects, &**job));
            }
            A::apply_set(tx, set).await?;
            Ok(jobs.iter().map(|job| job.take_recorded()).collect())
        })
    }
}

#[cfg(test)]
#[path = "perform_tests.rs"]
mod tests;
