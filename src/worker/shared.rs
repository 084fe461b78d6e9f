//! What every role of one replica shares: its pool, handlers, configuration, counters, commit
//! lanes and session signals.
//!
//! Invariants this module keeps:
//! - One [`Shared`] per replica, built once by [`super::Worker::start`] and read (never changed)
//!   by the producer, the job tasks, the heartbeat, the rescuer and the completer.
//! - [`Shared::owner_locked`] says whether the session holds the owner lock right now; it is what
//!   claims and heartbeats stamp into `lease_owner_locked`, never a guess from configuration.
//! - [`Shared::orphans`] dates the incarnation from the database's clock once its start-up
//!   released what the previous one left, before any claim of its own.
//! - [`Shared::reachable_for`] only shrinks on evidence the replica saw itself (a failed
//!   recovery pass, a lost session), so recovery never judges other owners by time during which
//!   it could not have seen them either.

use crate::config::{DatabaseConfig, Pooler, WorkerConfig};
use crate::db::{self, Pool};
use crate::error::Error;
use crate::job::handler::Registry;
use crate::worker::claim::claimer::{self, ClaimPool};
use crate::worker::complete::group_commit::{sessions, GroupCommit};
use crate::worker::liveness::session::Signals;
use crate::worker::stats::WorkerStats;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

/// What the client-side statement bound allows beyond the server's `statement_timeout`.
pub(crate) const STATEMENT_BOUND_SLACK: Duration = Duration::from_secs(2);

/// What every role and job task of a replica shares.
pub(crate) struct Shared {
    /// The connection pool.
    pub(crate) pool: Pool,
    /// The claim sessions ([`crate::worker::claim::claimer::connect_claim_pool`]): the only sessions whose planner
    /// switches pin the claim's plan.
    pub(crate) claim_pool: ClaimPool,
    /// The handlers, by kind.
    pub(crate) registry: Registry,
    /// The kinds of the handlers: what the replica claims.
    pub(crate) kinds: Vec<&'static str>,
    /// The replica's configuration.
    pub(crate) config: WorkerConfig,
    /// The replica's counters.
    pub(crate) stats: Arc<WorkerStats>,
    /// Where finished computations queue for their group commit.
    pub(crate) group_commit: GroupCommit,
    /// The client-side bound on the replica's own statements: the server's `statement_timeout`
    /// plus [`STATEMENT_BOUND_SLACK`], so only a connection that died silently ever reaches it.
    pub(crate) statement_bound: Duration,
    /// The session's signals; `None` in poll-only mode without a direct session.
    pub(crate) signals: Option<Arc<Signals>>,
    /// The served queues the claims found capped, whose claims take permits
    /// ([`claimer::CappedQueues`]).
    pub(crate) capped: claimer::CappedQueues,
    /// When a recovery pass of this replica last failed (see [`Shared::reachable_for`]).
    lost_at: StdMutex<Option<Instant>>,
    /// Whether the replica's own connections hold its alive lock ([`WorkerConfig::alive_locked`]).
    alive_locked: bool,
    /// The pooler the configuration declares on the database URL.
    pub(crate) pooler: Pooler,
    /// What adoption tells this incarnation's lost claims by ([`claimer::adopt`]).
    pub(crate) orphans: claimer::Orphans,
    /// A give-back found its claim gone: recovery may have charged this live replica an attempt
    /// (`maintain::refund`).
    pub(crate) refund_due: tokio::sync::Notify,
    /// The replica's cell, if it lives on a Citus node (found at start): the placement watch
    /// asks whether it still does (`liveness::placement`).
    pub(crate) citus_cell: Option<String>,
    /// The replica's cell moved to another Citus node: the claim loop stops
    /// (`liveness::placement`, `claim::dispatch::cell_moved`).
    pub(crate) moved: tokio::sync::Notify,
}

impl Shared {
    /// What the roles of a replica with `config` and `registry` share: `pool`, a claim pool and
    /// the commit lanes (on commit sessions of their own) opened here, the replica's `stats`, its
    /// session's `signals`, and its cell when that lives on this Citus node (`db::check_cell`).
    ///
    /// # Errors
    /// Connection errors of the claim or commit pool.
    pub(crate) async fn open(
        pool: Pool,
        db_config: &DatabaseConfig,
        config: WorkerConfig,
        registry: Registry,
        stats: Arc<WorkerStats>,
        signals: Option<Arc<Signals>>,
        citus_cell: Option<String>,
    ) -> Result<Shared, Error> {
        // Every row this incarnation claims starts after this (the start-up release is done).
        let since = db::checkout(&pool)
            .await?
            .query_typed("SELECT now()", &[])
            .await?
            .first()
            .map(|row| row.get(0))
            .ok_or(Error::Unavailable(None))?;
        let alive_locked = config.alive_locked(db_config);
        let alive = alive_locked.then_some(config.owner_id.as_str());
        let claim_pool = claimer::connect_claim_pool(db_config, Arc::clone(&stats), alive).await?;
        let commit_pool = sessions::connect_commit_pool(db_config, alive).await?;
        // A batch holds at most what the replica can hold: its slots and what it claims ahead
        // (a job's slot frees when it stops computing, before it commits).
        let group_commit = GroupCommit::start(
            commit_pool,
            Arc::clone(&stats),
            config.slots + config.prefetch,
        );
        Ok(Shared {
            pool,
            claim_pool,
            kinds: registry.kinds(),
            registry,
            config,
            stats,
            group_commit,
            statement_bound: db_config
                .statement_timeout
                .saturating_add(STATEMENT_BOUND_SLACK),
            signals,
            capped: claimer::CappedQueues::default(),
            lost_at: StdMutex::new(None),
            alive_locked,
            pooler: db_config.pooler,
            orphans: claimer::Orphans::new(since),
            refund_due: tokio::sync::Notify::new(),
            citus_cell,
            moved: tokio::sync::Notify::new(),
        })
    }

    /// Logs, at info, what the replica serves: its queues (with their weights), its kinds, its
    /// slots and what it claims ahead.
    pub(crate) fn announce(&self) {
        let config = &self.config;
        let queues: Vec<String> = config
            .queues
            .iter()
            .map(|q| format!("{}:{}", q.name, q.weight))
            .collect();
        tracing::info!(
            owner_id = %config.owner_id,
            queues = %queues.join(","),
            kinds = %self.kinds.join(","),
            slots = config.slots,
            prefetch = config.prefetch,
            "replica started"
        );
    }

    /// Whether this replica's own connections hold its alive lock ([`WorkerConfig::alive_locked`]).
    pub(crate) fn holds_alive_locks(&self) -> bool {
        self.alive_locked
    }

    /// Notes that the replica found the database unreachable just now (a failed recovery pass).
    pub(crate) fn lost_the_database(&self) {
        *self.lost_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// For how long, as of `now`, this replica has reached the database without a loss that it
    /// saw (a failed recovery pass, or its session found lost): recovery never counts the time
    /// before, when other replicas may have been just as cut off. `Duration::MAX` if it never
    /// lost it.
    pub(crate) fn reachable_for(&self, now: Instant) -> Duration {
        let own = *self.lost_at.lock().unwrap_or_else(PoisonError::into_inner);
        let session = self.signals.as_ref().and_then(|s| s.lost_at());
        own.max(session)
            .map_or(Duration::MAX, |lost| now.saturating_duration_since(lost))
    }

    /// Whether this replica's session holds its owner lock right now: what its claims and
    /// heartbeats stamp into `lease_owner_locked`, so recovery treats a missing lock as a sign of
    /// death only for owners that really held one.
    pub(crate) fn owner_locked(&self) -> bool {
        self.signals
            .as_ref()
            .is_some_and(|s| s.locked.load(Ordering::Relaxed))
    }

    /// The payload of a NOTIFY that wakes this replica alone (its session's
    /// [`Signals::wake_token`]); 0 for a replica without a session, which never registers.
    pub(crate) fn wake_token(&self) -> i64 {
        self.signals.as_ref().map_or(0, |s| s.wake_token)
    }

    /// This replica's owner id.
    pub(crate) fn owner_id(&self) -> &str {
        &self.config.owner_id
    }

    /// The names of the queues this replica serves, in configured order.
    pub(crate) fn queue_names(&self) -> Vec<&str> {
        self.config.queues.iter().map(|q| q.name.as_str()).collect()
    }
}

/// What the roles of a poll-only replica with owner id `owner` share, on `config`'s database,
/// with no kind registered and no session: for tests of one role at a time.
#[cfg(test)]
pub(crate) async fn for_tests(config: &DatabaseConfig, owner: &str) -> Shared {
    let pool = db::connect_pool(config, "test")
        .await
        .expect("the test database answers");
    let worker = WorkerConfig {
        owner_id: owner.into(),
        poll_only: true,
        ..WorkerConfig::default()
    };
    Shared::open(
        pool,
        config,
        worker,
        Registry::default(),
        Arc::default(),
        None,
        None,
    )
    .await
    .expect("the test database answers")
}
