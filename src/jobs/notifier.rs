//! The coalescing notifier: one task per process that wakes the replicas with `NOTIFY
//! durable_etl_jobs` on behalf of many enqueue transactions that opted out of the trigger's own
//! NOTIFY.
//!
//! Why: a transaction that notifies holds PostgreSQL's cluster-wide notify lock from its NOTIFY
//! through its commit's WAL flush, so notifying commits cannot share a flush. Enqueue transactions
//! that run [`skip_trigger_notify`] commit without that lock and [`Notifier::signal`] afterwards;
//! the notifier's own NOTIFY-only transactions are the only ones that take it.
//!
//! Invariants this module keeps:
//! - Signalling never blocks and never fails: [`Notifier::signal`] stores at most one pending
//!   wake-up ([`tokio::sync::Notify`] keeps at most one permit), so an API request never waits on
//!   the notifier, and any number of signals while one is pending count as one.
//! - At most one NOTIFY starts per [`WINDOW`]: an idle notifier sends at once on a signal (light
//!   load keeps its pickup latency); every signal that arrives while a NOTIFY is in flight, or
//!   within the window after its start, is answered by exactly one more NOTIFY, sent when the
//!   window has passed.
//! - A signal is answered by a NOTIFY that starts after it: callers signal only after their
//!   transaction committed, so a worker woken by it sees their jobs.
//! - One dedicated connection, outside the pool (`application_name` `durable-etl/notifier`),
//!   opened when the notifier starts. A lost connection, or a NOTIFY that fails, is reopened with
//!   capped exponential backoff and the NOTIFY sent again; signals arriving meanwhile coalesce.
//!   A notification that is lost anyway is tolerated: the workers' poll is the backstop.
//! - The payload is empty: no id, payload or principal ever crosses the channel. Only stable
//!   codes are logged.
//! - Dropping the last clone of a [`Notifier`] stops its task and closes its connection.

use crate::config::DatabaseConfig;
use crate::db;
use crate::error::Error;
use backon::{BackoffBuilder, ExponentialBuilder};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, Transaction};

/// The channel the enqueue trigger and the notifier notify, and the workers LISTEN on, outside a
/// cell; a cell's is `durable_etl_jobs.<cell>`. Statements name it `durable_etl_channel()`
/// (migration 0041), which answers the deployment's own.
pub const CHANNEL: &str = "durable_etl_jobs";

/// The shortest time between the starts of two NOTIFYs of one notifier.
pub const WINDOW: Duration = Duration::from_millis(1);

/// First pause before reopening a lost dedicated connection (the notifier's, or a worker's
/// session), or retrying what failed on it.
pub(crate) const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);

/// Longest pause between two attempts to reopen a dedicated connection, before its jitter (up
/// to as much again): short, so that a server back after an outage is reached within half a
/// second; the attempts themselves are paced per process ([`crate::db::Pacer`]), so a dead
/// server still sees only a few a second.
pub(crate) const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

/// The pauses between attempts to reopen a dedicated connection outside the pool: doubling from
/// [`RECONNECT_MIN_DELAY`] to [`RECONNECT_MAX_DELAY`], with jitter, without end.
pub(crate) fn reconnect_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(RECONNECT_MIN_DELAY)
        .with_max_delay(RECONNECT_MAX_DELAY)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Wakes the waiting replicas, if any (`etl_waiting_replicas`, migration 0009; a parked row, whose
/// queues are empty, waits for nothing: 0027): the notifier's one statement, on its own
/// connection, in its own (implicit) transaction, and the statement a replica sends after
/// releasing jobs. It runs after the commits it answers for, so it needs no
/// barrier: a replica whose row it does not see registered after its snapshot, hence after those
/// commits, and claims after registering, so it sees their jobs.
///
/// Locks: PostgreSQL's notify queue lock, from the NOTIFY through the commit, only when a replica
/// waits; otherwise none.
pub(crate) const WAKE_WAITING_SQL: &str = "
SELECT pg_notify(durable_etl_channel(), '')
  FROM (SELECT 1 FROM etl_waiting_replicas w WHERE w.queues IS DISTINCT FROM '{}' LIMIT 1)
       AS waiting";

/// Turns the enqueue trigger's NOTIFY off for the rest of the transaction (migration 0005).
/// Locks: none.
const SKIP_TRIGGER_NOTIFY_SQL: &str = "SET LOCAL durable_etl.notify = 'off'";

/// Makes the enqueue trigger skip its NOTIFY for the rest of `tx`: jobs that `tx` enqueues wake
/// no replica when it commits. The caller must then wake them itself after the commit, with
/// [`Notifier::signal`] or its own `NOTIFY durable_etl_jobs`, or rely on the workers' poll (they
/// find the jobs within their poll interval). Library callers who do nothing keep the trigger's
/// NOTIFY; this is worth it only for many concurrent single-job producers, whose notifying
/// commits otherwise serialize on PostgreSQL's notify lock.
///
/// # Errors
/// Database errors ([`Error::Unavailable`] for a lost connection).
///
/// # Example
/// ```no_run
/// # async fn example(pool: durable_etl::Pool, notifier: durable_etl::jobs::notifier::Notifier) -> Result<(), durable_etl::Error> {
/// let mut conn = pool.get().await.map_err(durable_etl::db::pool_error)?;
/// let tx = conn.transaction().await?;
/// durable_etl::jobs::notifier::skip_trigger_notify(&tx).await?;
/// // … `jobs.enqueue(&tx, …)` and your own writes …
/// tx.commit().await?;
/// notifier.signal();
/// # Ok(())
/// # }
/// ```
pub async fn skip_trigger_notify(tx: &Transaction<'_>) -> Result<(), Error> {
    tx.batch_execute(SKIP_TRIGGER_NOTIFY_SQL).await?;
    Ok(())
}

/// A handle on a process's coalescing notifier; clones share it.
#[derive(Debug, Clone)]
pub struct Notifier {
    /// The signal and the task, shared by every clone.
    inner: Arc<Inner>,
}

/// What the clones of one [`Notifier`] share.
#[derive(Debug)]
struct Inner {
    /// The pending wake-up (at most one).
    signal: Arc<Notify>,
    /// The task that sends the NOTIFYs; aborted when the last clone is dropped.
    task: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Notifier {
    /// Starts the notifier of this process on `database`: its task opens the connection at once
    /// (if the server is away, the first signal opens it, retrying with backoff) and then answers
    /// signals. Call it inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Config`] when the database URL does not parse.
    pub fn start(database: &DatabaseConfig) -> Result<Notifier, Error> {
        db::pg_config(database, ROLE)?;
        let signal = Arc::new(Notify::new());
        let mut connection = Connection {
            database: database.clone(),
            client: None,
        };
        let waiting = Arc::clone(&signal);
        let task = tokio::spawn(async move {
            // Opened now, so that the first signal need not wait for it; while the server is
            // away, the first NOTIFY opens it (with backoff).
            if let Err(e) = connection.open().await {
                tracing::warn!(code = %e.code(), "notifier connection failed");
            }
            coalesce(&waiting, &mut connection).await;
        });
        Ok(Notifier {
            inner: Arc::new(Inner { signal, task }),
        })
    }

    /// Asks for one NOTIFY after this call; never blocks. Call it after the transaction whose
    /// jobs it announces has committed.
    pub fn signal(&self) {
        self.inner.signal.notify_one();
    }
}

/// The notifier's `application_name` role.
const ROLE: &str = "notifier";

/// Where the coalescing loop sends its NOTIFYs.
trait Link {
    /// Sends one NOTIFY; returns once it is sent.
    async fn notify(&mut self);
}

/// Answers `signal` with [`Link::notify`] on `link`, forever: at once when idle, at most one
/// NOTIFY starting per [`WINDOW`], and one NOTIFY for all the signals that arrived during the
/// previous one or its window.
async fn coalesce(signal: &Notify, link: &mut impl Link) {
    loop {
        signal.notified().await;
        let started = Instant::now();
        link.notify().await;
        tokio::time::sleep_until(started + WINDOW).await;
    }
}

/// The notifier's dedicated connection.
struct Connection {
    /// Where to connect.
    database: DatabaseConfig,
    /// The connection, once opened.
    client: Option<Client>,
}

impl Connection {
    /// The open connection: the current one, or a new one if there is none or it was lost.
    async fn open(&mut self) -> Result<&Client, Error> {
        let client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => db::connect(&self.database, ROLE).await?,
        };
        Ok(self.client.insert(client))
    }

    /// One NOTIFY on the open connection.
    async fn try_notify(&mut self) -> Result<(), Error> {
        self.open().await?.batch_execute(WAKE_WAITING_SQL).await?;
        Ok(())
    }
}

impl Link for Connection {
    async fn notify(&mut self) {
        let mut delays = reconnect_delays();
        while let Err(e) = self.try_notify().await {
            tracing::warn!(code = %e.code(), "notifier NOTIFY failed; reconnecting");
            tokio::time::sleep(delays.next().unwrap_or(RECONNECT_MAX_DELAY)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{coalesce, Link, Notifier, WINDOW};
    use crate::config::DatabaseConfig;
    use crate::error::Error;
    use std::sync::Arc;
    use tokio::sync::{mpsc, Notify, Semaphore};
    use tokio::time::{Duration, Instant};

    /// The wake statement notifies only while a replica waits: run without a row, with a parked
    /// row (migration 0027), then with a waiting row, then a sentinel; notifications arrive in
    /// commit order.
    #[tokio::test]
    async fn the_wake_statement_notifies_only_while_a_replica_waits() {
        use futures::StreamExt;
        let db = crate::test_db::TestDb::migrated().await;
        let config: tokio_postgres::Config = db.config.url.parse().unwrap();
        let (listener, mut connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        let (tx, mut seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) =
                messages.next().await
            {
                let _ = tx.send(n.channel().to_owned());
            }
        });
        listener
            .batch_execute("LISTEN durable_etl_jobs; LISTEN sentinel")
            .await
            .unwrap();
        let client = db.client().await;
        client.batch_execute(super::WAKE_WAITING_SQL).await.unwrap();
        client
            .batch_execute(
                "INSERT INTO etl_waiting_replicas (owner_id, queues, kinds) VALUES ('p', '{}', '{}')",
            )
            .await
            .unwrap();
        client.batch_execute(super::WAKE_WAITING_SQL).await.unwrap();
        client
            .batch_execute("INSERT INTO etl_waiting_replicas (owner_id) VALUES ('w')")
            .await
            .unwrap();
        client.batch_execute(super::WAKE_WAITING_SQL).await.unwrap();
        client.batch_execute("NOTIFY sentinel").await.unwrap();
        let mut channels = Vec::new();
        while let Some(channel) = seen.recv().await {
            if channel == "sentinel" {
                break;
            }
            channels.push(channel);
        }
        assert_eq!(channels, ["durable_etl_jobs"]);
    }

    /// A link whose sends report their start and wait for a permit to finish.
    struct Gated {
        /// The start time of each send.
        started: mpsc::UnboundedSender<Instant>,
        /// One permit lets one send finish.
        gate: Arc<Semaphore>,
    }

    impl Link for Gated {
        async fn notify(&mut self) {
            let _ = self.started.send(Instant::now());
            self.gate.acquire().await.unwrap().forget();
        }
    }

    /// The coalescing loop on a gated link: its signal, the send starts, the gate and the task.
    fn gated() -> (
        Arc<Notify>,
        mpsc::UnboundedReceiver<Instant>,
        Arc<Semaphore>,
        tokio::task::JoinHandle<()>,
    ) {
        let signal = Arc::new(Notify::new());
        let (tx, started) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let mut link = Gated {
            started: tx,
            gate: Arc::clone(&gate),
        };
        let waiting = Arc::clone(&signal);
        let task = tokio::spawn(async move { coalesce(&waiting, &mut link).await });
        (signal, started, gate, task)
    }

    #[tokio::test(start_paused = true)]
    async fn signals_during_a_send_cause_exactly_one_more_send() {
        let (signal, mut started, gate, task) = gated();
        // Idle: the first signal sends at once.
        let t0 = Instant::now();
        signal.notify_one();
        let first = started.recv().await.unwrap();
        assert_eq!(first, t0, "an idle notifier sends without waiting");
        // Many signals while the first send is in flight…
        for _ in 0..100 {
            signal.notify_one();
        }
        gate.add_permits(1);
        // …are answered by one more send, not before the window has passed…
        let second = started.recv().await.unwrap();
        assert!(second >= first + WINDOW);
        gate.add_permits(1);
        // …and by nothing else: the loop is idle again (time runs ahead while nothing is ready).
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(started.try_recv().is_err(), "exactly one more send");
        // A later signal is answered at once again.
        let t1 = Instant::now();
        signal.notify_one();
        assert_eq!(started.recv().await.unwrap(), t1);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn signals_within_the_window_wait_for_it_and_coalesce() {
        let (signal, mut started, gate, task) = gated();
        gate.add_permits(10);
        signal.notify_one();
        let first = started.recv().await.unwrap();
        // The send finished at once; these signals fall within its window.
        signal.notify_one();
        signal.notify_one();
        let second = started.recv().await.unwrap();
        assert_eq!(second, first + WINDOW);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(started.try_recv().is_err(), "one send for both signals");
        task.abort();
    }

    #[tokio::test]
    async fn a_bad_url_is_refused_and_an_absent_server_never_blocks_a_signal() {
        let bad = DatabaseConfig {
            url: "postgres://postgres@127.0.0.1:not-a-port/db".to_owned(),
            ..DatabaseConfig::default()
        };
        assert!(matches!(Notifier::start(&bad), Err(Error::Config(_))));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let away = DatabaseConfig {
            url: format!("postgres://postgres@127.0.0.1:{port}/db"),
            ..DatabaseConfig::default()
        };
        let notifier = Notifier::start(&away).unwrap();
        let clone = notifier.clone();
        for _ in 0..1000 {
            clone.signal();
        }
        // Its task fails to connect, backs off and retries meanwhile; dropping both handles
        // stops it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop((notifier, clone));
    }
}
