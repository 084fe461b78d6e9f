//! TLS to PostgreSQL (#27), against a private cluster that speaks only TLS over TCP
//! ([`Cluster::start_tls`]: a plaintext connection is refused), with a CA and a server
//! certificate for `localhost` made here; and a connection attempt bounded end to end, against
//! a listener that accepts and never answers.

use crate::support::{eventually, spawn_replica, Cluster};
use durable_etl::codes::Code;
use durable_etl::config::DatabaseConfig;
use durable_etl::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A CA, a server certificate it signed for `localhost` only, and a second CA that signed
/// nothing here; the CAs' certificates written to files, deleted when dropped.
struct Pki {
    /// The directory of the files.
    dir: PathBuf,
    /// The server's certificate, PEM.
    cert: String,
    /// The server's key, PEM.
    key: String,
}

impl Pki {
    /// Makes them.
    fn new() -> Pki {
        let dir =
            std::env::temp_dir().join(format!("durable-etl-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(Pki::ca_params(), ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let other = rcgen::CertifiedIssuer::self_signed(
            Pki::ca_params(),
            rcgen::KeyPair::generate().unwrap(),
        )
        .unwrap();
        std::fs::write(dir.join("other-ca.pem"), other.pem()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        Pki {
            dir,
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A CA's parameters.
    fn ca_params() -> rcgen::CertificateParams {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "durable-etl test CA");
        params
    }

    /// The file of the CA that signed the server's certificate.
    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The file of the CA that did not.
    fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The URL of database `name` on `cluster` through `host`, with `params` (a query string).
fn url(cluster: &Cluster, host: &str, name: &str, params: &str) -> String {
    let url = cluster
        .url(name)
        .replace("@127.0.0.1:", &format!("@{host}:"));
    format!("{url}?{params}")
}

/// `params` with `sslrootcert` = `root`.
fn rooted(params: &str, root: &Path) -> String {
    format!("{params}&sslrootcert={}", root.display())
}

/// Connects a session with the library's connector (role `test`), with a short connect timeout.
async fn connect(url: &str) -> Result<tokio_postgres::Client, Error> {
    let cfg = DatabaseConfig {
        connect_timeout: Duration::from_secs(5),
        ..DatabaseConfig::new(url)
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        durable_etl::db::connect(&cfg, "test"),
    )
    .await
    .expect("a connection attempt that ends")
}

/// Whether the session of `client` is encrypted, as the server sees it.
async fn encrypted(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Asserts that connecting to `url` is refused at once, permanently, for a TLS reason.
async fn assert_tls_refused(url: &str, reason: &str) {
    let started = std::time::Instant::now();
    let Err(e) = connect(url).await else {
        panic!("{url} connected");
    };
    assert_eq!(e.code(), Code::DatabaseRefused, "{url}: {e}");
    assert!(matches!(e, Error::Refused { .. }), "{url}: {e}");
    assert!(e.to_string().contains(reason), "{url}: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{url}: retried?"
    );
}

/// Every `sslmode` against a server that speaks only TLS: `disable` is refused by its
/// `pg_hba.conf`; `prefer` (also the default) and `require` are encrypted, with trust or SCRAM
/// authentication; `verify-full` with the
/// right root passes and with another CA's is refused at once as `database_refused`, as is
/// `verify-ca` with another CA's and `require` given one (then it verifies as `verify-ca`);
/// a host the certificate does not name fails `verify-full` but passes `verify-ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_every_sslmode_connects_or_is_refused_as_libpq_would() {
    let pki = Pki::new();
    let cluster = Cluster::start_tls(&pki.cert, &pki.key, "");
    let (ca, other) = (pki.ca(), pki.other_ca());
    for params in ["", "sslmode=prefer", "sslmode=require"] {
        let client = connect(&url(&cluster, "127.0.0.1", "postgres", params))
            .await
            .unwrap();
        assert!(encrypted(&client).await, "{params}");
    }
    // SCRAM authentication over TLS (no channel binding offered).
    let admin = connect(&url(&cluster, "127.0.0.1", "postgres", "sslmode=require"))
        .await
        .unwrap();
    admin
        .batch_execute("CREATE ROLE etl_scram LOGIN PASSWORD 'scram-pw-1'")
        .await
        .unwrap();
    let scram = cluster
        .url("postgres")
        .replace("postgres@", "etl_scram:scram-pw-1@");
    let client = connect(&format!("{scram}?sslmode=require")).await.unwrap();
    assert!(encrypted(&client).await);
    let plain = connect(&url(&cluster, "127.0.0.1", "postgres", "sslmode=disable")).await;
    assert_eq!(plain.err().map(|e| e.code()), Some(Code::DatabaseRefused));
    for (host, params) in [
        ("localhost", rooted("sslmode=verify-full", &ca)),
        ("localhost", rooted("sslmode=verify-ca", &ca)),
        ("127.0.0.1", rooted("sslmode=verify-ca", &ca)),
        ("127.0.0.1", rooted("sslmode=require", &ca)),
    ] {
        let client = connect(&url(&cluster, host, "postgres", &params))
            .await
            .unwrap();
        assert!(encrypted(&client).await, "{host} {params}");
    }
    let refused = "the TLS handshake was refused";
    for (host, params) in [
        ("localhost", rooted("sslmode=verify-full", &other)),
        ("localhost", rooted("sslmode=verify-ca", &other)),
        ("127.0.0.1", rooted("sslmode=require", &other)),
        // The certificate names `localhost` only.
        ("127.0.0.1", rooted("sslmode=verify-full", &ca)),
        // No root file: the system's roots, which do not know the test's CA.
        ("localhost", "sslmode=verify-full".to_owned()),
    ] {
        assert_tls_refused(&url(&cluster, host, "postgres", &params), refused).await;
    }
}

/// A replica of the real binary runs a job end to end over `verify-full` (its pool, claim,
/// commit and liveness sessions all encrypted; its root certificate given by
/// `--database-ssl-root-cert`), after `migrate` created and migrated the database over it
/// (`sslrootcert` in the URL); the same replica given another CA's root exits 2 `database_refused` at
/// once instead of retrying for the start-up timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_replica_runs_a_job_over_verify_full_and_refuses_an_untrusted_server_at_once() {
    let pki = Pki::new();
    // TLS 1.2 here (1.3 elsewhere), so both protocols' handshake signatures are checked.
    let cluster = Cluster::start_tls(&pki.cert, &pki.key, "ssl_max_protocol_version = 'TLSv1.2'");
    let trusted = url(
        &cluster,
        "localhost",
        "etl",
        &rooted("sslmode=verify-full", &pki.ca()),
    );
    let migrated = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &trusted)
        .args(["migrate", "--create-database"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(migrated.success());
    let client = connect(&trusted).await.unwrap();
    let ids = crate::support::enqueue_loads(&client, "tls", 3, 2, 3).await;
    // The root certificate given by flag this time, not in the URL.
    let flagged = url(&cluster, "localhost", "etl", "sslmode=verify-full");
    let ca = pki.ca();
    let flag = ["--database-ssl-root-cert", ca.to_str().unwrap()];
    let mut replica = spawn_replica(&flagged, "tls-a", &flag, Stdio::null());
    crate::support::until_all_terminal(&client).await;
    for id in ids {
        let row = crate::support::job_row(&client, id).await;
        assert_eq!(row.status, "succeeded");
    }
    eventually("the replica's sessions to show", || {
        let client = &client;
        async move {
            let roles: Vec<String> = crate::support::first_column(
                client,
                "SELECT DISTINCT application_name FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'durable-etl/%'",
            )
            .await;
            [
                "durable-etl/claimer",
                "durable-etl/session",
                "durable-etl/worker",
            ]
            .iter()
            .all(|role| roles.iter().any(|r| r == role))
        }
    })
    .await;
    let plaintext: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.datname = current_database() AND a.application_name LIKE 'durable-etl/%'
                AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plaintext, 0);
    crate::support::signal(&replica, "TERM");
    assert_eq!(replica.wait().unwrap().code(), Some(0));

    let untrusted = url(
        &cluster,
        "localhost",
        "etl",
        &rooted("sslmode=verify-full", &pki.other_ca()),
    );
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &untrusted)
        .args(["work", "--owner-id", "tls-b", "--startup-timeout", "60s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the TLS handshake was refused"), "{err}");
    assert!(err.contains("[database_refused]"), "{err}");
    assert!(!err.contains("retrying"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A listener that answers every TLS request with `answer` (`N`: no TLS here; `S`: go ahead)
/// and then hangs up; returns its port.
async fn answering(answer: u8) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            // The SSLRequest: length 8, code 80877103.
            let mut request = [0; 8];
            if socket.read_exact(&mut request).await.is_ok() {
                let _ = socket.write_all(&[answer]).await;
            }
        }
    });
    port
}

/// A server that does not speak TLS (it answers the TLS request "no") is refused at once under
/// `sslmode=require`, saying so, while a real one with `ssl = off` serves the default `prefer`
/// in plaintext; a server that agrees to TLS and hangs up mid-handshake is a lost connection
/// (retried), not a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_require_refuses_a_server_without_tls_which_prefer_uses_in_plaintext() {
    let no = answering(b'N').await;
    assert_tls_refused(
        &format!("postgres://postgres@127.0.0.1:{no}/db?sslmode=require"),
        "the server does not speak TLS, which the URL's sslmode requires",
    )
    .await;
    let cut = answering(b'S').await;
    let lost = connect(&format!(
        "postgres://postgres@127.0.0.1:{cut}/db?sslmode=require"
    ))
    .await;
    assert!(matches!(lost, Err(Error::Unavailable(Some(_)))), "{lost:?}");
    let plain = Cluster::start();
    let client = connect(&plain.url("postgres")).await.unwrap();
    assert!(!encrypted(&client).await);
}

/// `what`, given a generous 30 s to end (a hang fails the test instead of stalling it).
fn bounded<F: std::future::Future>(what: F) -> tokio::time::Timeout<F> {
    tokio::time::timeout(Duration::from_secs(30), what)
}

/// A host that accepts TCP and never answers costs one connect timeout: as the first host of a
/// multi-host URL (with `target_session_attrs`), the next host, the real server, is connected
/// to, by a one-off session and by a pool's manager alike; alone, the attempt fails as a lost connection (timed out) instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_host_that_never_answers_costs_one_connect_timeout_and_the_next_host_is_tried() {
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_port = hang.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hang.accept().await {
            held.push(socket);
        }
    });
    let real = crate::support::admin_config();
    let real_port = real.get_ports().first().copied().unwrap_or(5432);
    let config = |url: String| DatabaseConfig {
        connect_timeout: Duration::from_secs(1),
        ..DatabaseConfig::new(url)
    };
    let both = config(format!(
        "postgres://postgres@127.0.0.1:{hang_port},127.0.0.1:{real_port}/postgres?target_session_attrs=read-write"
    ));
    let client = bounded(durable_etl::db::connect(&both, "test"))
        .await
        .expect("the hanging host was given up")
        .unwrap();
    client.simple_query("SELECT 1").await.unwrap();
    let pool = bounded(durable_etl::db::connect_pool(&both, "test"))
        .await
        .expect("the hanging host was given up by the pool")
        .unwrap();
    // Two at once: the second is a new session, through the pool's manager, which gives the
    // hanging host up too (the checkout waits one connect timeout per host).
    let first = durable_etl::db::checkout(&pool).await.unwrap();
    let second = bounded(durable_etl::db::checkout(&pool))
        .await
        .expect("the pool's manager gave the hanging host up")
        .unwrap();
    second.simple_query("SELECT 1").await.unwrap();
    drop((first, second));
    let alone = config(format!(
        "postgres://postgres@127.0.0.1:{hang_port}/postgres"
    ));
    let Err(e) = bounded(durable_etl::db::connect(&alone, "test"))
        .await
        .expect("an attempt at a host that never answers ends")
    else {
        panic!("connected to a host that never answers");
    };
    assert_eq!(e.code(), Code::DatabaseUnavailable, "{e}");
    let Error::Unavailable(Some(source)) = e else {
        panic!("not a lost connection: {e}");
    };
    let kind = std::error::Error::source(&source)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    assert_eq!(kind, Some(std::io::ErrorKind::TimedOut));
}
