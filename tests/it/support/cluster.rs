//! A private PostgreSQL cluster for the tests that must restart or crash the server: restarting
//! the shared test server would break every other test, so such a test runs its own (initdb into
//! a temporary directory, on a free port), which a guard stops and deletes.

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A private PostgreSQL cluster, stopped and deleted when dropped.
pub struct Cluster {
    /// The PostgreSQL binaries (`initdb`, `pg_ctl`).
    bin: PathBuf,
    /// The data directory (inside a temporary directory owned by `postgres`).
    data: PathBuf,
    /// The TCP port it listens on (127.0.0.1 only).
    port: u16,
}

impl Cluster {
    /// The newest installed PostgreSQL's binary directory.
    fn bin() -> PathBuf {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL binaries under /usr/lib/postgresql")
            .filter_map(|e| {
                let e = e.ok()?;
                let version = e.file_name().to_str()?.parse().ok()?;
                Some((version, e.path().join("bin")))
            })
            .filter(|(_, bin)| bin.join("initdb").exists())
            .collect();
        versions.sort();
        versions.pop().expect("an installed PostgreSQL").1
    }

    /// Runs PostgreSQL tool `tool` with `args` as the `postgres` OS user (initdb refuses root).
    fn run(&self, tool: &str, args: &[&str]) {
        let status = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "{tool} {args:?} failed");
    }

    /// The data directory as an argument.
    fn data(&self) -> &str {
        self.data.to_str().unwrap()
    }

    /// Creates and starts a cluster: trust auth, 127.0.0.1 only, on a free port, its socket in
    /// its own directory, no fsync (nothing here survives the test).
    pub fn start() -> Cluster {
        Cluster::start_with("")
    }

    /// [`Cluster::start`] with `settings` (lines of `postgresql.conf`) added.
    pub fn start_with(settings: &str) -> Cluster {
        let dir = Cluster::postgres_dir();
        let cluster = Cluster {
            bin: Cluster::bin(),
            data: dir.join("data"),
            port: free_port(),
        };
        cluster.run(
            "initdb",
            &[
                "-D",
                cluster.data(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        cluster.configure(&format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nfsync = off\nmax_connections = 60\n{settings}\n",
            cluster.port,
            dir.display()
        ));
        cluster.pg_ctl(&["start"]);
        cluster
    }

    /// [`Cluster::start`] speaking TLS only, over TCP: `ssl = on` with the certificate `cert_pem`
    /// and its key `key_pem`, and a `pg_hba.conf` of `hostssl` lines only (trust, but SCRAM for a
    /// role `etl_scram` should a test create it), so a plaintext connection is refused;
    /// `settings` (lines of `postgresql.conf`) added. Started plain first, then stopped, given
    /// its files and started again (initdb wants an empty directory, and the server its key
    /// before it starts).
    pub fn start_tls(cert_pem: &str, key_pem: &str, settings: &str) -> Cluster {
        use std::os::unix::fs::PermissionsExt;
        let cluster = Cluster::start();
        cluster.pg_ctl(&["stop"]);
        let dir = cluster.data.parent().unwrap();
        let hba = "local all all trust\nhostssl all etl_scram 127.0.0.1/32 scram-sha-256\n\
                   hostssl all all 127.0.0.1/32 trust\n";
        for (name, contents) in [
            ("server.crt", cert_pem),
            ("server.key", key_pem),
            ("pg_hba_tls.conf", hba),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, contents).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            chown(&path);
        }
        let conf = format!(
            "\nssl = on\nssl_cert_file = '{0}/server.crt'\nssl_key_file = '{0}/server.key'\nhba_file = '{0}/pg_hba_tls.conf'\n{settings}\n",
            dir.display()
        );
        cluster.configure(&conf);
        cluster.pg_ctl(&["start"]);
        cluster
    }

    /// Runs `pg_ctl` on the cluster, waiting for it, logging next to the data directory.
    pub fn pg_ctl(&self, args: &[&str]) {
        let log = self.data.parent().unwrap().join("server.log");
        let mut all = vec!["-D", self.data(), "-w", "-l", log.to_str().unwrap()];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all);
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.parent().unwrap().join("server.log")).unwrap_or_default()
    }

    /// The TCP port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on the cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The bytes of the WAL from LSN `from` to LSN `to` (as byte positions), read from the
    /// segment files of timeline 1 (a fresh cluster's) of the default 16 MiB size. Only what
    /// the server flushed is on disk: take `to` from `pg_current_wal_flush_lsn()`.
    pub fn wal_bytes(&self, from: i64, to: i64) -> Vec<u8> {
        const SEGMENT: i64 = 16 * 1024 * 1024;
        let mut out = Vec::new();
        let mut at = from;
        while at < to {
            let segment = at / SEGMENT;
            let name = format!(
                "{:08X}{:08X}{:08X}",
                1,
                segment / (0x1_0000_0000 / SEGMENT),
                segment % (0x1_0000_0000 / SEGMENT)
            );
            let bytes = std::fs::read(self.data.join("pg_wal").join(name)).unwrap();
            let start = usize::try_from(at % SEGMENT).unwrap();
            let end = usize::try_from((to - segment * SEGMENT).min(SEGMENT)).unwrap();
            out.extend_from_slice(&bytes[start..end]);
            at = (segment + 1) * SEGMENT;
        }
        out
    }
}

/// Gives `path` to the `postgres` OS user, whom the server runs as.
fn chown(path: &Path) {
    let chown = Command::new("chown")
        .args(["postgres:postgres", path.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(chown.success());
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", self.data(), "-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(Path::new(&self.data).parent().unwrap());
    }
}

/// A primary and its streaming standby (`pg_basebackup -R`, through a replication slot), each a
/// private [`Cluster`] on a free port, both stopped and deleted when dropped.
pub struct Replicated {
    /// The cluster that accepts writes until it is stopped.
    pub primary: Cluster,
    /// The hot standby streaming from it, promoted by [`Replicated::promote`].
    pub standby: Cluster,
    /// The replication connection's path from the primary to the standby.
    link: Link,
}

/// A TCP relay between a standby and its primary that can be paused (the standby then falls
/// behind: what the primary sends waits in the relay's socket buffers, and the primary's WAL
/// sender blocks once they are full) and cut (whatever waited is discarded, as a crash of the
/// primary loses what its standby had not received).
struct Link {
    /// Where the standby connects.
    port: u16,
    /// While set, nothing is relayed from the primary to the standby.
    paused: Arc<AtomicBool>,
    /// Once set, every relayed connection ends and no new one is relayed.
    cut: Arc<AtomicBool>,
}

impl Link {
    /// Starts relaying connections on a free port to 127.0.0.1:`to`.
    fn start(to: u16) -> Link {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let link = Link {
            port: listener.local_addr().unwrap().port(),
            paused: Arc::new(AtomicBool::new(false)),
            cut: Arc::new(AtomicBool::new(false)),
        };
        let (paused, cut) = (Arc::clone(&link.paused), Arc::clone(&link.cut));
        std::thread::spawn(move || {
            for standby in listener.incoming() {
                if cut.load(Ordering::SeqCst) {
                    return;
                }
                let (Ok(standby), Ok(primary)) =
                    (standby, std::net::TcpStream::connect(("127.0.0.1", to)))
                else {
                    continue;
                };
                let never = Arc::new(AtomicBool::new(false));
                relay(&standby, &primary, Arc::clone(&never), Arc::clone(&cut));
                relay(&primary, &standby, Arc::clone(&paused), Arc::clone(&cut));
            }
        });
        link
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the cut and ends.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` on a thread of its own, reading nothing while `paused`, until either
/// side closes or `cut` is set (then both sockets are shut down).
fn relay(
    from: &std::net::TcpStream,
    to: &std::net::TcpStream,
    paused: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
) {
    use std::io::{Read, Write};
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    from.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buffer = [0; 16 * 1024];
        while !cut.load(Ordering::SeqCst) {
            if paused.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Both);
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

/// How the primary of a [`Replicated`] pair waits for its standby at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`: a commit returns once the standby has flushed it.
    Synchronous,
    /// No synchronous standby: a commit returns once it is flushed locally, and the standby
    /// follows as fast as it can.
    Asynchronous,
}

impl Replicated {
    /// Starts a primary (`wal_level = replica`, `hot_standby = on`, `synchronous_commit = on`,
    /// and for [`Replication::Synchronous`] `synchronous_standby_names = '*'`) and a standby
    /// cloned from it with `pg_basebackup -R`, and waits until the standby streams.
    pub fn start(replication: Replication) -> Replicated {
        let sync = match replication {
            Replication::Synchronous => "'*'",
            Replication::Asynchronous => "''",
        };
        let primary = Cluster::start_with(&format!(
            "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\n\
             synchronous_commit = on\nsynchronous_standby_names = {sync}"
        ));
        let standby = primary.standby();
        let link = Link::start(primary.port);
        // Appended last, so it wins over the connection string pg_basebackup -R wrote.
        standby.configure_auto(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'\n",
            link.port
        ));
        standby.pg_ctl(&["start"]);
        let replicated = Replicated {
            primary,
            standby,
            link,
        };
        replicated.until_streaming();
        replicated
    }

    /// Waits (at most a minute) until the primary reports its standby streaming.
    fn until_streaming(&self) {
        for _ in 0..600 {
            let out = Command::new("psql")
                .args([
                    &self.primary.url("postgres"),
                    "-XAtc",
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                ])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).trim() == "1" {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the standby never streamed");
    }

    /// Stops the primary as a crash would (`pg_ctl stop -m immediate`: no checkpoint, no
    /// goodbye to its clients or its standby).
    pub fn crash_primary(&self) {
        self.link.cut.store(true, Ordering::SeqCst);
        self.primary.pg_ctl(&["-m", "immediate", "stop"]);
    }

    /// Stops relaying the primary's WAL to the standby, which falls behind from now on (under
    /// synchronous replication, commits wait); [`Replicated::crash_primary`] then discards what
    /// it had not received.
    pub fn pause_replication(&self) {
        self.link.paused.store(true, Ordering::SeqCst);
    }

    /// Promotes the standby (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) {
        self.standby.pg_ctl(&["promote"]);
    }

    /// The multi-host URL of database `name` on both clusters, primary first, that connects only
    /// to the one accepting writes (`target_session_attrs=read-write`).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{name}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }
}

impl Cluster {
    /// A new temporary directory owned by `postgres`, for a cluster's data and socket.
    fn postgres_dir() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("durable-etl-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).unwrap();
        chown(&dir);
        dir
    }

    /// A standby of this cluster, not started: `pg_basebackup -R` through a new replication
    /// slot, on a free port and its own socket directory.
    fn standby(&self) -> Cluster {
        let dir = Cluster::postgres_dir();
        let standby = Cluster {
            bin: self.bin.clone(),
            data: dir.join("data"),
            port: free_port(),
        };
        let port = self.port.to_string();
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                standby.data(),
                "-R",
                "-X",
                "stream",
                "-C",
                "-S",
                "standby",
                "--no-sync",
            ],
        );
        standby.configure(&format!(
            "\nport = {}\nunix_socket_directories = '{}'\nsynchronous_standby_names = ''\n",
            standby.port,
            dir.display()
        ));
        standby
    }

    /// Appends `lines` to the cluster's `postgresql.conf`.
    fn configure(&self, lines: &str) {
        self.append_to("postgresql.conf", lines);
    }

    /// Appends `lines` to the cluster's `postgresql.auto.conf` (where `pg_basebackup -R` writes).
    fn configure_auto(&self, lines: &str) {
        self.append_to("postgresql.auto.conf", lines);
    }

    /// Appends `lines` to the file `name` of the data directory.
    fn append_to(&self, name: &str, lines: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join(name))
            .unwrap()
            .write_all(lines.as_bytes())
            .unwrap();
    }
}
