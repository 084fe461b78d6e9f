//! What the commit lanes share: how a lane gathers its batch off the shared queue ([`Gather`]),
//! the count of lanes committing ([`Committing`]), and the restart of a lane that panicked.
//!
//! Invariants this module keeps:
//! - At most one lane gathers at a time (it holds the queue), so while one lane commits, the
//!   other forms the next batch from everything that arrives, until that commit ends, its batch
//!   is full, or its gather limit has passed.
//! - Before deciding its batch, a lane yields once after its first job, so that the jobs whose
//!   tasks run right after it (one claim's, ending together) join it rather than start the
//!   next batch; it waits for nothing else when no other lane commits.
//! - A lane's commit is counted in [`Committing`] exactly while it runs, even when its future is
//!   dropped or unwinds ([`CommitGuard`]).

use crate::codes::Code;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex, Notify};
/// How many lanes are committing a batch right now, and a signal each time one ends.
#[derive(Clone, Default)]
pub(super) struct Committing {
    /// Lanes inside [`commit_batch`].
    count: Arc<AtomicUsize>,
    /// Notified (all waiters) when a lane's commit ends.
    ended: Arc<Notify>,
}

/// A lane's commit, counted in [`Committing`] until dropped (also when the commit's future is
/// dropped at shutdown, or unwinds).
pub(super) struct CommitGuard<'a>(&'a Committing);

impl<'a> CommitGuard<'a> {
    /// Counts a commit that starts now.
    pub(super) fn start(committing: &'a Committing) -> CommitGuard<'a> {
        committing.count.fetch_add(1, Ordering::SeqCst);
        CommitGuard(committing)
    }
}

impl Drop for CommitGuard<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// Runs the task `start` makes, again each time it dies of a panic (a commit lane that ran
/// handler code outside [`Effects::apply`], such as a panicking `Drop`), until it ends normally.
/// The jobs of the batch it was committing get no answer: their tasks take the transient path,
/// whose fenced write settles against whatever committed.
pub(super) async fn restarting<F, T>(mut start: F)
where
    F: FnMut() -> T,
    T: std::future::Future<Output = ()> + Send + 'static,
{
    while let Err(died) = tokio::spawn(start()).await {
        if !died.is_panic() {
            return;
        }
        tracing::warn!(code = %Code::HandlerPanicked, "a commit lane panicked; restarting it");
    }
}

/// How a lane gathers its batch from the queue all lanes share.
pub(super) struct Gather<T> {
    /// The queue of ready jobs, shared by the lanes.
    pub(super) receiver: Arc<Mutex<mpsc::UnboundedReceiver<T>>>,
    /// The largest batch.
    pub(super) max_batch: usize,
    /// How long a lane gathers at most while another lane commits.
    pub(super) gather_limit: Duration,
    /// The lanes committing now.
    pub(super) committing: Committing,
}

impl<T> Gather<T> {
    /// The first queued job (waiting for one), then (after letting the tasks scheduled meanwhile
    /// run, once) whatever else is queued, up to the largest
    /// batch, and, while another lane commits, what arrives until its commit ends or
    /// `gather_limit` has passed; `None` once the queue is closed. Holding the queue meanwhile
    /// keeps the other lane from starting another batch, so when its commit ends none runs.
    pub(super) async fn next_batch(&self) -> Option<Vec<T>> {
        let mut receiver = self.receiver.lock().await;
        let mut batch = vec![receiver.recv().await?];
        // Jobs that finish together (one claim's, at a steady load) are queued by tasks that
        // run a moment after the first: let them run before deciding the batch.
        tokio::task::yield_now().await;
        let deadline = tokio::time::Instant::now() + self.gather_limit;
        let mut expired = false;
        loop {
            while batch.len() < self.max_batch {
                match receiver.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let ended = self.committing.ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so an end in between is not missed.
            ended.as_mut().enable();
            if expired
                || batch.len() >= self.max_batch
                || self.committing.count.load(Ordering::SeqCst) == 0
            {
                return Some(batch);
            }
            tokio::select! {
                () = &mut ended => {}
                () = tokio::time::sleep_until(deadline) => expired = true,
                next = receiver.recv() => match next {
                    Some(next) => batch.push(next),
                    None => return Some(batch),
                },
            }
        }
    }
}

#[cfg(test)]
#[path = "lane_tests.rs"]
mod tests;
