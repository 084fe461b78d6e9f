//! Opening one session: the one path every connection of this crate takes ([`Connector`]), the
//! pools' managers included ([`Manager`], and the claim and commit sessions' own, which open
//! their connections through one).
//!
//! Invariants this module keeps:
//! - Every session is opened with the crate's TLS connector ([`MakeRustls`]), as the URL's
//!   `sslmode` asks.
//! - An attempt at one host (name look-up, TCP, TLS, start-up and authentication) ends within
//!   the connect timeout, answered or not: a host that accepts TCP and then says nothing costs
//!   one timeout, never a hang.
//! - A multi-host URL's hosts are tried one at a time, in its order (shuffled under
//!   `load_balance_hosts=random`), each with its own timeout and the URL's
//!   `target_session_attrs`, until one opens a session; failing all, the last host's error is
//!   returned.
//! - An attempt that ran out of time fails as an I/O time-out, as the driver's own TCP timeout
//!   does: a lost connection, retried wherever those are.
//! - While attempts at a target (its hosts, ports, database and role) fail, a process makes them
//!   one at a time, each starting [`RETRY_PACE`] to twice that after the last one failed, whichever
//!   pool or session asks ([`Pacer`]): a few attempts a second at a dead server, however many
//!   connections wait. The first attempt that succeeds lets every waiting one go at once.
//! - Once a pool has opened a session, its manager keeps trying (paced) for as long as a
//!   checkout waits ([`all_hosts_bound`]), so a server that comes back is reached by the next
//!   paced attempt, not after a pool's own growing pause.

use super::tls::{MakeRustls, RustlsStream};
use crate::config::{ConfigError, DatabaseConfig};
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_postgres::config::{Host, LoadBalanceHosts};
use tokio_postgres::{Client, Config, Connection, Socket};

/// How one role opens its sessions: the driver's settings, the TLS connector, and the bound of
/// one attempt at one host. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Connector {
    /// The driver's settings (the URL's, with the role's session settings).
    pg: Config,
    /// The TLS connector of the URL's `sslmode`.
    tls: MakeRustls,
    /// How long one attempt at one host may take.
    timeout: Duration,
    /// Paces the attempts at this connector's target, shared by the whole process.
    pacer: Arc<Pacer>,
}

/// A session's client and the connection that drives it (spawn it, or poll its messages).
pub type Opened = (Client, Connection<Socket, RustlsStream>);

impl Connector {
    /// Opens sessions with `pg` (built from `cfg` by [`super::pg_config`] or
    /// `worker::claimer::claim_pg_config`), TLS as `cfg`'s URL asks, each attempt at a host bounded by
    /// `cfg.connect_timeout`.
    ///
    /// # Errors
    /// As [`DatabaseConfig::driver_url`]; [`ConfigError::SslRootCert`] when the root
    /// certificates a verifying `sslmode` needs cannot be read.
    pub fn new(cfg: &DatabaseConfig, pg: Config) -> Result<Connector, ConfigError> {
        let (_, request) = cfg.driver_url()?;
        Ok(Connector {
            pacer: Pacer::of(&pg),
            pg,
            tls: MakeRustls::new(&request)?,
            timeout: cfg.connect_timeout,
        })
    }

    /// The connector of role `role` ([`super::pg_config`]).
    ///
    /// # Errors
    /// As [`Connector::new`].
    pub fn for_role(cfg: &DatabaseConfig, role: &str) -> Result<Connector, ConfigError> {
        Connector::new(cfg, super::pg_config(cfg, role)?)
    }

    /// The driver's settings sessions are opened with.
    pub fn config(&self) -> &Config {
        &self.pg
    }

    /// Opens a session (see the module's invariants), returning its connection undriven.
    ///
    /// # Errors
    /// The last host's error: the server's refusal, a lost connection, or a time-out (an I/O
    /// error of kind `TimedOut`).
    pub async fn connect(&self) -> Result<Opened, tokio_postgres::Error> {
        self.pacer.attempt(self.connect_unpaced()).await
    }

    /// [`Connector::connect`], whatever the attempts before it did.
    async fn connect_unpaced(&self) -> Result<Opened, tokio_postgres::Error> {
        let mut last = None;
        for host in hosts(&self.pg) {
            match tokio::time::timeout(self.timeout, host.connect(self.tls.clone())).await {
                Ok(Ok(opened)) => return Ok(opened),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(timed_out().await),
            }
        }
        match last {
            Some(e) => Err(e),
            // No host at all: the driver says so.
            None => self.pg.connect(self.tls.clone()).await,
        }
    }

    /// Opens a session ([`Connector::connect`]) driven by a spawned task.
    ///
    /// # Errors
    /// As [`Connector::connect`].
    pub async fn client(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.connect().await?;
        tokio::spawn(async move {
            // The session's end is seen by the client as a closed connection; nothing to report.
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// How long opening one session with `cfg` may take: one connect timeout per host of its URL
/// (at least one).
pub fn all_hosts_bound(cfg: &DatabaseConfig) -> Duration {
    let hosts = cfg.driver_url().map_or(1, |(pg, _)| hosts(&pg).len());
    cfg.connect_timeout
        .saturating_mul(u32::try_from(hosts.max(1)).unwrap_or(u32::MAX))
}

/// The settings of each of `pg`'s hosts alone, in the order they are tried.
fn hosts(pg: &Config) -> Vec<Config> {
    let count = pg.get_hosts().len().max(pg.get_hostaddrs().len());
    let mut order: Vec<usize> = (0..count).collect();
    if pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
        fastrand::shuffle(&mut order);
    }
    order.into_iter().map(|i| one_host(pg, i)).collect()
}

/// `pg` with its `i`th host alone (and that host's `hostaddr` and port), every other setting
/// kept.
fn one_host(pg: &Config, i: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = pg.get_user() {
        one.user(user);
    }
    if let Some(password) = pg.get_password() {
        one.password(password);
    }
    if let Some(dbname) = pg.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = pg.get_options() {
        one.options(options);
    }
    if let Some(name) = pg.get_application_name() {
        one.application_name(name);
    }
    match pg.get_hosts().get(i) {
        Some(Host::Tcp(host)) => {
            one.host(host);
        }
        #[cfg(unix)]
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(addr) = pg.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    let ports = pg.get_ports();
    if let Some(port) = ports.get(i).or(ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = pg.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = pg.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = pg.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = pg.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(pg.get_ssl_mode())
        .ssl_negotiation(pg.get_ssl_negotiation())
        .keepalives(pg.get_keepalives())
        .keepalives_idle(pg.get_keepalives_idle())
        .target_session_attrs(pg.get_target_session_attrs())
        .channel_binding(pg.get_channel_binding())
        .load_balance_hosts(pg.get_load_balance_hosts());
    one
}

/// The error of an attempt that ran out of time: the driver's own I/O error of kind
/// `TimedOut`, as its TCP connect timeout reports (the driver has no public constructor for
/// it, so a start-up is run on a stream that answers every write so).
async fn timed_out() -> tokio_postgres::Error {
    let mut pg = Config::new();
    pg.user("timed-out");
    loop {
        // Not a network connection (the stream is in memory): no TLS to speak.
        if let Err(e) = pg.connect_raw(TimedOut, tokio_postgres::NoTls).await {
            return e;
        }
    }
}

/// A stream whose every read and write fails with [`io::ErrorKind::TimedOut`].
struct TimedOut;

impl AsyncRead for TimedOut {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl AsyncWrite for TimedOut {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Opens the sessions of a pool of plain clients ([`super::Pool`]) through a [`Connector`];
/// the claim and commit sessions' managers open theirs through one too.
#[derive(Clone, Debug)]
pub struct Manager {
    /// Opens the sessions.
    connector: Connector,
    /// Whether this manager (or a clone) has opened a session: from then on a failed attempt is
    /// tried again, paced, for as long as a checkout waits (see the module's invariants).
    /// Before, at start-up, one attempt is made, and start-up's own retries apply.
    opened: Arc<AtomicBool>,
}

impl Manager {
    /// A manager opening sessions with `connector`.
    pub fn new(connector: Connector) -> Manager {
        Manager {
            connector,
            opened: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = Client;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        if !self.opened.load(Ordering::Relaxed) {
            let client = self.connector.client().await?;
            self.opened.store(true, Ordering::Relaxed);
            return Ok(client);
        }
        // As long as a checkout waits: the pool gives up on this attempt then, and its own
        // pause before another (doubling up to half that time) never runs.
        let until = Instant::now() + self.connector.timeout.saturating_mul(self.hosts());
        loop {
            match self.connector.client().await {
                Ok(client) => return Ok(client),
                Err(e) if crate::error::is_refusal(&e) || Instant::now() >= until => return Err(e),
                Err(_) => {}
            }
        }
    }

    async fn is_valid(&self, client: &mut Client) -> Result<(), tokio_postgres::Error> {
        client.simple_query("").await.map(drop)
    }

    fn has_broken(&self, client: &mut Client) -> bool {
        client.is_closed()
    }
}

impl Manager {
    /// How many hosts a session attempt tries (at least one), as [`all_hosts_bound`] counts them.
    fn hosts(&self) -> u32 {
        u32::try_from(hosts(&self.connector.pg).len().max(1)).unwrap_or(u32::MAX)
    }
}

/// The shortest pause between the end of a failed attempt at a target and the start of the
/// next; each pause is drawn from this to twice this.
pub const RETRY_PACE: Duration = Duration::from_millis(250);

/// Paces one process's attempts at one target while they fail (see the module's invariants).
#[derive(Debug, Default)]
pub struct Pacer {
    /// When the next attempt may start, while attempts fail; `None` once one succeeded.
    failing: Mutex<Option<Instant>>,
    /// Held by the one attempt under way (or waiting to start) while attempts fail.
    turn: tokio::sync::Mutex<()>,
}

impl Pacer {
    /// The process's pacer for the target of `pg`: its hosts, addresses and ports, database and
    /// role.
    fn of(pg: &Config) -> Arc<Pacer> {
        /// Every target's pacer, for the life of the process (a process has a handful).
        static PACERS: OnceLock<Mutex<HashMap<String, Arc<Pacer>>>> = OnceLock::new();
        let key = format!(
            "{:?} {:?} {:?} {:?} {:?}",
            pg.get_hosts(),
            pg.get_hostaddrs(),
            pg.get_ports(),
            pg.get_dbname(),
            pg.get_user()
        );
        let pacers = PACERS.get_or_init(Mutex::default);
        let mut pacers = pacers.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(pacers.entry(key).or_default())
    }

    /// Runs the attempt `connect`: at once while attempts succeed; else after the attempts ahead
    /// of it, and no sooner than the pause after the last failure, unless one succeeded
    /// meanwhile.
    pub async fn attempt<T, E>(
        &self,
        connect: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let _turn = match self.failing_until() {
            None => None,
            Some(_) => {
                let turn = self.turn.lock().await;
                match self.failing_until() {
                    // One succeeded while this one waited: no more pacing.
                    None => None,
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        Some(turn)
                    }
                }
            }
        };
        let result = connect.await;
        let next = match result {
            Ok(_) => None,
            Err(_) => Some(Instant::now() + RETRY_PACE.mul_f64(1.0 + fastrand::f64())),
        };
        *self.failing.lock().unwrap_or_else(PoisonError::into_inner) = next;
        result
    }

    /// When the next attempt may start, while attempts fail.
    fn failing_until(&self) -> Option<Instant> {
        *self.failing.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
