//! The worker replica: claims due jobs into free slots, executes them, renews their leases,
//! recovers the jobs of dead or expired owners, and shuts down without stranding work.
//!
//! Invariants this module keeps:
//! - A replica takes its owner lock ([`rescuer::OwnerSession`]) before its first claim and holds
//!   it for its lifetime; a second live process with the same owner id refuses to start.
//! - A claim never asks for more jobs than there are free slots. After a claim that came back
//!   full, the replica claims again as soon as a slot frees (there is more work); otherwise it
//!   waits for the next poll.
//! - Every running job is in `held` until its task ends; heartbeats renew exactly those claims,
//!   and a claim the heartbeat reports lost is cancelled locally: its handler stops at once, and
//!   its task reports `LeaseLost` (a task that had already settled reports what it did).
//! - On shutdown: no new claims; running jobs get the grace period (cut to zero by a second
//!   signal); then unfinished leases are released at once (attempt not charged), the pool and
//!   the owner session are closed.

pub mod claimer;
pub mod completer;
pub mod executor;
pub mod heartbeat;
pub mod lease;
pub mod rescuer;
pub mod retry;
pub mod stats;

use crate::config::{DatabaseConfig, WorkerConfig};
use crate::db::{pool_error, Pool};
use crate::error::Error;
use crate::handler::Registry;
use crate::shutdown::{Shutdown, Stage};
use completer::Transition;
use lease::ClaimedJob;
use rescuer::{OwnerSession, Recovered};
use stats::{StatsSnapshot, WorkerStats};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What every job task of a replica shares.
pub(crate) struct Shared {
    /// The connection pool.
    pool: Pool,
    /// The handlers, by kind.
    registry: Registry,
    /// The replica's configuration.
    config: WorkerConfig,
    /// The replica's counters.
    stats: Arc<WorkerStats>,
}

/// A running replica.
pub struct Worker {
    /// State shared with job tasks.
    shared: Arc<Shared>,
    /// The session holding the owner lock.
    owner: OwnerSession,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner_id", &self.shared.config.owner_id)
            .finish_non_exhaustive()
    }
}

/// The jobs a replica is running: claim id → (job id, token that cancels it when its lease is lost).
type Held = HashMap<Uuid, (Uuid, CancellationToken)>;

impl Worker {
    /// Starts a replica: validates `config`, takes the owner lock, and releases what a previous
    /// incarnation with the same owner id left `running`.
    ///
    /// # Errors
    /// [`Error::Config`], [`Error::OwnerIdInUse`], and connection errors.
    pub async fn start(
        pool: Pool,
        db_config: &DatabaseConfig,
        config: WorkerConfig,
        registry: Registry,
    ) -> Result<Worker, Error> {
        config.validate()?;
        let (owner, released) = OwnerSession::acquire(db_config, &config.owner_id).await?;
        let stats = Arc::new(WorkerStats::default());
        stats.record_released(released);
        if released > 0 {
            tracing::info!(released, "released the previous incarnation's running jobs");
        }
        Ok(Worker {
            shared: Arc::new(Shared {
                pool,
                registry,
                config,
                stats,
            }),
            owner,
        })
    }

    /// This replica's owner id.
    pub fn owner_id(&self) -> &str {
        &self.shared.config.owner_id
    }

    /// A copy of this replica's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The replica's live counters, readable while [`Worker::run`] owns the worker.
    pub fn stats_handle(&self) -> Arc<WorkerStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The backend pid of the owner session (for operators and fault tests).
    ///
    /// # Errors
    /// Database errors.
    pub async fn owner_backend_pid(&self) -> Result<i32, Error> {
        self.owner.backend_pid().await
    }

    /// Claims up to `free` due jobs. A replica with no handlers claims nothing (it would only
    /// fail every job it took with `unknown_kind`).
    async fn claim(&self, free: usize) -> Result<Vec<ClaimedJob>, Error> {
        if self.shared.registry.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.shared.pool.get().await.map_err(pool_error)?;
        let jobs = claimer::claim(&*conn, self.owner_id(), free, self.shared.config.lease).await?;
        self.shared.stats.record_claim(jobs.len());
        Ok(jobs)
    }

    /// One step, for tests and tools: claims what is due now (up to the slots), runs every
    /// claimed job to its transition, and returns `(job id, transition)` for each.
    ///
    /// # Errors
    /// Database errors of the claim.
    pub async fn step(&self) -> Result<Vec<(Uuid, Transition)>, Error> {
        let jobs = self.claim(self.shared.config.slots).await?;
        let mut tasks = JoinSet::new();
        for job in jobs {
            let shared = Arc::clone(&self.shared);
            tasks.spawn(async move {
                let id = job.id();
                let transition = executor::execute(&shared, job, CancellationToken::new()).await;
                shared.stats.record(transition);
                (id, transition)
            });
        }
        let mut done: Vec<(Uuid, Transition)> = tasks.join_all().await;
        done.sort_by_key(|d| d.0);
        Ok(done)
    }

    /// Runs one recovery pass: dead owners' and expired leases' jobs go back to `pending`.
    ///
    /// # Errors
    /// Database errors.
    pub async fn recover(&self) -> Result<Recovered, Error> {
        let conn = self.shared.pool.get().await.map_err(pool_error)?;
        let recovered = rescuer::recover(&*conn).await?;
        self.shared.stats.record_recovery(recovered);
        if recovered != Recovered::default() {
            tracing::info!(
                expired = recovered.expired,
                dead_owner = recovered.dead_owner,
                exhausted = recovered.exhausted,
                "recovered jobs"
            );
        }
        Ok(recovered)
    }

    /// Renews the leases in `held`; cancels the jobs whose lease is gone. Their tasks then end
    /// with `LeaseLost` (counted when they are joined), unless they had already settled.
    async fn heartbeat(&self, held: &Held) -> Result<(), Error> {
        let claims: Vec<Uuid> = held.keys().copied().collect();
        let conn = self.shared.pool.get().await.map_err(pool_error)?;
        let still_held =
            heartbeat::beat(&*conn, self.owner_id(), &claims, self.shared.config.lease).await?;
        for (claim, (id, token)) in held {
            if !still_held.contains(claim) && !token.is_cancelled() {
                token.cancel();
                tracing::debug!(job_id = %id, "heartbeat found the lease gone");
            }
        }
        Ok(())
    }

    /// Runs the replica until `shutdown` asks it to stop, then drains and releases.
    ///
    /// # Errors
    /// [`Error::OwnerIdInUse`] never after start; database errors are logged by code and retried
    /// at the next tick, so this returns `Ok` on shutdown.
    pub async fn run(self, mut shutdown: Shutdown) -> Result<(), Error> {
        let config = self.shared.config.clone();
        let mut tasks: JoinSet<(Uuid, Transition)> = JoinSet::new();
        let mut held = Held::new();
        let mut task_claims: HashMap<tokio::task::Id, Uuid> = HashMap::new();
        let mut poll = ticker(config.poll_interval);
        let mut beat = ticker(config.heartbeat_interval);
        let mut rescue = ticker(config.poll_interval);
        let mut claim_now = true;
        let mut backlog = false;
        loop {
            if claim_now && tasks.len() < config.slots {
                let free = config.slots - tasks.len();
                match self.claim(free).await {
                    Ok(jobs) => {
                        backlog = jobs.len() == free;
                        for job in jobs {
                            self.spawn_job(&mut tasks, &mut held, &mut task_claims, job);
                        }
                    }
                    Err(e) => tracing::warn!(code = %e.code(), "claim failed"),
                }
            }
            claim_now = false;
            tokio::select! {
                () = shutdown.reached(Stage::Draining) => break,
                _ = poll.tick() => claim_now = true,
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    self.finish_task(done, &mut held, &mut task_claims);
                    claim_now = backlog;
                }
                _ = beat.tick() => {
                    if let Err(e) = self.heartbeat(&held).await {
                        tracing::warn!(code = %e.code(), "heartbeat failed");
                    }
                }
                _ = rescue.tick() => {
                    if let Err(e) = self.recover().await {
                        tracing::warn!(code = %e.code(), "recovery failed");
                    }
                }
            }
        }
        tracing::info!(running = tasks.len(), "draining");
        let grace = tokio::time::sleep(config.shutdown_grace);
        tokio::pin!(grace);
        while !tasks.is_empty() {
            tokio::select! {
                () = &mut grace => break,
                () = shutdown.reached(Stage::Immediate) => break,
                Some(done) = tasks.join_next_with_id() => {
                    self.finish_task(done, &mut held, &mut task_claims);
                }
                _ = beat.tick() => {
                    if let Err(e) = self.heartbeat(&held).await {
                        tracing::warn!(code = %e.code(), "heartbeat failed");
                    }
                }
            }
        }
        tasks.abort_all();
        while let Some(done) = tasks.join_next_with_id().await {
            self.finish_task(done, &mut held, &mut task_claims);
        }
        self.release(&held).await;
        // Dropping the worker drops the last pool handle (closing its connections) and the owner
        // session (ending the owner lock).
        drop(self);
        tracing::info!("stopped");
        Ok(())
    }

    /// Starts a task for `job` and records it as held.
    fn spawn_job(
        &self,
        tasks: &mut JoinSet<(Uuid, Transition)>,
        held: &mut Held,
        task_claims: &mut HashMap<tokio::task::Id, Uuid>,
        job: ClaimedJob,
    ) {
        let (id, claim) = (job.id(), job.claim_id());
        let shared = Arc::clone(&self.shared);
        let token = CancellationToken::new();
        let lost = token.clone();
        let task = tasks.spawn(async move { (claim, executor::execute(&shared, job, lost).await) });
        task_claims.insert(task.id(), claim);
        held.insert(claim, (id, token));
    }

    /// Records a finished (or aborted) task and forgets its claim, unless it was aborted before
    /// finishing, in which case shutdown still has to release it.
    fn finish_task(
        &self,
        done: Result<(tokio::task::Id, (Uuid, Transition)), tokio::task::JoinError>,
        held: &mut Held,
        task_claims: &mut HashMap<tokio::task::Id, Uuid>,
    ) {
        match done {
            Ok((task_id, (claim, transition))) => {
                task_claims.remove(&task_id);
                if let Some((id, _)) = held.remove(&claim) {
                    if transition == Transition::LeaseLost {
                        tracing::warn!(job_id = %id, code = "lease_lost", "abandoned job: lease lost");
                    }
                }
                self.shared.stats.record(transition);
            }
            Err(e) => {
                // Aborted by shutdown: the claim stays in `held`, to be released.
                task_claims.remove(&e.id());
            }
        }
    }

    /// Releases the leases of jobs that did not finish within the grace period.
    async fn release(&self, held: &Held) {
        if held.is_empty() {
            return;
        }
        let pairs: Vec<(Uuid, Uuid)> = held.iter().map(|(claim, (id, _))| (*id, *claim)).collect();
        let released = match self.shared.pool.get().await {
            Ok(conn) => completer::release(&*conn, &pairs)
                .await
                .map_err(Error::from),
            Err(e) => Err(pool_error(e)),
        };
        match released {
            Ok(n) => {
                self.shared.stats.record_released(n);
                tracing::info!(released = n, "released unfinished jobs");
            }
            Err(e) => tracing::warn!(code = %e.code(), "release failed; leases will expire"),
        }
    }
}

/// An interval timer that fires at once, then every `period`, without bursts after a stall.
fn ticker(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

/// Runs a replica with `registry` until `shutdown`; the `work` command's body.
///
/// # Errors
/// Start-up errors (configuration, owner id in use, database unreachable).
pub async fn run(
    pool: Pool,
    db_config: DatabaseConfig,
    config: WorkerConfig,
    registry: Registry,
    shutdown: Shutdown,
) -> Result<(), Error> {
    Worker::start(pool, &db_config, config, registry)
        .await?
        .run(shutdown)
        .await
}
