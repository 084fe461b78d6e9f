//! Handlers for lifecycle tests: each drives one branch of the executor.

use durable_etl::codes::Code;
use durable_etl::job::handler::{Effects, Handler, JobContext, JobError, NoEffects, Output};
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_postgres::Transaction;

/// Kind of [`Noop`].
pub const NOOP: &str = "test.noop";
/// Kind of [`Scripted`].
pub const SCRIPTED: &str = "test.scripted";

/// Does nothing and succeeds.
pub struct Noop;

impl Handler for Noop {
    fn kind(&self) -> &'static str {
        NOOP
    }
    fn prepare<'a>(
        &'a self,
        _job: &'a Arc<JobContext>,
        _payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async { Ok(Box::new(NoEffects) as Box<dyn Effects>) })
    }
}

/// Writes one target row keyed by the job id, then does what `then` says inside the transaction.
struct WriteRow {
    /// The job.
    job: Arc<JobContext>,
    /// `ok`, `transient`, `permanent` or `panic`: what to do after writing the row.
    then: String,
}

impl Effects for WriteRow {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        if self.then == "panic_at_call" {
            panic!("effects panicked before returning their future");
        }
        Box::pin(async move {
            tx.execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES ($1::bytea, 'tests', $2, '{}'::jsonb, $3)",
                &[&self.job.owner_key, &self.job.id.to_string(), &self.job.id],
            )
            .await?;
            match self.then.as_str() {
                "transient" => Err(JobError::transient("effects failed after writing")),
                "permanent" => Err(JobError::permanent(Code::HandlerFailed)),
                "constraint" => {
                    // A deterministic database error: a CHECK violation.
                    tx.execute(
                        "UPDATE etl_target_rows SET dataset = 'BAD' WHERE written_by_job = $1",
                        &[&self.job.id],
                    )
                    .await?;
                    Ok(None)
                }
                "lock_timeout" => {
                    tx.batch_execute("LOCK TABLE etl_api_clients IN ACCESS SHARE MODE NOWAIT")
                        .await?;
                    Ok(None)
                }
                "panic" => panic!("effects panicked"),
                "hang" => std::future::pending().await,
                _ => Ok(Some(serde_json::json!({ "rows_inserted": 1 }))),
            }
        })
    }
}

/// Effects that write nothing and panic when dropped: handler code that runs in the commit lane,
/// when [`Effects::apply`] consumes them.
struct Panicky;

impl Effects for Panicky {
    fn apply<'a>(
        self: Box<Self>,
        _tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async { Ok(None) })
    }
}

impl Drop for Panicky {
    fn drop(&mut self) {
        panic!("effects panicked when dropped");
    }
}

/// Acts on its payload's `"do"`: `ok`, `write`, `transient`, `permanent`, `record_invalid`,
/// `panic`, `hang`, `write_then_<transient|permanent|panic|constraint|lock_timeout>`,
/// `panic_at_call` (prepare panics before returning its future), `apply_panics_at_call` (so do
/// the effects' apply) or `drop_panics` (effects that panic when dropped). Counts its prepares,
/// and waits for a permit from `gate` first when it has one.
#[derive(Clone, Default)]
pub struct Scripted {
    /// How many times `prepare` ran.
    pub prepares: Arc<AtomicUsize>,
    /// When set, each prepare takes (and keeps) one permit before acting.
    pub gate: Option<Arc<Semaphore>>,
}

impl Scripted {
    /// A handler whose jobs each wait for a permit of the returned gate before acting.
    pub fn gated() -> (Arc<Semaphore>, Scripted) {
        let gate = Arc::new(Semaphore::new(0));
        let scripted = Scripted {
            gate: Some(Arc::clone(&gate)),
            ..Scripted::default()
        };
        (gate, scripted)
    }
}

impl Handler for Scripted {
    fn kind(&self) -> &'static str {
        SCRIPTED
    }
    fn prepare<'a>(
        &'a self,
        job: &'a Arc<JobContext>,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        if payload["do"] == "panic_at_call" {
            self.prepares.fetch_add(1, Ordering::SeqCst);
            panic!("handler panicked before returning its future");
        }
        Box::pin(async move {
            self.prepares.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            let action = payload["do"].as_str().unwrap_or("ok").to_owned();
            match action.as_str() {
                "ok" => Ok(Box::new(NoEffects) as Box<dyn Effects>),
                "write" => Ok(Box::new(WriteRow {
                    job: Arc::clone(job),
                    then: "ok".into(),
                }) as Box<dyn Effects>),
                "transient" => Err(JobError::transient("remote busy")),
                "permanent" => Err(JobError::permanent(Code::HandlerFailed)),
                "record_invalid" => Err(JobError::record_invalid(3)),
                "panic" => panic!("handler panicked"),
                "hang" => std::future::pending().await,
                "apply_panics_at_call" => Ok(Box::new(WriteRow {
                    job: Arc::clone(job),
                    then: "panic_at_call".into(),
                }) as Box<dyn Effects>),
                "drop_panics" => Ok(Box::new(Panicky) as Box<dyn Effects>),
                other => {
                    let then = other.strip_prefix("write_then_").unwrap_or("ok").to_owned();
                    Ok(Box::new(WriteRow {
                        job: Arc::clone(job),
                        then,
                    }) as Box<dyn Effects>)
                }
            }
        })
    }
}
