//! The replica's long-lived session: it LISTENs for enqueue notifications and holds the owner
//! lock, outside the pool, and keeps itself alive.
//!
//! Invariants this module keeps:
//! - One session per replica, opened before the first claim. Its connection is driven
//!   continuously by its own task; every notification bumps one coalescing signal
//!   ([`tokio::sync::Notify`] keeps at most one permit), so many notifications while a claim is in
//!   flight cause one more claim, not many.
//! - On any error, end of stream, or failed same-session probe (`pg_listening_channels()`), the
//!   session reconnects with capped exponential backoff (`backon`), LISTENs again, takes the owner
//!   lock again, and signals one catch-up claim: notifications sent while it was away are lost.
//! - If the owner lock cannot be taken again because the replica's own previous backend still
//!   holds it (the old connection vanished without the server noticing, e.g. a network drop),
//!   that backend — and only that one, identified by its pid — is terminated and the lock taken
//!   on the next attempt. If another process holds it (it took the owner id meanwhile), the
//!   session signals a fatal stop instead of running as a twin.
//! - A notification's payload is one of (migration 0028): empty (a wake for every replica: the
//!   API's notifier); `t <token> <queue> <kind>` (an enqueue named one waiting replica: it wakes
//!   the claim loop when the token is this process's, and otherwise is recorded as another's
//!   wake, which the claim loop backs up if it waits for that queue and kind); `q <queue>` (the
//!   queue may have become claimable: every replica that serves it claims, and settles it). A
//!   bare wake token of this process (the take of a schema before 0028, migrated down under the
//!   replica) also says its row is gone, so it registers again. Any other payload wakes the claim
//!   loop. Payloads carry nothing else: never an id, a payload or a
//!   principal.
//! - Every probe also counts the database's commits stuck waiting for a synchronous standby
//!   ([`probe`]): the session writes only its beats, to an UNLOGGED table whose commits write
//!   no WAL and never wait for a standby, so it sees them while every writer is held.
//! - The session beats (`beat`) as soon as it holds the owner lock, then every
//!   [`BEAT_INTERVAL`]; while it reconnects, the replica beats through its pool instead, so
//!   only a replica cut off on every URL falls silent.

use crate::config::DatabaseConfig;
use crate::db;
use crate::error::Error;
use crate::jobs::notifier::{reconnect_delays, RECONNECT_MAX_DELAY};
use crate::worker::liveness::beat::{self, BEAT_INTERVAL, BEAT_TIMEOUT};
use crate::worker::stats::WorkerStats;
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client};

/// How often the session proves, on itself, that it is alive and listening.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a probe may take before the session is presumed half-open.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the session is for.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    /// Where to connect: a direct session, never a transaction-mode pooler.
    pub(crate) database: DatabaseConfig,
    /// The replica's owner id, whose lock the session holds.
    pub(crate) owner_id: String,
    /// Whether to LISTEN (false in poll-only mode).
    pub(crate) listen: bool,
    /// Whether the session holds the owner's alive lock beside its owner lock (`worker::alive`;
    /// false in poll-only mode).
    pub(crate) alive: bool,
    /// The replica's pool, through which it beats while the session reconnects (`beat`).
    pub(crate) pool: db::Pool,
}

/// A running session; dropping it ends the session (and with it the owner lock).
#[derive(Debug)]
pub(crate) struct Session {
    /// The task that keeps the session alive.
    task: JoinHandle<()>,
    /// Signals for the claim loop.
    signals: Arc<Signals>,
    /// Whether, at start-up, the owner lock was taken from a silent holder (terminated): the
    /// previous incarnation may still be running its jobs, cut off from the database.
    took_over: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An open session and the signal of its connection's end.
struct Live {
    /// The session's client.
    client: Client,
    /// The session's backend pid: after a reconnect, the only lock holder that may be evicted.
    backend_pid: i32,
    /// Fires when the connection ends.
    ended: oneshot::Receiver<()>,
}

impl Session {
    /// Opens the session, takes the owner lock and starts keeping the session alive. Recovery
    /// of what a previous incarnation left `running` is the caller's (the rescuer's), once this
    /// returns with the lock held.
    ///
    /// # Errors
    /// [`Error::OwnerIdInUse`] when another live session holds the lock; connection errors.
    pub(crate) async fn start(
        config: SessionConfig,
        stats: Arc<WorkerStats>,
    ) -> Result<Session, Error> {
        let signals = Arc::new(Signals::default());
        let (live, took_over) = open_at_start(&config, &signals, &stats).await?;
        let task = tokio::spawn(maintain(live, config, Arc::clone(&signals), stats));
        Ok(Session {
            task,
            signals,
            took_over,
        })
    }

    /// The signals for the claim loop.
    pub(crate) fn signals(&self) -> Arc<Signals> {
        Arc::clone(&self.signals)
    }

    /// Whether the owner lock was taken over from a silent holder at start-up.
    pub(crate) fn took_over(&self) -> bool {
        self.took_over
    }
}

/// Listens on the deployment's own channel (`durable_etl_channel()`: a cell's is its own), in
/// one round trip; the listen takes effect when the block's implicit transaction commits.
///
/// Locks: none.
const LISTEN_SQL: &str = "DO $$ BEGIN EXECUTE format('LISTEN %I', durable_etl_channel()); END $$";

/// The backend holding owner `$1`'s lock in this database, if any.
///
/// Locks: none (reads `pg_locks`).
pub(crate) const LOCK_HOLDER_SQL: &str = "
SELECT l.pid
  FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((l.classid::bigint << 32) | l.objid::bigint) = durable_etl_owner_lock_key($1)";

/// Connects, starts driving the connection, LISTENs and takes the owner lock. `previous` is the
/// backend pid of this replica's lost session, if it reconnects.
async fn open(
    config: &SessionConfig,
    signals: &Arc<Signals>,
    stats: &Arc<WorkerStats>,
    previous: Option<i32>,
) -> Result<Live, Error> {
    let live = connect(config, signals, stats).await?;
    if !try_lock(&live.client, &config.owner_id).await? {
        return Err(evict_own_previous(&live.client, &config.owner_id, previous).await);
    }
    locked(live, config, signals, stats).await
}

/// [`open`] at start-up, where no previous backend of this replica is known. If another backend
/// holds the owner lock, it is watched: a live replica's session shows activity at least every
/// [`PROBE_INTERVAL`], so a holder that does is a twin (`OwnerIdInUse`), while one that stays
/// silent for [`SILENT_HOLDER`] is the orphaned session of a lost node (its client gone without
/// the server noticing yet) and is terminated, so a replica restarted with the same owner id
/// after a node loss takes its lock instead of failing until the server reaps the old backend.
/// Returns the session and whether a silent holder was terminated for it (then the lost node
/// may still be running that incarnation's jobs: they are left to their leases).
async fn open_at_start(
    config: &SessionConfig,
    signals: &Arc<Signals>,
    stats: &Arc<WorkerStats>,
) -> Result<(Live, bool), Error> {
    let live = connect(config, signals, stats).await?;
    let mut first_seen: Option<Holder> = None;
    let mut took_over = false;
    loop {
        if try_lock(&live.client, &config.owner_id).await? {
            return Ok((locked(live, config, signals, stats).await?, took_over));
        }
        let holder = lock_holder(&live.client, &config.owner_id).await?;
        match (holder, first_seen) {
            // The holder just went away: take the lock on the next look.
            (None, _) => {}
            (Some(h), _) if !h.is_session => return Err(Error::OwnerIdInUse),
            (Some(h), Some(seen)) if h.pid == seen.pid && h.last_active != seen.last_active => {
                return Err(Error::OwnerIdInUse)
            }
            (Some(h), _) if h.silent_for >= SILENT_HOLDER.as_secs_f64() => {
                tracing::warn!("the owner lock is held by a silent session; ending it");
                live.client
                    .query_typed_one("SELECT pg_terminate_backend($1)", &[(&h.pid, Type::INT4)])
                    .await?;
                took_over = true;
            }
            (Some(h), Some(seen)) if h.pid == seen.pid => {}
            (Some(h), _) => first_seen = Some(h),
        }
        tokio::time::sleep(HOLDER_RECHECK).await;
    }
}

/// Connects a session, starts driving its connection (forwarding notifications) and LISTENs.
async fn connect(
    config: &SessionConfig,
    signals: &Arc<Signals>,
    stats: &Arc<WorkerStats>,
) -> Result<Live, Error> {
    let (client, mut connection) = db::Connector::for_role(&config.database, "session")?
        .connect()
        .await?;
    let (ended_tx, ended) = oneshot::channel();
    let (signals_for_driver, stats_for_driver) = (Arc::clone(signals), Arc::clone(stats));
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(notification) = message {
                if signals_for_driver.deliver(notification.payload()) {
                    stats_for_driver
                        .notifications
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The receiver may be gone already (the session was replaced); nothing to tell then.
        let _ = ended_tx.send(());
    });
    if config.listen {
        client.batch_execute(LISTEN_SQL).await?;
    }
    let backend_pid = client
        .query_typed_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok(Live {
        client,
        backend_pid,
        ended,
    })
}

/// Tries once to take owner `owner_id`'s lock on `client`'s session.
async fn try_lock(client: &Client, owner_id: &str) -> Result<bool, Error> {
    let row = client
        .query_typed_one(
            "SELECT pg_try_advisory_lock(durable_etl_owner_lock_key($1))",
            &[(&owner_id, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}

/// Takes the owner's alive lock on `live` (when `config` holds one), marks it as holding the
/// owner lock and returns it.
async fn locked(
    live: Live,
    config: &SessionConfig,
    signals: &Signals,
    stats: &WorkerStats,
) -> Result<Live, Error> {
    let alive = config.alive.then_some(config.owner_id.as_str());
    crate::worker::liveness::alive::hold(&live.client, alive).await?;
    beat::beat(&live.client, &config.owner_id, &signals.beats).await?;
    signals.locked.store(true, Ordering::Relaxed);
    stats.session_up.store(1, Ordering::Relaxed);
    Ok(live)
}

/// How long the backend holding an owner lock must have shown no activity before a starting
/// replica takes it for the orphaned session of a lost node: three probe intervals, so a live
/// replica's session (which probes every [`PROBE_INTERVAL`]) is never mistaken for one.
pub(crate) const SILENT_HOLDER: Duration = Duration::from_secs(3 * PROBE_INTERVAL.as_secs());

/// How often a starting replica looks again at the backend that holds its owner lock.
const HOLDER_RECHECK: Duration = Duration::from_millis(250);

/// The owner lock is taken. If this replica's own lost session holds it, terminates that
/// backend and answers `Unavailable` (the next attempt takes the lock); otherwise another process
/// holds the owner id: `OwnerIdInUse`.
async fn evict_own_previous(client: &Client, owner_id: &str, previous: Option<i32>) -> Error {
    let holder = client
        .query_typed_opt(LOCK_HOLDER_SQL, &[(&owner_id, Type::TEXT)])
        .await;
    match (holder, previous) {
        (Ok(Some(row)), Some(previous)) if row.get::<_, i32>(0) == previous => {
            tracing::warn!("the lost session still holds the owner lock; ending it");
            match client
                .query_typed_one(
                    "SELECT pg_terminate_backend($1)",
                    &[(&previous, Type::INT4)],
                )
                .await
            {
                Ok(_) => Error::Unavailable(None),
                Err(e) => e.into(),
            }
        }
        // The holder just went away: try again.
        (Ok(None), _) => Error::Unavailable(None),
        (Err(e), _) => e.into(),
        _ => Error::OwnerIdInUse,
    }
}

/// Keeps the session alive: waits for it to fail, then reconnects with capped backoff.
async fn maintain(
    mut live: Live,
    config: SessionConfig,
    signals: Arc<Signals>,
    stats: Arc<WorkerStats>,
) {
    loop {
        live.until_lost(&config, &signals, &stats).await;
        let previous = live.backend_pid;
        // Close our side of the lost connection before opening the next one.
        drop(live);
        signals.locked.store(false, Ordering::Relaxed);
        signals.lost_now();
        stats.session_up.store(0, Ordering::Relaxed);
        tracing::warn!(code = "database_unavailable", "session lost; reconnecting");
        let mut delays = reconnect_delays();
        let reconnect = async {
            loop {
                tokio::time::sleep(delays.next().unwrap_or(RECONNECT_MAX_DELAY)).await;
                match open(&config, &signals, &stats, Some(previous)).await {
                    Ok(live) => return Some(live),
                    Err(Error::OwnerIdInUse) => return None,
                    Err(e) => tracing::warn!(code = %e.code(), "session reconnect failed"),
                }
            }
        };
        let reopened = tokio::select! {
            reopened = reconnect => reopened,
            never = beat::beat_through(&config.pool, &config.owner_id, &signals.beats) => match never {},
        };
        let Some(reopened) = reopened else {
            tracing::error!(
                code = "owner_id_in_use",
                "another process took this owner id"
            );
            signals.fatal.notify_one();
            return;
        };
        live = reopened;
        // Reachable again from now on: recovery counts other owners' silence from here.
        signals.lost_now();
        stats.reconnects.fetch_add(1, Ordering::Relaxed);
        tracing::info!("session reconnected");
        signals.reconnected.notify_one();
    }
}

impl Live {
    /// Beats every [`BEAT_INTERVAL`] and probes every [`PROBE_INTERVAL`]; returns when the
    /// connection ends, a beat finds it closed, or a probe fails.
    async fn until_lost(&mut self, config: &SessionConfig, signals: &Signals, stats: &WorkerStats) {
        let mut beats = tokio::time::interval(BEAT_INTERVAL);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probes =
            tokio::time::interval_at(tokio::time::Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
        probes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = &mut self.ended => return,
                _ = beats.tick() => {
                    let beat = beat::beat(&self.client, &config.owner_id, &signals.beats);
                    match tokio::time::timeout(BEAT_TIMEOUT, beat).await {
                        Ok(Ok(_)) if failing => {
                            failing = false;
                            tracing::info!("beats recorded again");
                        }
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) if e.is_closed() => return,
                        Ok(Err(e)) if !failing => {
                            failing = true;
                            tracing::warn!(code = %Error::from(e).code(), "beat failed");
                        }
                        // Slow or failing again: the next beat is due, and the probe judges
                        // whether the connection is lost.
                        Ok(Err(_)) | Err(_) => {}
                    }
                }
                _ = probes.tick() => {
                    if !self.probe(config.listen, stats).await {
                        return;
                    }
                }
            }
        }
    }

    /// Whether the session answers within the probe timeout and (when listening) still listens;
    /// records in `stats` the commits it saw stuck waiting for a synchronous standby.
    async fn probe(&self, listen: bool, stats: &WorkerStats) -> bool {
        let look = probe::look(&self.client, PROBE_INTERVAL);
        match tokio::time::timeout(PROBE_TIMEOUT, look).await {
            Ok(Ok(seen)) => {
                probe::report(stats, seen.waiting_for_standby);
                !listen || seen.listening
            }
            _ => false,
        }
    }
}

mod holder;
use holder::{lock_holder, Holder};
mod signals;
pub(crate) use signals::Signals;
mod probe;

#[cfg(test)]
mod tests;
