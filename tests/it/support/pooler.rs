//! A private PgBouncer for the tests that need a pooler between the process and the server: it
//! listens on a free port of 127.0.0.1, knows only the databases a test gives it, drops to the
//! `postgres` OS user (PgBouncer refuses to run as root), and a guard stops it and deletes its directory.

use super::free_port;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running PgBouncer, stopped and deleted when dropped.
pub struct Pooler {
    /// Its directory: configuration, user list and log.
    dir: PathBuf,
    /// The TCP port it listens on (127.0.0.1 only).
    port: u16,
    /// The PgBouncer process (in the foreground, so the guard can kill it).
    child: Child,
}

impl Pooler {
    /// Starts PgBouncer in `pool_mode` with `databases` (lines of its `[databases]` section), trust
    /// authentication, `postgres` the only user it knows, and the startup parameter `options`
    /// ignored (as docs/operations.md asks); returns once it accepts connections.
    pub fn start(pool_mode: &str, databases: &str) -> Pooler {
        Pooler::start_with(pool_mode, databases, "ignore_startup_parameters = options")
    }

    /// [`Pooler::start`] with `settings` (lines of its `[pgbouncer]` section) in place of the
    /// ignored startup parameter.
    pub fn start_with(pool_mode: &str, databases: &str, settings: &str) -> Pooler {
        let dir = std::env::temp_dir().join(format!(
            "durable-etl-pgbouncer-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).unwrap();
        let port = free_port();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n{databases}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nauth_type = trust\nauth_file = {users}\npool_mode = {pool_mode}\n\
             logfile = {log}\n{settings}\n",
            users = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        let chown = Command::new("chown")
            .args(["-R", "postgres:postgres", dir.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(chown.success());
        let child = Command::new("/usr/sbin/pgbouncer")
            .args(["-u", "postgres"])
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("/usr/sbin/pgbouncer (Debian package pgbouncer)");
        let pooler = Pooler { dir, port, child };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        pooler
    }

    /// The URL of database `name` through the pooler, as role `user`.
    pub fn url(&self, user: &str, name: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
