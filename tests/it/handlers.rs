//! Handlers for lifecycle tests: each drives one branch of the executor.

use durable_etl::codes::Code;
use durable_etl::handler::{Effects, Handler, JobContext, JobError, LedgerEntry, NoEffects};
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
        _job: &'a JobContext,
        _payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async { Ok(Box::new(NoEffects) as Box<dyn Effects>) })
    }
}

/// Writes one target row keyed by the job id, then does what `then` says inside the transaction.
struct WriteRow {
    /// The job.
    job: JobContext,
    /// `ok`, `transient`, `permanent` or `panic`: what to do after writing the row.
    then: String,
}

impl Effects for WriteRow {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<LedgerEntry, JobError>> {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES ($1, 'tests', $2, '{}'::jsonb, $3)",
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
                    Ok(LedgerEntry::default())
                }
                "lock_timeout" => {
                    tx.batch_execute("LOCK TABLE etl_api_clients IN ACCESS SHARE MODE NOWAIT")
                        .await?;
                    Ok(LedgerEntry::default())
                }
                "panic" => panic!("effects panicked"),
                "hang" => std::future::pending().await,
                _ => Ok(LedgerEntry {
                    rows_inserted: 1,
                    ..LedgerEntry::default()
                }),
            }
        })
    }
}

/// Acts on its payload's `"do"`: `ok`, `write`, `transient`, `permanent`, `record_invalid`,
/// `panic`, `hang`, or `write_then_<transient|permanent|panic|constraint|lock_timeout>`. Counts
/// its prepares, and waits for a permit from `gate` first when it has one.
#[derive(Clone, Default)]
pub struct Scripted {
    /// How many times `prepare` ran.
    pub prepares: Arc<AtomicUsize>,
    /// When set, each prepare takes (and keeps) one permit before acting.
    pub gate: Option<Arc<Semaphore>>,
}

impl Handler for Scripted {
    fn kind(&self) -> &'static str {
        SCRIPTED
    }
    fn prepare<'a>(
        &'a self,
        job: &'a JobContext,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            self.prepares.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            let action = payload["do"].as_str().unwrap_or("ok").to_owned();
            match action.as_str() {
                "ok" => Ok(Box::new(NoEffects) as Box<dyn Effects>),
                "write" => Ok(Box::new(WriteRow {
                    job: job.clone(),
                    then: "ok".into(),
                }) as Box<dyn Effects>),
                "transient" => Err(JobError::transient("remote busy")),
                "permanent" => Err(JobError::permanent(Code::HandlerFailed)),
                "record_invalid" => Err(JobError::record_invalid(3)),
                "panic" => panic!("handler panicked"),
                "hang" => std::future::pending().await,
                other => {
                    let then = other.strip_prefix("write_then_").unwrap_or("ok").to_owned();
                    Ok(Box::new(WriteRow {
                        job: job.clone(),
                        then,
                    }) as Box<dyn Effects>)
                }
            }
        })
    }
}
