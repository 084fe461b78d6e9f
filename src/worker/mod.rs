//! The worker replica: claims due jobs into free slots when notified, polled or due, executes
//! them, renews their leases, recovers the jobs of dead or expired owners, and shuts down without
//! stranding work.
//!
//! Invariants this module keeps:
//! - A replica opens its session ([`session::Session`]: LISTEN + owner lock) before its first
//!   claim; a second live process with the same owner id refuses to start.
//! - ONE claim loop per replica. Notifications, the poll, due deferred jobs, freed slots and
//!   session reconnects all feed it, and each wake causes at most one claim. A claim never asks
//!   for more jobs than there are free slots. After a claim that came back full (or a wake that
//!   found no free slot), the replica claims again as soon as half its slots are free, or
//!   [`REFILL_DELAY`] after the first slot freed (so claims and group commits stay batches, and
//!   no slot idles behind long jobs); after a short one it waits for the next signal.
//! - A claim that fails (a lost connection, a timeout) is tried again after
//!   [`CLAIM_RETRY_DELAY`], not only at the next notification or poll.
//! - The poll runs whatever happens to notifications, every `poll_interval` with ±10% jitter so
//!   replicas do not poll in lockstep; when a deferred job is due sooner, the loop wakes then.
//! - Every running job is in `held` until its task ends; heartbeats renew exactly those claims,
//!   and a claim the heartbeat reports lost is cancelled locally: its handler stops at once, and
//!   its task reports `LeaseLost` (a task that had already settled reports what it did).
//! - On shutdown: no new claims; running jobs get the grace period (cut to zero by a second
//!   signal); then the commits still running are abandoned (their statements cancelled on the
//!   server, their transactions rolled back), unfinished leases are released at once (attempt
//!   not charged; a release that cannot finish within [`RELEASE_TIMEOUT`] leaves them to expire),
//!   the pool and the session are closed.

/// The SET items that end a lease, shared by every statement that takes a row out of `running`
/// (success, retry, failure, release, recovery), so none forgets a lease column.
macro_rules! lease_cleared {
    () => {
        "lease_owner_id = NULL, lease_claim_id = NULL, lease_expires_at = NULL, \
         lease_owner_locked = false, lease_renewed_at = NULL"
    };
}

/// Whether the owner of the job row aliased `j` asked to cancel it: the row's own
/// `cancel_requested_at` (written by releases before migration 0004) or a row of
/// `etl_job_cancel_requests` (a primary-key probe), so a request never waits for the job's row.
macro_rules! cancel_requested {
    () => {
        "durable_etl_cancel_requested(j.id, j.cancel_requested_at)"
    };
}

pub mod claimer;
pub mod completer;
pub mod executor;
pub mod group_commit;
pub mod heartbeat;
pub mod lease;
pub mod rescuer;
pub mod retry;
pub mod session;
pub mod stats;

use crate::codes::Code;
use crate::config::{DatabaseConfig, WorkerConfig};
use crate::db::{self, Pool};
use crate::error::Error;
use crate::handler::Registry;
use crate::shutdown::{Shutdown, Stage};
use claimer::Claimant;
use completer::Transition;
use lease::ClaimedJob;
use rescuer::Recovered;
use session::{Session, SessionConfig};
use stats::{ClaimReason, StatsSnapshot, WorkerStats};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long slots freed under a backlog wait for more to free before they are claimed anyway:
/// long enough to gather the next group commit's slots, short enough that a slot never idles
/// behind long-running jobs.
pub const REFILL_DELAY: Duration = Duration::from_millis(25);

/// How soon a failed claim is tried again.
pub const CLAIM_RETRY_DELAY: Duration = Duration::from_millis(100);

/// How long the shutdown release may wait (for a row lock, say) before the replica exits anyway
/// and leaves the unreleased leases to expire.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Where finished computations queue for their group commit.
    group_commit: group_commit::GroupCommit,
    /// The client-side bound on the replica's own statements: the server's `statement_timeout`
    /// plus [`STATEMENT_BOUND_SLACK`], so only a connection that died silently ever reaches it.
    statement_bound: Duration,
}

/// What the client-side statement bound allows beyond the server's `statement_timeout`.
pub const STATEMENT_BOUND_SLACK: Duration = Duration::from_secs(2);

/// A running replica.
pub struct Worker {
    /// State shared with job tasks.
    shared: Arc<Shared>,
    /// The LISTEN and owner-lock session; `None` in poll-only mode without a direct session.
    session: Option<Session>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner_id", &self.shared.config.owner_id)
            .finish_non_exhaustive()
    }
}

/// What the claim loop remembers between wakes.
#[derive(Debug, Default)]
struct WakeState {
    /// The last claim came back full (or a wake found no free slot): claim when a slot frees.
    backlog: bool,
    /// A notification arrived since the last claim.
    notified_since_claim: bool,
    /// When the next known deferred job is due.
    next_due: Option<Instant>,
    /// When slots freed under a backlog are claimed even if fewer than half are free.
    refill_at: Option<Instant>,
}

/// A job a replica is running, as its claim loop tracks it.
#[derive(Debug)]
struct HeldJob {
    /// The job's id.
    id: Uuid,
    /// Cancels the job's compute phase when its lease is lost or no longer trusted.
    lost: CancellationToken,
    /// The job's local lease clock, moved forward by each renewal.
    clock: Arc<lease::LeaseClock>,
    /// The task that runs it, so a task that dies is matched to its claim.
    task: tokio::task::Id,
}

/// The jobs a replica is running, by claim id.
type Held = HashMap<Uuid, HeldJob>;

impl Worker {
    /// Starts a replica: validates `config`, opens its session (LISTEN and owner lock, unless in
    /// poll-only mode without a direct session URL), and releases what a previous incarnation
    /// with the same owner id left `running`.
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
        let stats = Arc::new(WorkerStats::default());
        let direct = config.session_database_url.clone();
        let session = if config.poll_only && direct.is_none() {
            tracing::warn!(
                "poll-only mode without a direct session: no owner lock, so a dead replica's \
                 jobs are recovered by lease expiry only, and a second replica with the same \
                 owner id cannot be detected"
            );
            let conn = crate::db::checkout(&pool).await?;
            let released = rescuer::recover_own(&*conn, &config.owner_id).await?;
            stats.record_released(released);
            None
        } else {
            let database = DatabaseConfig {
                url: direct.unwrap_or_else(|| db_config.url.clone()),
                ..db_config.clone()
            };
            let session_config = SessionConfig {
                database,
                owner_id: config.owner_id.clone(),
                listen: !config.poll_only,
            };
            let (session, released) = Session::start(session_config, Arc::clone(&stats)).await?;
            stats.record_released(released);
            Some(session)
        };
        let released = stats.snapshot().released;
        if released > 0 {
            tracing::info!(released, "released the previous incarnation's running jobs");
        }
        let group_commit =
            group_commit::GroupCommit::start(pool.clone(), Arc::clone(&stats), config.slots);
        Ok(Worker {
            shared: Arc::new(Shared {
                pool,
                registry,
                config,
                stats,
                group_commit,
                statement_bound: db_config
                    .statement_timeout
                    .saturating_add(STATEMENT_BOUND_SLACK),
            }),
            session,
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

    /// Whether this replica's session holds its owner lock right now: what its claims and
    /// heartbeats stamp into `lease_owner_locked`, so recovery treats a missing lock as a sign of
    /// death only for owners that really held one.
    fn owner_locked(&self) -> bool {
        self.session.as_ref().is_some_and(Session::is_locked)
    }

    /// Claims up to `free` due jobs for `reason`. A replica with no handlers claims nothing (it
    /// would only fail every job it took with `unknown_kind`).
    #[tracing::instrument(name = "claim", skip_all, fields(free, ?reason))]
    async fn claim(&self, free: usize, reason: ClaimReason) -> Result<Vec<ClaimedJob>, Error> {
        if self.shared.registry.is_empty() {
            return Ok(Vec::new());
        }
        let conn = crate::db::checkout(&self.shared.pool).await?;
        let claimant = Claimant {
            owner_id: self.owner_id(),
            owner_locked: self.owner_locked(),
            lease: self.shared.config.lease,
        };
        crash_point!("claim.before");
        let jobs = db::bounded(
            self.shared.statement_bound,
            claimer::claim(&*conn, claimant, free),
        )
        .await?;
        crash_point!("claim.after_commit");
        self.shared.stats.record_claim(reason, jobs.len());
        for job in &jobs {
            self.shared.stats.pickup_latency.observe(job.due_for);
        }
        Ok(jobs)
    }

    /// How long until the next deferred job is due, asked after a short claim (once its jobs
    /// are already running, so the question never delays them).
    async fn next_due(&self) -> Result<Option<Duration>, Error> {
        let conn = crate::db::checkout(&self.shared.pool).await?;
        self.shared.stats.record_round_trips(1);
        db::bounded(self.shared.statement_bound, claimer::next_due(&*conn)).await
    }

    /// One step, for tests and tools: claims what is due now (up to the slots), runs every
    /// claimed job to its transition, and returns `(job id, transition)` for each.
    ///
    /// # Errors
    /// Database errors of the claim.
    pub async fn step(&self) -> Result<Vec<(Uuid, Transition)>, Error> {
        let jobs = self
            .claim(self.shared.config.slots, ClaimReason::Step)
            .await?;
        let mut tasks = JoinSet::new();
        for job in jobs {
            let shared = Arc::clone(&self.shared);
            tasks.spawn(async move {
                let id = job.id();
                let transition = timed_execute(&shared, job, CancellationToken::new()).await;
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
    #[tracing::instrument(name = "recovery", skip_all)]
    pub async fn recover(&self) -> Result<Recovered, Error> {
        let conn = crate::db::checkout(&self.shared.pool).await?;
        self.shared.stats.record_round_trips(1);
        let silence = rescuer::owner_silence(self.shared.config.heartbeat_interval);
        let recovered = db::bounded(
            self.shared.statement_bound,
            rescuer::recover(&*conn, silence),
        )
        .await?;
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
    /// with `LeaseLost` (counted when they are joined), unless they had already settled. A
    /// renewal moves each still-held job's local lease clock forward, from when it was sent.
    #[tracing::instrument(name = "heartbeat", skip_all, fields(held = held.len()))]
    async fn heartbeat(&self, held: &Held) -> Result<(), Error> {
        let claims: Vec<Uuid> = held.keys().copied().collect();
        let conn = crate::db::checkout(&self.shared.pool).await?;
        if !claims.is_empty() {
            crash_point!("heartbeat");
        }
        self.shared.stats.record_round_trips(1);
        let sent = Instant::now();
        let config = &self.shared.config;
        // A heartbeat slower than its interval is as good as lost: the next one is due.
        let still_held = db::bounded(
            config.heartbeat_interval.min(self.shared.statement_bound),
            heartbeat::beat(
                &*conn,
                self.owner_id(),
                &claims,
                config.lease,
                self.owner_locked(),
            ),
        )
        .await?;
        let trusted_until = sent + lease::trusted_for(config.lease);
        for (claim, job) in held {
            match still_held.get(claim) {
                Some(true) => job.clock.trust_until(trusted_until),
                // Held but locked by this replica's own commit: not renewed, not lost.
                Some(false) => {}
                None if job.lost.is_cancelled() => {}
                None => {
                    job.lost.cancel();
                    tracing::debug!(job_id = %job.id, "heartbeat found the lease gone");
                }
            }
        }
        Ok(())
    }

    /// Runs the replica until `shutdown` asks it to stop, then drains and releases.
    ///
    /// # Errors
    /// [`Error::OwnerIdInUse`] when, after a reconnect, another process holds this owner id (the
    /// replica then stops at once and releases what it holds). Database errors are logged by code
    /// and retried at the next wake.
    #[tracing::instrument(name = "replica", skip_all, fields(owner_id = %self.owner_id()))]
    pub async fn run(self, mut shutdown: Shutdown) -> Result<(), Error> {
        let config = self.shared.config.clone();
        let signals = self.session.as_ref().map(Session::signals);
        let mut tasks: JoinSet<(Uuid, Transition)> = JoinSet::new();
        let mut held = Held::new();
        let mut beat = ticker(config.heartbeat_interval);
        let mut rescue = ticker(rescue_interval(config.poll_interval));
        let mut next_poll = Instant::now() + jittered(config.poll_interval);
        let mut wake = WakeState::default();
        let mut reason = Some(ClaimReason::Startup);
        let mut fatal = false;
        loop {
            if let Some(why) = reason.take() {
                self.claim_and_spawn(why, &mut tasks, &mut held, &mut wake)
                    .await;
            }
            tokio::select! {
                () = shutdown.reached(Stage::Draining) => break,
                () = wait(signals.as_deref().map(|s| &s.fatal)) => {
                    fatal = true;
                    break;
                }
                () = wait(signals.as_deref().map(|s| &s.notified)) => {
                    wake.notified_since_claim = true;
                    reason = Some(ClaimReason::Notify);
                }
                () = wait(signals.as_deref().map(|s| &s.reconnected)) => {
                    reason = Some(ClaimReason::CatchUp);
                }
                () = tokio::time::sleep_until(next_poll) => {
                    next_poll = Instant::now() + jittered(config.poll_interval);
                    reason = Some(ClaimReason::Poll);
                }
                () = sleep_until_opt(wake.next_due) => {
                    wake.next_due = None;
                    reason = Some(ClaimReason::Due);
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    self.finish_task(done, &mut tasks, &mut held);
                    // A group commit frees its jobs' slots together: take them all before
                    // claiming, so the next claim fills them in one statement.
                    while let Some(done) = tasks.try_join_next() {
                        self.finish_task(done, &mut tasks, &mut held);
                    }
                    if wake.backlog {
                        if refill_now(config.slots, tasks.len()) {
                            reason = Some(ClaimReason::Drain);
                        } else if wake.refill_at.is_none() {
                            wake.refill_at = Some(Instant::now() + REFILL_DELAY);
                        }
                    }
                }
                () = sleep_until_opt(wake.refill_at) => {
                    wake.refill_at = None;
                    reason = Some(ClaimReason::Drain);
                }
                _ = beat.tick() => self.heartbeat_logged(&held).await,
                _ = rescue.tick() => {
                    match self.recover().await {
                        Ok(r) if r.expired + r.dead_owner > r.exhausted => {
                            reason = Some(ClaimReason::CatchUp);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(code = %e.code(), "recovery failed"),
                    }
                }
            }
        }
        self.drain(tasks, held, shutdown, fatal).await;
        if fatal {
            Err(Error::OwnerIdInUse)
        } else {
            Ok(())
        }
    }

    /// Claims for the free slots and starts the claimed jobs; then, after a short claim, learns
    /// when the next deferred job is due (the jobs are already running by then).
    async fn claim_and_spawn(
        &self,
        why: ClaimReason,
        tasks: &mut JoinSet<(Uuid, Transition)>,
        held: &mut Held,
        wake: &mut WakeState,
    ) {
        wake.refill_at = None;
        let free = self.shared.config.slots - tasks.len();
        if free == 0 {
            wake.backlog = true;
            return;
        }
        let claimed = Instant::now();
        let jobs = match self.claim(free, why).await {
            Ok(jobs) => jobs,
            Err(e) => {
                // Claim again soon rather than at the next wake, which may be a whole poll away
                // (a notification that caused this claim will not come again).
                tracing::warn!(code = %e.code(), "claim failed");
                let retry = Instant::now() + CLAIM_RETRY_DELAY;
                wake.next_due = Some(wake.next_due.map_or(retry, |due| due.min(retry)));
                return;
            }
        };
        if why == ClaimReason::Poll && !jobs.is_empty() && !wake.notified_since_claim {
            self.shared.stats.record_poll_found_work();
        }
        wake.notified_since_claim = false;
        wake.backlog = jobs.len() == free;
        for job in jobs {
            self.spawn_job(tasks, held, job, claimed);
        }
        if !wake.backlog {
            match self.next_due().await {
                Ok(due_in) => wake.next_due = due_in.map(|d| Instant::now() + d),
                Err(e) => tracing::warn!(code = %e.code(), "next-due query failed"),
            }
        }
    }

    /// Lets running jobs finish within the grace period (none when `now`), then releases the
    /// rest and closes the pool and the session.
    #[tracing::instrument(name = "shutdown", skip_all, fields(running = tasks.len(), now))]
    async fn drain(
        self,
        mut tasks: JoinSet<(Uuid, Transition)>,
        mut held: Held,
        mut shutdown: Shutdown,
        now: bool,
    ) {
        tracing::info!(running = tasks.len(), "draining");
        let grace = tokio::time::sleep(if now {
            Duration::ZERO
        } else {
            self.shared.config.shutdown_grace
        });
        tokio::pin!(grace);
        let mut beat = ticker(self.shared.config.heartbeat_interval);
        while !tasks.is_empty() {
            tokio::select! {
                () = &mut grace => break,
                () = shutdown.reached(Stage::Immediate) => break,
                Some(done) = tasks.join_next() => self.finish_task(done, &mut tasks, &mut held),
                _ = beat.tick() => self.heartbeat_logged(&held).await,
            }
        }
        tasks.abort_all();
        while let Some(done) = tasks.join_next().await {
            self.finish_task(done, &mut tasks, &mut held);
        }
        // A commit still running (blocked on a row lock, say) is not waited for: its statement
        // is cancelled and its batch rolled back, so the release does not wait for its locks.
        self.shared.group_commit.abandon().await;
        if tokio::time::timeout(RELEASE_TIMEOUT, self.release(&held))
            .await
            .is_err()
        {
            tracing::warn!("release timed out; leases will expire");
        }
        // Dropping the worker drops the last pool handle (closing its connections) and the
        // session (ending the owner lock).
        drop(self);
        tracing::info!("stopped");
    }

    /// A heartbeat whose failure is logged by code and left to the next tick (the jobs' lease
    /// clocks abandon them if renewals fail for too long).
    async fn heartbeat_logged(&self, held: &Held) {
        if let Err(e) = self.heartbeat(held).await {
            tracing::warn!(code = %e.code(), "heartbeat failed");
        }
    }

    /// Starts a task for `job`, claimed by a statement sent at `claimed`, and records it as held.
    fn spawn_job(
        &self,
        tasks: &mut JoinSet<(Uuid, Transition)>,
        held: &mut Held,
        job: ClaimedJob,
        claimed: Instant,
    ) {
        let (id, claim) = (job.id(), job.claim_id());
        let shared = Arc::clone(&self.shared);
        let lost = CancellationToken::new();
        let clock = Arc::new(lease::LeaseClock::new(
            claimed + lease::trusted_for(self.shared.config.lease),
        ));
        let (task_lost, task_clock) = (lost.clone(), Arc::clone(&clock));
        let task = tasks.spawn(async move {
            let execution = timed_execute(&shared, job, task_lost.clone());
            tokio::pin!(execution);
            let transition = tokio::select! {
                transition = &mut execution => transition,
                // The clock ran out and cancelled the job: let it settle as a lost lease.
                () = lease::watch_lease(&task_clock, &task_lost, id) => execution.await,
            };
            (claim, transition)
        });
        held.insert(
            claim,
            HeldJob {
                id,
                lost,
                clock,
                task: task.id(),
            },
        );
    }

    /// Records a finished task and forgets its claim. A task aborted by shutdown stays in `held`,
    /// to be released. A task that died of a panic that escaped every guard is replaced by one
    /// that ends its job `failed` with `handler_panicked` under its fence, so the claim never
    /// stays held (and renewed) forever.
    fn finish_task(
        &self,
        done: Result<(Uuid, Transition), tokio::task::JoinError>,
        tasks: &mut JoinSet<(Uuid, Transition)>,
        held: &mut Held,
    ) {
        match done {
            Ok((claim, transition)) => {
                if let Some(job) = held.remove(&claim) {
                    if transition == Transition::LeaseLost {
                        tracing::warn!(job_id = %job.id, code = "lease_lost", "abandoned job: lease lost");
                    }
                }
                self.shared.stats.record(transition);
            }
            Err(died) if died.is_panic() => {
                let Some(claim) = claim_of_task(held, died.id()) else {
                    return;
                };
                let Some(job) = held.get_mut(&claim) else {
                    return;
                };
                tracing::error!(job_id = %job.id, code = "handler_panicked", "a job's task died");
                let (shared, id) = (Arc::clone(&self.shared), job.id);
                let settle =
                    tasks.spawn(async move { (claim, settle_dead_task(&shared, id, claim).await) });
                job.task = settle.id();
            }
            Err(_) => {}
        }
    }

    /// Releases the leases of jobs that did not finish within the grace period.
    async fn release(&self, held: &Held) {
        if held.is_empty() {
            return;
        }
        let pairs: Vec<(Uuid, Uuid)> = held.iter().map(|(claim, job)| (job.id, *claim)).collect();
        crash_point!("release");
        self.shared.stats.record_round_trips(1);
        let released = match crate::db::checkout(&self.shared.pool).await {
            Ok(conn) => {
                db::bounded(
                    self.shared.statement_bound,
                    completer::release(&*conn, &pairs),
                )
                .await
            }
            Err(e) => Err(e),
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

/// The claim of the held job that task `task` runs, if any.
fn claim_of_task(held: &Held, task: tokio::task::Id) -> Option<Uuid> {
    held.iter()
        .find(|(_, job)| job.task == task)
        .map(|(claim, _)| *claim)
}

/// Ends job `id` of claim `claim` `failed` with `handler_panicked`, under its fence, after its
/// task died: what the executor would have written had the panic reached its guard.
async fn settle_dead_task(shared: &Shared, id: Uuid, claim: Uuid) -> Transition {
    let Ok(conn) = db::checkout(&shared.pool).await else {
        return Transition::Unwritten;
    };
    shared.stats.record_round_trips(1);
    db::bounded(
        shared.statement_bound,
        completer::fail(&*conn, id, claim, Code::HandlerPanicked, None),
    )
    .await
    .unwrap_or(Transition::Unwritten)
}

/// Executes `job` inside a span with its safe fields, recording its duration.
async fn timed_execute(shared: &Shared, job: ClaimedJob, lost: CancellationToken) -> Transition {
    let started = Instant::now();
    let span = tracing::info_span!("execute", job_id = %job.id(), attempt = job.ctx.attempt);
    let transition =
        tracing::Instrument::instrument(executor::execute(shared, job, lost), span.clone()).await;
    shared
        .stats
        .execution
        .observe(started.elapsed().as_secs_f64());
    span.in_scope(|| tracing::debug!(?transition, "job settled"));
    transition
}

/// How often a replica runs recovery: twice per poll interval. A SIGKILLed replica's lock goes
/// at once, but a row its dying backend still locks (mid-effects) is skipped until the server
/// ends that backend (`client_connection_check_interval`); the second look comes half a poll
/// later instead of a whole one, so such a job runs again within about one poll interval plus
/// the check interval (under 2 s with the defaults).
fn rescue_interval(poll_interval: Duration) -> Duration {
    poll_interval / 2
}

/// Whether a replica draining a backlog should claim now, with `running` of its `slots` busy:
/// once at least half its slots are free, so each claim (and the group commits that follow)
/// carries a batch worth its statement, instead of one claim per freed job.
fn refill_now(slots: usize, running: usize) -> bool {
    slots - running >= slots.div_ceil(2)
}

/// Waits for a permit of `signal`; never resolves when there is no signal (no session).
async fn wait(signal: Option<&Notify>) {
    match signal {
        Some(signal) => signal.notified().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; never resolves when there is none.
async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// `period` with ±10% jitter, so replicas do not poll in lockstep.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(0.9 + fastrand::f64() * 0.2)
}

/// An interval timer that fires at once, then every `period`, without bursts after a stall.
fn ticker(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

#[cfg(test)]
mod tests {
    use super::jittered;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_dies_is_matched_to_its_claim_and_no_other() {
        let mut tasks = tokio::task::JoinSet::new();
        let dying = tasks.spawn(async { panic!("escaped every guard") });
        let living = tasks.spawn(std::future::pending::<()>());
        let job = |task: &tokio::task::AbortHandle| super::HeldJob {
            id: uuid::Uuid::new_v4(),
            lost: tokio_util::sync::CancellationToken::new(),
            clock: std::sync::Arc::new(super::lease::LeaseClock::new(tokio::time::Instant::now())),
            task: task.id(),
        };
        let (dead_claim, live_claim) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let held: super::Held = [(dead_claim, job(&dying)), (live_claim, job(&living))].into();
        let died = tasks.join_next().await.unwrap().unwrap_err();
        assert!(died.is_panic());
        assert_eq!(super::claim_of_task(&held, died.id()), Some(dead_claim));
        living.abort();
        let aborted = tasks.join_next().await.unwrap().unwrap_err();
        assert_eq!(super::claim_of_task(&held, aborted.id()), Some(live_claim));
        assert_eq!(super::claim_of_task(&held, dying.id()), Some(dead_claim));
    }

    #[test]
    fn recovery_runs_twice_per_poll_interval() {
        assert_eq!(
            super::rescue_interval(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn a_draining_replica_refills_once_half_its_slots_are_free() {
        assert!(!super::refill_now(8, 5));
        assert!(super::refill_now(8, 4));
        assert!(super::refill_now(1, 0));
        assert!(!super::refill_now(1, 1));
        assert!(super::refill_now(3, 1));
        assert!(!super::refill_now(3, 2));
    }

    #[test]
    fn the_poll_jitters_within_ten_percent() {
        let period = Duration::from_secs(1);
        for _ in 0..1000 {
            let d = jittered(period);
            assert!(
                d >= Duration::from_millis(900) && d <= Duration::from_millis(1100),
                "{d:?}"
            );
        }
    }
}
