//! A TCP proxy between a replica and PostgreSQL, for network faults. It can pass traffic through,
//! drop every connection (close both sides), blackhole (hold traffic in both directions without
//! closing anything, like a silently lost network), refuse new connections (closed as soon as
//! their startup packet arrives, like a server that is down, each recorded), and cut the first connection that sends a
//! `COMMIT` after arming: the COMMIT reaches the server, the server's reply never reaches the
//! client, and the connection is closed, so the client cannot know the outcome. It can cut an
//! extended-protocol statement the same way: the first whose messages up to its `Sync` carry
//! given bytes (a parameter's value, or an unnamed statement's text), and not other given bytes,
//! after arming runs on the server, and its reply is lost; markers armed together cut statements
//! in turn.
//!
//! It reads the frontend side of the protocol only as far as it must: message framing, the
//! startup packet's `application_name`, the text of simple queries (`Q`), where
//! tokio-postgres sends `COMMIT`, and whether a message carries the armed bytes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Protocol 3.0, the code of a startup packet.
const PROTOCOL_3: i32 = 196_608;

/// Whether traffic flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes are relayed both ways.
    Pass,
    /// Bytes are held both ways (nothing is closed); they flow again on [`Mode::Pass`].
    Blackhole,
    /// A new connection is closed once its startup packet arrived, never reaching the server,
    /// and recorded ([`Proxy::refused_since`]); open ones are held as by [`Mode::Blackhole`]
    /// (drop them with [`Proxy::drop_all`]).
    Refuse,
}

/// What marks a statement to cut: the bytes its messages (up to its `Sync`) carry, and bytes
/// they must not carry (say, another statement's text, sent with it when it is unnamed).
struct Marker {
    /// Bytes the statement carries.
    carrying: Vec<u8>,
    /// Bytes it must not carry; empty for none.
    unless: Vec<u8>,
}

impl Marker {
    /// Whether the messages of one statement, `flight`, are marked.
    fn marks(&self, flight: &[u8]) -> bool {
        contains(flight, &self.carrying)
            && (self.unless.is_empty() || !contains(flight, &self.unless))
    }
}

/// Whether `bytes` holds `part`.
fn contains(bytes: &[u8], part: &[u8]) -> bool {
    bytes.windows(part.len()).any(|w| w == part)
}

/// State shared by the accept loop and every connection.
struct State {
    /// Where PostgreSQL listens.
    upstream: SocketAddr,
    /// The current mode.
    mode: watch::Sender<Mode>,
    /// Bumped to close every open connection.
    drops: watch::Sender<u64>,
    /// Whether the next COMMIT cuts its connection.
    commit_armed: AtomicBool,
    /// How many connections were cut after their COMMIT or their marked statement.
    commits_cut: AtomicUsize,
    /// The armed markers, in order: the next statement that the first one marks cuts its
    /// connection once it ran, and the next marker is armed.
    marker: Mutex<std::collections::VecDeque<Marker>>,
    /// The `application_name` of every connection's startup packet, in arrival order.
    startups: Mutex<Vec<String>>,
    /// When each connection refused under [`Mode::Refuse`] arrived, and its `application_name`.
    refused: Mutex<Vec<(std::time::Instant, String)>>,
}

/// A running proxy; dropping it closes its listener and every connection.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Shared state.
    state: Arc<State>,
    /// The accept loop.
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on a free local port in front of `upstream`, passing traffic.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            mode: watch::Sender::new(Mode::Pass),
            drops: watch::Sender::new(0),
            commit_armed: AtomicBool::new(false),
            commits_cut: AtomicUsize::new(0),
            marker: Mutex::default(),
            startups: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
        });
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, Arc::clone(&shared)));
            }
        });
        Proxy { addr, state, task }
    }

    /// The proxy in front of the test server (`DATABASE_URL`'s host and port).
    pub async fn in_front_of_test_server() -> Proxy {
        let admin = crate::support::admin_config();
        let host = match admin.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = admin.get_ports().first().copied().unwrap_or(5432);
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        Proxy::start(upstream).await
    }

    /// `url` with its host and port replaced by the proxy's, and `sslmode=disable`: the proxy
    /// reads the protocol, which TLS would hide from it.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme_user, rest) = url.split_once('@').unwrap();
        let (_, path) = rest.split_once('/').unwrap();
        let join = if path.contains('?') { '&' } else { '?' };
        format!("{scheme_user}@{}/{path}{join}sslmode=disable", self.addr)
    }

    /// Sets the mode; connections already open follow it at once.
    pub fn set_mode(&self, mode: Mode) {
        self.state.mode.send_replace(mode);
    }

    /// Closes every open connection, both sides (new ones are still accepted).
    pub fn drop_all(&self) {
        self.state.drops.send_modify(|g| *g += 1);
    }

    /// Arms the cut: the next COMMIT any connection sends reaches the server, and that
    /// connection is then closed before the server's reply is relayed.
    pub fn cut_next_commit(&self) {
        self.state.commit_armed.store(true, Ordering::SeqCst);
    }

    /// Arms the cut of a statement: the next one any connection sends whose messages carry
    /// `marker` reaches the server up to its `Sync`, and that connection is then closed before
    /// the server's reply is relayed. Markers armed while one waits are armed after it, in
    /// order.
    pub fn cut_next_statement_carrying(&self, marker: &[u8]) {
        self.cut_next_statement_carrying_unless(marker, b"");
    }

    /// [`Proxy::cut_next_statement_carrying`] `marker`, passing statements that also carry
    /// `unless`.
    pub fn cut_next_statement_carrying_unless(&self, marker: &[u8], unless: &[u8]) {
        self.state.marker.lock().unwrap().push_back(Marker {
            carrying: marker.to_vec(),
            unless: unless.to_vec(),
        });
    }

    /// How many connections were cut after their COMMIT or their marked statement.
    pub fn commits_cut(&self) -> usize {
        self.state.commits_cut.load(Ordering::SeqCst)
    }

    /// The connections refused under [`Mode::Refuse`] that arrived at or after `since`: when,
    /// and their `application_name`.
    pub fn refused_since(&self, since: std::time::Instant) -> Vec<(std::time::Instant, String)> {
        let refused = self.state.refused.lock().unwrap();
        refused
            .iter()
            .filter(|(at, _)| *at >= since)
            .cloned()
            .collect()
    }

    /// How many connections so far started with `application_name` = `app`.
    pub fn startups_of(&self, app: &str) -> usize {
        self.state
            .startups
            .lock()
            .unwrap()
            .iter()
            .filter(|a| *a == app)
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.set_mode(Mode::Pass);
        self.drop_all();
    }
}

/// What the two directions of one connection share about a cut COMMIT.
#[derive(Default)]
struct Cut {
    /// The COMMIT was sent: relay nothing more from the server.
    sent: AtomicBool,
    /// The server answered (or closed) after the COMMIT.
    answered: Notify,
}

/// Relays one client connection until either side ends, the proxy drops it, or a cut.
async fn serve(mut client: TcpStream, state: Arc<State>) {
    if *state.mode.borrow() == Mode::Refuse {
        let arrived = std::time::Instant::now();
        let mut len = [0u8; 4];
        if client.read_exact(&mut len).await.is_ok() {
            let mut startup = len.to_vec();
            startup.resize(
                usize::try_from(i32::from_be_bytes(len)).unwrap_or(4).max(8),
                0,
            );
            if client.read_exact(&mut startup[4..]).await.is_ok() {
                let app = application_name(&startup);
                state.refused.lock().unwrap().push((arrived, app));
            }
        }
        return;
    }
    let mut drops = state.drops.subscribe();
    let Ok(server) = TcpStream::connect(state.upstream).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let cut = Cut::default();
    tokio::select! {
        () = upstream(client_read, server_write, &state, &cut) => {}
        () = downstream(server_read, client_write, &state, &cut) => {}
        _ = drops.changed() => {}
    }
}

/// Waits until traffic may flow.
async fn passable(state: &State) {
    let mut mode = state.mode.subscribe();
    let _ = mode.wait_for(|m| *m == Mode::Pass).await;
}

/// The length of the next complete frontend message in `buf`, if there is one. Before the
/// startup packet, messages carry no type byte.
fn next_message_len(buf: &[u8], started: bool) -> Option<usize> {
    let header = usize::from(started);
    let len_bytes: [u8; 4] = buf.get(header..header + 4)?.try_into().ok()?;
    let total = header + usize::try_from(i32::from_be_bytes(len_bytes)).ok()?;
    (buf.len() >= total).then_some(total)
}

/// The `application_name` of a startup packet (empty if it names none).
fn application_name(startup: &[u8]) -> String {
    let fields: Vec<&[u8]> = startup[8..].split(|b| *b == 0).collect();
    fields
        .chunks(2)
        .find(|pair| pair[0] == b"application_name")
        .and_then(|pair| pair.get(1))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// Whether a typed frontend message is the simple query `COMMIT`.
fn is_commit(message: &[u8]) -> bool {
    message[0] == b'Q'
        && String::from_utf8_lossy(&message[5..])
            .trim_end_matches('\0')
            .trim()
            .trim_end_matches(';')
            .eq_ignore_ascii_case("commit")
}

/// Whether the statement whose messages are `flight` is marked by the armed marker, which it
/// then disarms (arming the next).
fn marked(flight: &[u8], state: &State) -> bool {
    let mut markers = state.marker.lock().unwrap();
    let found = markers.front().is_some_and(|m| m.marks(flight));
    if found {
        markers.pop_front();
    }
    found
}

/// Client to server, message by message.
async fn upstream(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: &State, cut: &Cut) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut started = false;
    // The messages of the statement being sent, up to its Sync: cut there if marked.
    let mut flight = Vec::new();
    loop {
        while let Some(len) = next_message_len(&buf, started) {
            let message: Vec<u8> = buf.drain(..len).collect();
            let cutting = if started {
                flight.extend_from_slice(&message);
                let sync = message[0] == b'S';
                let cut_here = sync && marked(&flight, state);
                // A simple query, or the end of a COPY's data, ends what a statement sent.
                if sync || matches!(message[0], b'Q' | b'c' | b'f') {
                    flight.clear();
                }
                cut_here
                    || (is_commit(&message) && state.commit_armed.swap(false, Ordering::SeqCst))
            } else {
                // An SSL or GSS request is followed by another untyped message; only the
                // startup packet switches to typed messages.
                if message.len() >= 8
                    && i32::from_be_bytes(message[4..8].try_into().unwrap()) == PROTOCOL_3
                {
                    started = true;
                    state
                        .startups
                        .lock()
                        .unwrap()
                        .push(application_name(&message));
                }
                false
            };
            passable(state).await;
            if cutting {
                cut.sent.store(true, Ordering::SeqCst);
            }
            if to.write_all(&message).await.is_err() {
                return;
            }
            if cutting {
                // The outcome is decided once the server answers; the answer is never relayed.
                let _ =
                    tokio::time::timeout(Duration::from_secs(60), cut.answered.notified()).await;
                state.commits_cut.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                passable(state).await;
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Server to client, byte for byte (nothing at all after a cut COMMIT).
async fn downstream(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: &State, cut: &Cut) {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut chunk).await.unwrap_or(0);
        if cut.sent.load(Ordering::SeqCst) {
            cut.answered.notify_one();
            if n == 0 {
                std::future::pending::<()>().await;
            }
            continue;
        }
        passable(state).await;
        if n == 0 || to.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}
