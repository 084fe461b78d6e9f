//! The producer: bulk inserts of at most `PRODUCER_BATCH_MAX` jobs through the public
//! `Jobs::enqueue_many`, each in one transaction with its ledger rows, offered at a fixed rate
//! (paced by the adapter's clock or by the harness's `ENQUEUE <n>` tokens) or to keep the due
//! jobs at `TARGET_DEPTH`.
//!
//! Invariants:
//! - Fixed-rate pacing credits offered load on the real time elapsed, never on ticks, and
//!   offers all of it: credit above `PRODUCER_BATCH_MAX` becomes several inserts, not a loss.
//!   A producer that falls behind keeps its credit and catches up (open loop).
//! - A harness token's jobs are all inserted, in batches of at most `PRODUCER_BATCH_MAX`. When
//!   standard input ends, the producer falls back to its own clock at `PRODUCER_RATE`.
//! - `enqueued` counts only jobs whose transaction committed.

use crate::kind::BenchJob;
use crate::settings::{Mode, Pacing, Settings};
use crate::{ledger, Shared};
use durable_etl::{Jobs, Pool};
use std::io::BufRead;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Bits of a sequence number that count one producer's jobs; the bits above are its number.
pub(crate) const COUNTER_BITS: u32 = 40;

/// How long the producer waits after a failed insert before the next.
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Size of the fixed fields of a payload, subtracted from `JOB_PAYLOAD_BYTES` for the padding.
const FIXED_PAYLOAD_BYTES: usize = 56;

/// Why one insert failed (only its code is logged).
#[derive(Debug, thiserror::Error)]
enum InsertError {
    /// durable-etl refused or failed the enqueue.
    #[error("enqueue failed: {}", .0.code().as_str())]
    Enqueue(#[from] durable_etl::Error),
    /// The ledger write or the commit failed.
    #[error("ledger write failed: SQLSTATE {}", crate::db_code(.0))]
    Ledger(#[from] tokio_postgres::Error),
}

/// One replica's producer.
pub(crate) struct Producer {
    /// The settings of the run.
    settings: Settings,
    /// Where it enqueues.
    pool: Pool,
    /// The enqueue handle (owner `harness-adapter`).
    jobs: Jobs,
    /// The counters it adds to.
    shared: Arc<Shared>,
    /// The first sequence number of this producer (its number, shifted).
    base: i64,
    /// Jobs this producer has numbered so far.
    next: i64,
    /// The payload's filler.
    padding: String,
}

impl Producer {
    /// A producer numbered `number` (see [`crate::ledger`]).
    pub(crate) fn new(
        settings: Settings,
        pool: Pool,
        jobs: Jobs,
        shared: Arc<Shared>,
        number: i64,
    ) -> Producer {
        let padding = "x".repeat(settings.payload_bytes.saturating_sub(FIXED_PAYLOAD_BYTES));
        Producer {
            settings,
            pool,
            jobs,
            shared,
            base: number << COUNTER_BITS,
            next: 0,
            padding,
        }
    }

    /// Offers load until `stop`; an insert under way when it comes is finished.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        if !self.settings.produces {
            return;
        }
        match (self.settings.mode, self.settings.pacing) {
            (Mode::DepthTarget, _) => self.depth_target(&stop).await,
            (Mode::Fixed, Pacing::Harness) => {
                self.tokens(read_tokens(), &stop).await;
                self.fixed(&stop).await;
            }
            (Mode::Fixed, Pacing::Adapter) => self.fixed(&stop).await,
        }
    }

    /// Fixed rate by the adapter's own clock.
    async fn fixed(&mut self, stop: &CancellationToken) {
        let every = self.settings.batch_every;
        let (mut credited_at, mut credit, mut next) = (Instant::now(), 0.0_f64, Instant::now());
        while !stop.is_cancelled() {
            next = (next + every).max(Instant::now());
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
            }
            let now = Instant::now();
            credit += self.settings.rate * now.duration_since(credited_at).as_secs_f64();
            credited_at = now;
            while credit >= 1.0 && !stop.is_cancelled() {
                let n = (credit.floor() as usize).min(self.settings.batch_max);
                self.insert_or_pause(n).await;
                credit -= n as f64;
            }
        }
    }

    /// Fixed rate by the harness's tokens, until standard input ends or `stop`.
    async fn tokens(&mut self, mut tokens: mpsc::Receiver<usize>, stop: &CancellationToken) {
        loop {
            let mut n = tokio::select! {
                () = stop.cancelled() => return,
                token = tokens.recv() => match token {
                    Some(n) => n,
                    None => return,
                },
            };
            while n > 0 && !stop.is_cancelled() {
                let batch = n.min(self.settings.batch_max);
                self.insert_or_pause(batch).await;
                n -= batch;
            }
        }
    }

    /// Keeps the due jobs at the target depth.
    async fn depth_target(&mut self, stop: &CancellationToken) {
        while !stop.is_cancelled() {
            let due = match self.due().await {
                Ok(due) => due,
                Err(code) => {
                    tracing::warn!(%code, "queue depth not read");
                    i64::MAX
                }
            };
            let short = self.settings.target_depth.saturating_sub(due);
            if short > 0 {
                let n = usize::try_from(short)
                    .map_or(self.settings.batch_max, |s| s.min(self.settings.batch_max));
                self.insert_or_pause(n).await;
            } else {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(self.settings.batch_every) => {}
                }
            }
        }
    }

    /// The jobs due now (durable-etl's queue sample).
    async fn due(&self) -> Result<i64, String> {
        let conn = durable_etl::db::checkout(&self.pool)
            .await
            .map_err(|e| e.code().as_str().to_owned())?;
        durable_etl::service::metrics::sample_queue(&*conn)
            .await
            .map(|q| q.due)
            .map_err(|e| crate::db_code(&e))
    }

    /// Inserts `n` jobs; on failure logs the code, counts it and pauses briefly.
    async fn insert_or_pause(&mut self, n: usize) {
        if let Err(e) = self.insert(n).await {
            self.shared.enqueue_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "insert failed");
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }

    /// Enqueues `n` jobs and their ledger rows in one transaction.
    async fn insert(&mut self, n: usize) -> Result<(), InsertError> {
        let produced_at_us = crate::now_micros();
        let seqs: Vec<i64> = (0..n as i64).map(|i| self.base | (self.next + i)).collect();
        let batch: Vec<BenchJob> = seqs
            .iter()
            .map(|&seq| BenchJob {
                seq,
                produced_at_us,
                padding: self.padding.clone(),
            })
            .collect();
        let mut conn = durable_etl::db::checkout(&self.pool).await?;
        let tx = conn.transaction().await?;
        let ids = self.jobs.enqueue_many(&tx, &batch).await?;
        ledger::record(&tx, &seqs, &ids).await?;
        tx.commit().await?;
        self.next += n as i64;
        self.shared.enqueued.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Reads `ENQUEUE <n>` lines from standard input on a thread of its own; the channel closes
/// when standard input ends. Other lines are ignored.
fn read_tokens() -> mpsc::Receiver<usize> {
    let (tx, rx) = mpsc::channel(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            let n = line
                .trim()
                .strip_prefix("ENQUEUE ")
                .and_then(|n| n.trim().parse::<usize>().ok());
            if let Some(n) = n.filter(|n| *n > 0) {
                if tx.blocking_send(n).is_err() {
                    return;
                }
            }
        }
    });
    rx
}
