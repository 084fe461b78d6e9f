//! The jobs a replica holds: what the producer starts and finishes, what the heartbeat renews,
//! and what the shutdown releases.
//!
//! Invariants this module keeps:
//! - A job is held from its claim until its task has ended: while it waits in the prefetch buffer
//!   (no task yet), and while its task runs; a job still buffered, or whose task was aborted, at
//!   shutdown stays held, to be released.
//! - Each held job carries the token that cancels it when its lease is lost and its local lease
//!   clock ([`LeaseClock`]); the heartbeat reaches both without the producer's help.
//! - The map's lock is taken only around map operations, never across an `await`.

use crate::worker::lease::{Lease, LeaseClock};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::task;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A job a replica holds: buffered or running.
#[derive(Debug)]
pub(crate) struct HeldJob {
    /// The job's lease.
    pub(crate) lease: Lease,
    /// Cancels the job's compute phase when its lease is lost or no longer trusted.
    pub(crate) lost: CancellationToken,
    /// The job's local lease clock, moved forward by each renewal.
    pub(crate) clock: Arc<LeaseClock>,
    /// The task that runs it, so a task that dies is matched to its claim; `None` while the job
    /// waits in the prefetch buffer.
    pub(crate) task: Option<task::Id>,
    /// The job's queue, for the jobs ended by queue.
    pub(crate) queue: Arc<str>,
    /// The job's queue, when its claim holds a permit of the queue's cap or its key's.
    pub(crate) permit_queue: Option<String>,
}

/// What the heartbeat needs of one held job.
pub(crate) struct Renewable {
    /// The claim id.
    pub(crate) claim: Uuid,
    /// The job id.
    pub(crate) id: Uuid,
    /// Cancels the job when its lease is gone.
    pub(crate) lost: CancellationToken,
    /// Its local lease clock.
    pub(crate) clock: Arc<LeaseClock>,
}

/// The jobs a replica holds, by claim id; cloned into every role that needs them.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldJobs(Arc<Mutex<HashMap<Uuid, HeldJob>>>);

impl HeldJobs {
    /// The map, locked (a panic while it was locked left it consistent: every operation is one
    /// map call).
    fn map(&self) -> MutexGuard<'_, HashMap<Uuid, HeldJob>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `job` under `claim`.
    pub(crate) fn insert(&self, claim: Uuid, job: HeldJob) {
        self.map().insert(claim, job);
    }

    /// Forgets `claim`; returns its job if it was held.
    pub(crate) fn remove(&self, claim: Uuid) -> Option<HeldJob> {
        self.map().remove(&claim)
    }

    /// How many jobs are held.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    /// What the heartbeat renews, as of now.
    pub(crate) fn renewable(&self) -> Vec<Renewable> {
        self.map()
            .iter()
            .map(|(claim, job)| Renewable {
                claim: *claim,
                id: job.lease.job_id,
                lost: job.lost.clone(),
                clock: Arc::clone(&job.clock),
            })
            .collect()
    }

    /// Every held lease, for the shutdown release.
    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.map().values().map(|job| job.lease).collect()
    }

    /// The claims of the held jobs whose handler has started (a task runs or ran them), for the
    /// shutdown release to record their attempts; jobs still waiting in the buffer have none.
    pub(crate) fn started(&self) -> Vec<Uuid> {
        self.map()
            .iter()
            .filter(|(_, job)| job.task.is_some())
            .map(|(claim, _)| *claim)
            .collect()
    }

    /// The claims held now.
    pub(crate) fn claims(&self) -> Vec<Uuid> {
        self.map().keys().copied().collect()
    }

    /// The lease of the job that task `task` runs, if any.
    pub(crate) fn of_task(&self, task: task::Id) -> Option<Lease> {
        self.map()
            .values()
            .find(|job| job.task == Some(task))
            .map(|job| job.lease)
    }

    /// Records that `task` now runs the job of `claim` (its first task, or the one that settles
    /// it after its first died).
    pub(crate) fn run_by(&self, claim: Uuid, task: task::Id) {
        if let Some(job) = self.map().get_mut(&claim) {
            job.task = Some(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{HeldJob, HeldJobs};
    use crate::worker::lease::{Lease, LeaseClock};
    use std::sync::Arc;

    /// A held job run by `task`.
    fn job(task: &tokio::task::AbortHandle, claim: uuid::Uuid) -> HeldJob {
        HeldJob {
            lease: Lease {
                job_id: uuid::Uuid::new_v4(),
                claim_id: claim,
                fencing_token: 1,
            },
            lost: tokio_util::sync::CancellationToken::new(),
            clock: Arc::new(LeaseClock::new(tokio::time::Instant::now())),
            task: Some(task.id()),
            queue: Arc::from("default"),
            permit_queue: None,
        }
    }

    #[tokio::test]
    async fn a_task_that_dies_is_matched_to_its_claim_and_no_other() {
        let mut tasks = tokio::task::JoinSet::new();
        let dying = tasks.spawn(async { panic!("escaped every guard") });
        let living = tasks.spawn(std::future::pending::<()>());
        let (dead_claim, live_claim) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let held = HeldJobs::default();
        held.insert(dead_claim, job(&dying, dead_claim));
        held.insert(live_claim, job(&living, live_claim));
        let died = tasks.join_next().await.unwrap().unwrap_err();
        assert!(died.is_panic());
        assert_eq!(
            held.of_task(died.id()).map(|l| l.claim_id),
            Some(dead_claim)
        );
        let mut replacements = tokio::task::JoinSet::new();
        let replacement = replacements.spawn(async {});
        held.run_by(dead_claim, replacement.id());
        assert_eq!(held.of_task(died.id()), None);
        assert_eq!(
            held.of_task(replacement.id()).map(|l| l.claim_id),
            Some(dead_claim)
        );
        living.abort();
        let aborted = tasks.join_next().await.unwrap().unwrap_err();
        assert_eq!(
            held.of_task(aborted.id()).map(|l| l.claim_id),
            Some(live_claim)
        );
        // A buffered job (no task yet) is held, renewed and released, and no task is its.
        let buffered = uuid::Uuid::new_v4();
        held.insert(
            buffered,
            HeldJob {
                task: None,
                ..job(&living, buffered)
            },
        );
        assert_eq!(
            held.of_task(aborted.id()).map(|l| l.claim_id),
            Some(live_claim)
        );
        assert_eq!(held.len(), 3);
        assert_eq!(held.renewable().len(), 3);
        let mut started = held.started();
        started.sort();
        let mut expected = vec![dead_claim, live_claim];
        expected.sort();
        assert_eq!(started, expected, "the buffered job started no attempt");
        assert!(held.remove(buffered).is_some());
        assert_eq!(held.len(), 2);
        assert_eq!(held.leases().len(), 2);
        assert!(held.remove(live_claim).is_some());
        assert_eq!(held.renewable().len(), 1);
    }
}
