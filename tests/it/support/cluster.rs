//! A private PostgreSQL cluster for the tests that must restart or crash the server: restarting
//! the shared test server would break every other test, so such a test runs its own (initdb into
//! a temporary directory, on a free port), which a guard stops and deletes.

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
        let dir =
            std::env::temp_dir().join(format!("durable-etl-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).unwrap();
        chown(&dir);
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
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nfsync = off\nmax_connections = 60\n{settings}\n",
            cluster.port,
            dir.display()
        );
        cluster.append_conf(&conf);
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
        cluster.append_conf(&conf);
        cluster.pg_ctl(&["start"]);
        cluster
    }

    /// Appends `conf` to the cluster's `postgresql.conf`.
    fn append_conf(&self, conf: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .unwrap()
            .write_all(conf.as_bytes())
            .unwrap();
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
