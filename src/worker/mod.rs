//! The worker replica: a thin facade that starts a replica's roles and stops them in order.
//!
//! The roles, each owning its loop and its SQL, grouped by stage:
//! - [`claim`]: `producer`, the claim loop, with its buffer (`prefetch`) and shares per queue
//!   (`queues`), claiming with [`claimer`]'s statements;
//! - `run`: each job on a task (`executor`), under the handler guard, in a slot;
//! - [`complete`]: the fenced writes ([`completer`]), committing in groups (`group_commit`);
//! - [`liveness`]: [`heartbeat`] renews the leases of the held jobs (`held`), `session` holds
//!   LISTEN and the owner lock, `presence` says whether it waits for work, `reporter` sends the
//!   console's figures;
//! - [`maintain`], the periodic roles: [`rescuer`] recovers dead owners' and expired leases'
//!   jobs, [`refund`] undoes its charge on a live replica, [`scheduler`] fires schedules.
//!
//! Invariants this module keeps:
//! - A replica opens its session before its first claim, and releases what a previous
//!   incarnation with the same owner id left `running` before its roles start; a second live
//!   process with the same owner id refuses to start.
//! - On shutdown, in this order: the producer stops claiming and gives running jobs the grace
//!   period (cut to zero by a second signal, a taken owner id or an undeclared transaction-mode
//!   pooler); the periodic roles stop; the commits still running are abandoned (statements
//!   cancelled, transactions rolled back); unfinished leases are released at once
//!   (attempt not charged, or left to expire after [`completer::RELEASE_TIMEOUT`]); the heartbeat
//!   stops; the pool and the session close. No held lease lapses within the grace.

// The stages, each a folder; what the suite and the benches drive is public for them, hidden.
pub mod budget;
#[doc(hidden)]
pub mod claim;
#[doc(hidden)]
pub mod complete;
pub(crate) mod guard;
#[doc(hidden)]
pub mod lease;
#[doc(hidden)]
pub mod liveness;
#[doc(hidden)]
pub mod maintain;
pub(crate) mod run;
pub(crate) mod shared;
pub mod stats;
pub(crate) mod timing;

#[doc(hidden)]
pub use {
    claim::claimer,
    complete::completer,
    liveness::heartbeat,
    maintain::{refund, rescuer, scheduler},
};

use crate::config::{ConfigError, DatabaseConfig, WorkerConfig};
use crate::{db, db::Pool, error::Error, job::handler::Registry, shutdown::Shutdown};
use claim::{dispatch, producer::Producer, producer::Stopped};
use complete::completer::Transition;
use liveness::{held::HeldJobs, reporter, session::Session};
use maintain::rescuer::Recovered;
use shared::Shared;
use stats::{StatsSnapshot, WorkerStats};
use std::sync::Arc;
use tokio::{sync::Notify, task::JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A running replica.
pub struct Worker {
    /// What the roles share.
    shared: Arc<Shared>,
    /// The LISTEN and owner-lock session; `None` in poll-only mode without a direct session.
    /// Dropping it ends the session and the owner lock.
    _session: Option<Session>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner_id", &self.shared.config.owner_id)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts a replica: validates `config`, checks that `pool` keeps its server sessions unless
    /// `db_config` declares a transaction-mode pooler (`liveness::sessions_kept`), opens its
    /// session, and releases what a previous incarnation with its owner id left `running`.
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
        registry.validate()?;
        let on_citus = db::check_cell(&*db::checkout(&pool).await?, db_config).await?;
        liveness::sessions_kept::check(&pool, db_config).await?;
        budget::announce(db_config, &config);
        let stats = Arc::new(WorkerStats::default());
        let session =
            liveness::direct::open_for(&config, db_config, &pool, Arc::clone(&stats)).await?;
        let previous = rescuer::release_previous_incarnation(&pool, &config.owner_id, &session);
        stats.record_released(previous.await?);
        let signals = session.as_ref().map(Session::signals);
        let shared = Shared::open(pool, db_config, config, registry, stats, signals, on_citus);
        let shared = shared.await?;
        shared.announce();
        Ok(Worker {
            shared: Arc::new(shared),
            _session: session,
        })
    }

    /// This replica's owner id.
    pub fn owner_id(&self) -> &str {
        self.shared.owner_id()
    }

    /// A copy of this replica's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The replica's live counters, readable while [`Worker::run`] owns the worker.
    pub fn stats_handle(&self) -> Arc<WorkerStats> {
        Arc::clone(&self.shared.stats)
    }

    /// One step, for tests and tools: claims what is due now (up to the slots), runs every
    /// claimed job to its transition, and returns `(job id, transition)` for each.
    ///
    /// # Errors
    /// Database errors of the claim.
    pub async fn step(&self) -> Result<Vec<(Uuid, Transition)>, Error> {
        dispatch::step(&self.shared).await
    }

    /// Runs one recovery pass: dead owners' and expired leases' jobs go back to `pending`.
    ///
    /// # Errors
    /// Database errors.
    pub async fn recover(&self) -> Result<Recovered, Error> {
        rescuer::pass(&self.shared).await
    }

    /// Runs the replica's roles until `shutdown` asks it to stop, then stops them in order (see
    /// the module's invariants).
    ///
    /// # Errors
    /// [`Error::OwnerIdInUse`] when, after a reconnect, another process holds this owner id (the
    /// replica then stops at once and releases what it holds); [`ConfigError::TransactionPooler`]
    /// when a claim met an undeclared transaction-mode pooler (it stops the same way). Other
    /// database errors are logged by code and retried by the role that met them.
    #[tracing::instrument(name = "replica", skip_all, fields(owner_id = %self.owner_id()))]
    pub async fn run(self, mut shutdown: Shutdown) -> Result<(), Error> {
        let held = HeldJobs::default();
        let (stop_rescuer, stop_heartbeat) = (CancellationToken::new(), CancellationToken::new());
        let catch_up = Arc::new(Notify::new());
        // The roles' tasks live in a set that aborts them if this future is dropped, so a
        // cancelled `run` never leaves a heartbeat renewing leases nobody works on.
        let mut roles = JoinSet::new();
        roles.spawn(heartbeat::run(
            Arc::clone(&self.shared),
            held.clone(),
            stop_heartbeat.clone(),
        ));
        maintain::spawn(&mut roles, &self.shared, &catch_up, &stop_rescuer);
        let (shared, stop) = (Arc::clone(&self.shared), stop_rescuer.clone());
        roles.spawn(reporter::run(shared, held.clone(), stop));
        let (shared, stop) = (Arc::clone(&self.shared), stop_rescuer.clone());
        roles.spawn(liveness::placement::run(shared, stop));
        let mut producer = Producer::new(Arc::clone(&self.shared), held.clone());
        let stopped = producer.run(&catch_up, &mut shutdown).await;
        let shutdown_span = tracing::info_span!("shutdown", running = held.len());
        let stopping = async {
            producer
                .drain(&mut shutdown, stopped != Stopped::Draining)
                .await;
            stop_rescuer.cancel();
            // A commit still running (blocked on a row lock, say) is not waited for: its
            // statement is cancelled and its batch rolled back, so the release does not wait for
            // its locks.
            self.shared.group_commit.abandon().await;
            complete::give_back::release_held(&self.shared, &held).await;
            stop_heartbeat.cancel();
            // Each role ends at its next await once stopped.
            roles.join_all().await;
        };
        tracing::Instrument::instrument(stopping, shutdown_span).await;
        drop(self); // the last pool handle and the session (so the owner lock) go with it
        tracing::info!("stopped");
        match stopped {
            Stopped::OwnerIdTaken => Err(Error::OwnerIdInUse),
            Stopped::TransactionPooler => Err(ConfigError::TransactionPooler.into()),
            Stopped::CellMoved => Err(Error::CellMoved),
            Stopped::Draining => Ok(()),
        }
    }
}
