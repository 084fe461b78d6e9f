//! Plain PostgreSQL cells on separate servers, named by a directory: the directory lists the
//! cells and their servers and places owners; every command started with `--directory` finds
//! its cell's server there; an application enqueues each owner's jobs in the owner's cell.

use crate::support::{binary, count, eventually, spawn_replica_logged, Cluster, TestDb};
use durable_etl::{directory, Jobs, Secret};
use std::process::{Child, Output, Stdio};

/// The secret owners are digested with, here and in the binary's commands.
const SECRET: &str = "directory-secret-0123456789";

/// A job of the shipped no-op kind.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping {
    /// Which one.
    n: i64,
}

impl durable_etl::Job for Ping {
    const KIND: &'static str = durable_etl::job::handler::NOOP_KIND;
}

/// A replica process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the binary with `args` on the directory at `url`, its secret [`SECRET`].
fn run(url: &str, args: &[&str]) -> Output {
    binary(url, args)
        .env("DURABLE_ETL_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Runs the binary with `args` and returns its standard output, asserting it succeeded.
fn ok(url: &str, args: &[&str]) -> String {
    let out = run(url, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_on_two_servers_run_the_jobs_of_the_owners_the_directory_places_in_them() {
    // The directory and the near cell on the suite's server; the far cell on a server of its
    // own, in a database of the same name (commands keep their URL's database and role).
    let db = TestDb::migrated().await;
    let url = db.config.url.clone();
    let far = Cluster::start();
    connect_to(&far, "postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE \"{}\"", db.name))
        .await
        .unwrap();
    let port = far.port().to_string();
    ok(&url, &["cells", "init"]);
    ok(&url, &["cells", "add", "cell_near"]);
    ok(
        &url,
        &[
            "cells",
            "add",
            "cell_far",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
        ],
    );
    for cell in ["cell_near", "cell_far"] {
        ok(&url, &["migrate", "--directory", "--cell", cell]);
    }
    let far_db = connect_to(&far, &db.name).await;
    let near_db = db.client().await;
    assert_eq!(
        count(&far_db, "pg_namespace WHERE nspname = 'cell_far'").await,
        1
    );
    assert_eq!(
        count(&near_db, "pg_namespace WHERE nspname = 'cell_far'").await,
        0
    );

    // Owners placed by the directory: the first owner of each cell.
    let mut owners = std::collections::BTreeMap::new();
    for i in 0..64 {
        let owner = format!("tenant-{i}");
        let placed = ok(&url, &["cells", "place", "--owner", &owner]);
        owners.entry(placed.trim().to_owned()).or_insert(owner);
        if owners.len() == 2 {
            break;
        }
    }
    assert_eq!(owners.len(), 2, "{owners:?}");

    // Replicas of each cell, given the directory's URL (the poll is a minute away).
    let _replicas: Vec<Running> = ["cell_near", "cell_far"]
        .iter()
        .map(|cell| {
            let args = ["--directory", "--cell", cell, "--poll-interval", "60s"];
            Running(spawn_replica_logged(
                &url,
                &format!("r-{cell}"),
                &args,
                Stdio::null(),
                "warn",
            ))
        })
        .collect();

    // The application enqueues each owner's job in the owner's cell, found in the directory.
    let secret = Secret::new(SECRET).unwrap();
    let directory_session = db.client().await;
    for (cell, owner) in &owners {
        let jobs = Jobs::new(secret.clone(), owner);
        let found = directory::place(&directory_session, &jobs.owner_key())
            .await
            .unwrap();
        assert_eq!(&found, cell);
        let entry = directory::cell(&directory_session, &found).await.unwrap();
        let config = entry.config(&db.config).unwrap();
        let session = durable_etl::db::connect(&config, "app").await.unwrap();
        jobs.enqueue(&session, &Ping { n: 1 }, Default::default())
            .await
            .unwrap();
    }
    let far_cell = in_cell(connect_to(&far, &db.name).await, "cell_far").await;
    let near_cell = in_cell(db.client().await, "cell_near").await;
    eventually("each cell ran its owner's job", || async {
        count(&far_cell, "etl_jobs WHERE status = 'succeeded'").await == 1
            && count(&near_cell, "etl_jobs WHERE status = 'succeeded'").await == 1
    })
    .await;
    assert_eq!(count(&far_cell, "etl_jobs").await, 1);
    assert_eq!(count(&near_cell, "etl_jobs").await, 1);

    let listed = ok(&url, &["cells", "list"]);
    let far_line = listed.lines().find(|l| l.starts_with("cell_far")).unwrap();
    assert!(far_line.contains(&format!("127.0.0.1:{port}")), "{listed}");
    assert!(listed.lines().count() == 3, "{listed}");

    // What the directory cannot answer is refused, exit 2, naming why, and changes nothing.
    for (args, why) in [
        (&["work", "--directory"][..], "--directory finds the server"),
        (
            &["work", "--directory", "--cell", "cell_gone"],
            "no cell of that name",
        ),
        (
            &["cells", "list", "--cell", "cell_near"],
            "the cells commands take neither",
        ),
        (
            &["cells", "add", "cell_near"],
            "a cell of that name already",
        ),
        (&["cells", "close", "cell_gone"], "no cell of that name"),
    ] {
        let refused = run(&url, args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    assert_eq!(ok(&url, &["cells", "list"]), listed);
    let empty = TestDb::empty().await;
    let missing = run(&empty.config.url, &["cells", "list"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cells init"));
    ok(&url, &["cells", "close", "cell_near"]);
    let closed = ok(&url, &["cells", "list"]);
    assert!(closed
        .lines()
        .any(|l| l.starts_with("cell_near") && l.contains(" no ")));
    ok(&url, &["cells", "open", "cell_near"]);
}

/// A plain session on database `name` of `cluster`.
async fn connect_to(cluster: &Cluster, name: &str) -> tokio_postgres::Client {
    crate::support::connect(&cluster.url(name).parse().unwrap()).await
}

/// `client`'s session moved into cell `cell`.
async fn in_cell(client: tokio_postgres::Client, cell: &str) -> tokio_postgres::Client {
    client
        .batch_execute(&format!("SET search_path = {cell}"))
        .await
        .unwrap();
    client
}
