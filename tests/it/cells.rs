//! Cells: deployments in schemas of their own, several in one database, each with its own
//! tables, wake channel, owner locks and enqueue barriers; and the checks that keep a cell's
//! session in its schema.

use crate::handlers::{Noop, NOOP};
use crate::support::{count, eventually, expire_and_recover, insert_jobs, TestDb};
use crate::wake::{config, until_succeeded, Replica};
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::error::Error;
use durable_etl::job::handler::Registry;
use durable_etl::{db, schema};
use serde_json::json;
use std::time::Duration;
use tokio_postgres::Client;

/// `db`'s configuration for cell `cell`.
fn cell_config(db: &TestDb, cell: &str) -> DatabaseConfig {
    DatabaseConfig {
        cell: Some(cell.to_owned()),
        ..db.config.clone()
    }
}

/// A session of cell `cfg` (its search path is the cell's schema alone).
async fn session(cfg: &DatabaseConfig) -> Client {
    db::connect(cfg, "test").await.unwrap()
}

/// Starts a replica of cell `cfg`, owner `owner`, polling once a minute (only wakes bring
/// work), running no-op jobs; waits for its start-up claim.
async fn start(cfg: &DatabaseConfig, owner: &str) -> Replica {
    let pool = db::connect_pool(cfg, "test").await.unwrap();
    let replica = Replica::start_pooled(
        (pool, cfg),
        config(owner, Duration::from_secs(60), 4),
        Registry::new().register(Noop),
    )
    .await;
    let stats = std::sync::Arc::clone(&replica.stats);
    eventually("the start-up claim", || {
        let stats = std::sync::Arc::clone(&stats);
        async move { stats.snapshot().claims == 1 }
    })
    .await;
    replica
}

/// The channel, barrier key space and owner-lock key of owner `one` that `client`'s deployment
/// uses.
async fn names(client: &Client) -> (String, i32, i64) {
    let row = client
        .query_one(
            "SELECT durable_etl_channel(), durable_etl_lock_space(),
                    durable_etl_owner_lock_key('one')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cells_in_one_database_run_their_own_jobs_on_their_own_wakes() {
    let db = TestDb::migrated().await;
    let (a, b) = (cell_config(&db, "cell_a"), cell_config(&db, "cell_b"));
    for cfg in [&a, &b] {
        let report = schema::migrate(cfg).await.unwrap();
        assert_eq!(report.version, schema::latest_version());
        assert_eq!(report.changed.len(), schema::MIGRATIONS.len());
    }
    let (client_a, client_b) = (session(&a).await, session(&b).await);
    // A plain server's cell is found, and has no Citus node to watch.
    assert_eq!(db::check_cell(&client_a, &a).await.unwrap(), None);
    // Each cell names its own channel and barrier keys; the database's first deployment keeps
    // the names it had before cells.
    let public = db.client().await;
    let (na, nb, np) = (
        names(&client_a).await,
        names(&client_b).await,
        names(&public).await,
    );
    assert_eq!(na.0, "durable_etl_jobs.cell_a");
    assert_eq!(nb.0, "durable_etl_jobs.cell_b");
    assert_eq!(np.0, durable_etl::jobs::notifier::CHANNEL);
    assert_eq!(np.1, 1_684_370_540);
    assert!(na.1 != nb.1 && na.1 != np.1 && nb.1 != np.1);
    assert!(na.2 != nb.2 && na.2 != np.2 && nb.2 != np.2);

    // One owner id in both cells: each takes its own owner lock.
    let replica_a = start(&a, "same-owner").await;
    let replica_b = start(&b, "same-owner").await;

    // A's jobs run in A, brought by A's wake alone (the poll is a minute away); B is not woken.
    insert_jobs(&client_a, NOOP, &[json!({}), json!({}), json!({})], 3).await;
    until_succeeded(&client_a, 3).await;
    assert_eq!(replica_b.stats.snapshot().claims, 1, "B woke for A's jobs");
    let claims_a = replica_a.stats.snapshot().claims;
    insert_jobs(&client_b, NOOP, &[json!({}), json!({})], 3).await;
    until_succeeded(&client_b, 2).await;
    assert_eq!(
        replica_a.stats.snapshot().claims,
        claims_a,
        "A woke for B's jobs"
    );
    assert_eq!(replica_a.stats.snapshot().succeeded, 3);
    assert_eq!(replica_b.stats.snapshot().succeeded, 2);
    // Nothing crossed: each cell holds its own jobs, and the database's first deployment none.
    assert_eq!(count(&client_a, "etl_jobs").await, 3);
    assert_eq!(count(&client_b, "etl_jobs").await, 2);
    assert_eq!(count(&public, "etl_jobs").await, 0);

    // Recovery in B does not take A's live replica for B's dead one of the same id.
    replica_b.stop().await.unwrap();
    let stuck = insert_jobs(&client_b, "test.cell_stuck", &[json!({})], 1).await[0];
    crate::support::running_under(&client_b, stuck, "dead-owner").await;
    let dead = start(&a, "dead-owner").await;
    assert_eq!(expire_and_recover(&client_b).await, 1);
    assert_eq!(
        count(&client_b, "etl_jobs WHERE status = 'failed'").await,
        1
    );
    for replica in [replica_a, dead] {
        replica.stop().await.unwrap();
    }
}

#[tokio::test]
async fn a_cell_migrates_down_and_up_alone() {
    let db = TestDb::migrated().await;
    let cell = cell_config(&db, "cell_down");
    schema::migrate(&cell).await.unwrap();
    let mut client = session(&cell).await;
    let down = schema::migrate_down_to(&mut client, 0).await.unwrap();
    assert_eq!(down.version, 0);
    assert_eq!(down.changed.len(), schema::MIGRATIONS.len());
    // The cell's schema holds its migration history alone again (table and key), and no
    // function; the database's first deployment is untouched.
    let left: Vec<String> = crate::support::first_column(
        &client,
        "SELECT relname::text FROM pg_class
          WHERE relnamespace = 'cell_down'::regnamespace ORDER BY 1",
    )
    .await;
    assert_eq!(
        left,
        [
            "durable_etl_schema_history",
            "durable_etl_schema_history_pkey"
        ]
    );
    assert_eq!(
        count(
            &client,
            "pg_proc WHERE pronamespace = 'cell_down'::regnamespace"
        )
        .await,
        0
    );
    let public = db.client().await;
    assert_eq!(
        schema::check_compatible(&public).await.unwrap(),
        schema::latest_version()
    );
    drop(client);
    let up = schema::migrate(&cell).await.unwrap();
    assert_eq!(up.changed.len(), schema::MIGRATIONS.len());
    let client = session(&cell).await;
    let channel: String = client
        .query_one("SELECT durable_etl_channel()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, "durable_etl_jobs.cell_down");
}

#[tokio::test]
async fn a_session_outside_its_cell_is_refused_before_it_migrates_or_runs() {
    let db = TestDb::migrated().await;
    let cell = cell_config(&db, "cell_lost");
    // A session whose search path is not the cell's, as behind a pooler that drops start-up
    // options: refused, and nothing is created in the database's first deployment.
    let outside = db.client().await;
    let refused = |e: Error| matches!(e, Error::Config(ConfigError::CellSchema));
    assert!(refused(db::check_cell(&outside, &cell).await.unwrap_err()));
    assert!(refused(
        schema::enter_cell(&outside, &cell).await.unwrap_err()
    ));
    assert_eq!(db::check_cell(&outside, &db.config).await.unwrap(), None);
    assert_eq!(
        count(&outside, "pg_namespace WHERE nspname = 'cell_lost'").await,
        0
    );
    // A replica whose pool does not reach its cell does not start.
    let pool = db::connect_pool(&db.config, "test").await.unwrap();
    let started = durable_etl::worker::Worker::start(
        pool,
        &cell,
        config("lost", Duration::from_secs(60), 1),
        Registry::new().register(Noop),
    )
    .await;
    assert!(matches!(
        started,
        Err(Error::Config(ConfigError::CellSchema))
    ));
    // A cell's session that finds no schema yet is refused too.
    let before = session(&cell).await;
    assert!(refused(
        db::check_session_settings(&before, &cell)
            .await
            .unwrap_err()
    ));
    schema::migrate(&cell).await.unwrap();
    assert!(db::check_session_settings(&session(&cell).await, &cell)
        .await
        .is_ok());
    // A name that is not a cell's is refused before anything connects.
    for bad in ["", "Cell", "1cell", "pg_cell", "cell-a", &"c".repeat(41)] {
        let cfg = DatabaseConfig {
            cell: Some(bad.to_owned()),
            ..db.config.clone()
        };
        assert_eq!(cfg.validate(), Err(ConfigError::CellName), "{bad}");
    }
    assert_eq!(
        DatabaseConfig {
            cell: Some("c".repeat(40)),
            ..db.config.clone()
        }
        .validate(),
        Ok(())
    );
}

#[tokio::test]
async fn the_command_line_migrates_a_cell_and_its_admin_commands_stay_in_it() {
    let db = TestDb::migrated().await;
    let run = |args: &[&str]| {
        crate::support::binary(&db.config.url, args)
            .output()
            .unwrap()
    };
    let migrated = run(&["migrate", "--cell", "cell_cli"]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        String::from_utf8_lossy(&migrated.stdout)
            .contains(&format!("schema at version {}", schema::latest_version())),
        "{migrated:?}"
    );
    // A queue paused in the cell is paused there alone.
    let paused = run(&["queues", "pause", "default", "--cell", "cell_cli"]);
    assert!(paused.status.success(), "{paused:?}");
    let cell = session(&cell_config(&db, "cell_cli")).await;
    assert_eq!(count(&cell, "etl_queues WHERE paused").await, 1);
    assert_eq!(
        count(&db.client().await, "etl_queues WHERE paused").await,
        0
    );
    // An admin command of a cell that does not exist is refused (exit 2) and creates nothing.
    let missing = run(&["queues", "pause", "default", "--cell", "cell_none"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert_eq!(
        count(&cell, "pg_namespace WHERE nspname = 'cell_none'").await,
        0
    );
}

/// The schema-only dump of schema `schema` of `db` (no owners, no privileges), without its
/// migration history table when `history` is false.
fn dump(db: &TestDb, schema: &str, history: bool) -> String {
    let url: tokio_postgres::Config = db.config.url.parse().unwrap();
    let host = match url.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let mut command = std::process::Command::new("pg_dump");
    command
        .args(["-h", &host, "-p"])
        .arg(url.get_ports().first().copied().unwrap_or(5432).to_string())
        .args(["-U", url.get_user().unwrap_or("postgres"), "-d", &db.name])
        .args([
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "-n",
            schema,
        ]);
    if !history {
        command
            .arg("-T")
            .arg(format!("{schema}.durable_etl_schema_history"));
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The baseline script of a dump of cell [`schema::CELL_TEMPLATE`]: its statements without the
/// dump's comments, settings and schema, names unqualified (the cell's session finds them on
/// its search path), each identity column declared with its table (Citus refuses to add one
/// to a distributed table), and a [`schema::CELL_BASELINE_BREAK`] line between two statements,
/// two of one object's included (Citus sends a statement's whole query string to the worker).
fn baseline_of(dump: &str) -> String {
    let qualifier = format!("{}.", schema::CELL_TEMPLATE);
    let mut lines: Vec<String> = Vec::new();
    let mut identity: Vec<(String, String, String)> = Vec::new();
    let mut skipping_identity = false;
    for line in dump.lines() {
        if skipping_identity {
            skipping_identity = line != ");";
            continue;
        }
        // Each object of the dump is one statement, after its header.
        if line.starts_with("-- Name: ") {
            while lines.last().is_some_and(String::is_empty) {
                lines.pop();
            }
            if !lines.is_empty() {
                lines.push(schema::CELL_BASELINE_BREAK.to_owned());
            }
            continue;
        }
        if line.starts_with("--")
            || line.starts_with("SET ")
            || line.starts_with("SELECT pg_catalog.set_config")
            || line.starts_with("CREATE SCHEMA ")
            || line.starts_with("\\restrict")
            || line.starts_with("\\unrestrict")
        {
            continue;
        }
        let line = line.replace(&qualifier, "");
        // `ALTER TABLE t ALTER COLUMN c ADD GENERATED ALWAYS AS IDENTITY (` … `);`
        if let Some(rest) = line.strip_prefix("ALTER TABLE ") {
            if let Some((table, column)) = rest
                .strip_prefix("ONLY ")
                .unwrap_or(rest)
                .split_once(" ALTER COLUMN ")
            {
                if let Some((column, kind)) = column.split_once(" ADD GENERATED ") {
                    let kind = kind.trim_end_matches(" (").to_owned();
                    identity.push((table.to_owned(), column.to_owned(), kind));
                    skipping_identity = true;
                    continue;
                }
            }
        }
        if line.is_empty()
            && lines
                .last()
                .is_none_or(|l| l.is_empty() || l == schema::CELL_BASELINE_BREAK)
        {
            continue;
        }
        // A second statement of the same object (a table's `REPLICA IDENTITY`) is a statement
        // of its own.
        if line.starts_with("ALTER TABLE ")
            && lines
                .iter()
                .rev()
                .find(|l| !l.is_empty())
                .is_some_and(|l| l.ends_with(';') && l != schema::CELL_BASELINE_BREAK)
        {
            while lines.last().is_some_and(String::is_empty) {
                lines.pop();
            }
            lines.push(schema::CELL_BASELINE_BREAK.to_owned());
        }
        lines.push(line);
    }
    // Declare each identity column in its CREATE TABLE.
    for (table, column, kind) in identity {
        let start = lines
            .iter()
            .position(|l| *l == format!("CREATE TABLE {table} ("))
            .expect("the identity column's table");
        let at = lines[start..]
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{column} ")))
            .map(|i| start + i)
            .expect("the identity column");
        let declared = lines[at].replacen(" NOT NULL", &format!(" GENERATED {kind} NOT NULL"), 1);
        lines[at] = declared;
    }
    let mut script = String::from(
        "-- Every migration's schema at once, for a new cell: generated from a cell the migrations\n\
         -- built, by the cells test (DURABLE_ETL_UPDATE_BASELINE=1 writes it anew). Do not edit.\n\
         -- Its statements run one at a time, split at each `-- ;` line.\n\
         SET LOCAL check_function_bodies = false;\n-- ;\n",
    );
    script.push_str(lines.join("\n").trim());
    script.push('\n');
    script
}

#[tokio::test]
async fn a_cell_built_from_the_baseline_is_the_cell_the_migrations_build() {
    let db = TestDb::migrated().await;
    // The migrations, one by one, in the template cell.
    let template = cell_config(&db, schema::CELL_TEMPLATE);
    let mut client = session(&template).await;
    schema::enter_cell(&client, &template).await.unwrap();
    schema::migrate_up(&mut client).await.unwrap();
    let generated = baseline_of(&dump(&db, schema::CELL_TEMPLATE, false));
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/cell_baseline.sql");
    if std::env::var_os("DURABLE_ETL_UPDATE_BASELINE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    assert!(
        generated == schema::CELL_BASELINE,
        "migrations/cell_baseline.sql is not what the migrations build; write it anew with \
         DURABLE_ETL_UPDATE_BASELINE=1 cargo nextest run -E 'test(a_cell_built_from_the_baseline)'"
    );
    // A cell built from the baseline dumps as the migrations' cell, history included.
    let built = cell_config(&db, "cell_built");
    let report = schema::migrate(&built).await.unwrap();
    assert_eq!(report.version, schema::latest_version());
    assert_eq!(report.changed.len(), schema::MIGRATIONS.len());
    // (`\restrict` lines carry a random key of each dump.)
    let unnamed = |dump: String, cell: &str| -> Vec<String> {
        dump.lines()
            .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
            .map(|l| l.replace(cell, "CELL"))
            .collect()
    };
    let built_dump = unnamed(dump(&db, "cell_built", true), "cell_built");
    let replayed = unnamed(
        dump(&db, schema::CELL_TEMPLATE, true),
        schema::CELL_TEMPLATE,
    );
    let differing: Vec<(&String, &String)> = built_dump
        .iter()
        .zip(&replayed)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        differing.is_empty() && built_dump.len() == replayed.len(),
        "the baseline's cell differs: {differing:?}, {} against {} lines",
        built_dump.len(),
        replayed.len()
    );
    // Its history is the migrations' (checksums checked), and it runs as a cell.
    let cell = session(&built).await;
    assert_eq!(
        schema::check_compatible(&cell).await.unwrap(),
        schema::latest_version()
    );
    assert_eq!(names(&cell).await.0, "durable_etl_jobs.cell_built");
    // Migrating it again applies nothing.
    assert!(schema::migrate(&built).await.unwrap().changed.is_empty());
}

#[tokio::test]
async fn a_bench_in_a_cell_runs_its_replicas_there() {
    let (report, name) = crate::bench::bench(
        "cell",
        &[
            "burn-down",
            "--jobs",
            "200",
            "--replicas",
            "2",
            "--slots",
            "8",
            "--cell",
            "cell_bench",
            "--keep",
        ],
    );
    assert_eq!(report["succeeded"], 200, "{report}");
    // Every job ran in the cell; the database has no other deployment (a replica outside the
    // cell would have found no table).
    let client = crate::bench_queues::kept(&name).await;
    assert_eq!(
        count(&client, "cell_bench.etl_jobs WHERE status = 'succeeded'").await,
        200
    );
    assert_eq!(
        count(&client, "pg_tables WHERE schemaname = 'public'").await,
        0
    );
    drop(client);
    crate::bench_queues::drop_kept(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_several_cells_each_on_its_own_wakes_even_after_losing_every_connection()
{
    let db = TestDb::migrated().await;
    let (a, b, metrics, mut processes) = one_process_of_two_cells(&db, "several").await;
    let http = reqwest::Client::new();
    let scrape = || {
        let request = http.get(format!("http://{metrics}/metrics"));
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    let ready = || {
        let request = http.get(format!("http://{metrics}/readyz"));
        async move { request.send().await.is_ok_and(|r| r.status() == 200) }
    };
    // Each cell's jobs run in it, each woken by its own cell's wake (the poll is a minute away).
    let kind = durable_etl::job::handler::NOOP_KIND;
    let (client_a, client_b) = (session(&a).await, session(&b).await);
    insert_jobs(&client_a, kind, &[json!({}), json!({}), json!({})], 3).await;
    until_succeeded(&client_a, 3).await;
    insert_jobs(&client_b, kind, &[json!({}), json!({})], 3).await;
    until_succeeded(&client_b, 2).await;
    // One exposition, each family once, each sample under its cell.
    let text = scrape().await;
    for series in [
        "durable_etl_jobs_succeeded_total{cell=\"cell_a\"} 3",
        "durable_etl_jobs_succeeded_total{cell=\"cell_b\"} 2",
        "durable_etl_claims_total{cell=\"cell_a\",trigger=\"notify\"}",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    let typed = "# TYPE durable_etl_jobs_succeeded_total counter";
    assert_eq!(text.matches(typed).count(), 1, "{text}");

    // The whole process loses every connection at once: each cell's replica reconnects and
    // hears its own cell's wakes again.
    let admin = db.client().await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let reconnected = |cell: &'static str| {
        let scraped = scrape();
        async move {
            let prefix = format!("durable_etl_session_reconnects_total{{cell=\"{cell}\"}} ");
            let text = scraped.await;
            let value = text.lines().find_map(|l| l.strip_prefix(&prefix));
            value.is_some_and(|v| v != "0")
        }
    };
    eventually("both cells' sessions to reconnect", || async {
        reconnected("cell_a").await && reconnected("cell_b").await && ready().await
    })
    .await;
    let (client_a, client_b) = (session(&a).await, session(&b).await);
    insert_jobs(&client_a, kind, &[json!({})], 3).await;
    insert_jobs(&client_b, kind, &[json!({})], 3).await;
    until_succeeded(&client_a, 4).await;
    until_succeeded(&client_b, 3).await;

    // One signal drains every cell's replica; the process exits cleanly.
    let mut process = processes.0.remove(0);
    crate::support::signal(&process, "TERM");
    assert!(process.wait().unwrap().success());
    for client in [&client_a, &client_b] {
        assert_eq!(
            count(client, "etl_jobs WHERE status <> 'succeeded'").await,
            0
        );
    }
}

#[tokio::test]
async fn work_refuses_cells_it_cannot_serve_and_stops_when_one_cannot_start() {
    let db = TestDb::migrated().await;
    schema::migrate(&cell_config(&db, "cell_a")).await.unwrap();
    let session_url = ["--session-database-url", db.config.url.as_str()];
    for (args, why) in [
        (&["work", "--cells", "cell_a,cell_a"][..], "--cells takes"),
        (&["work", "--cells", "cell_a,Cell"], "--cells takes"),
        (
            &["work", "--cells", "cell_a", "--cell", "cell_a"],
            "--cells takes",
        ),
        (
            &["work", "--cells", "cell_a", "--schedules", "/dev/null"],
            "--cells takes",
        ),
        (
            &[&["work", "--cells", "cell_a"][..], &session_url].concat(),
            "--cells takes",
        ),
        // A cell the database does not hold: no replica of any cell runs.
        (
            &["work", "--cells", "cell_a,cell_none"],
            "not the configured cell",
        ),
    ] {
        let out = crate::support::binary(&db.config.url, args)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}

/// Migrates cells `cell_a` and `cell_b` of `db` and starts one `work --cells` process serving
/// both as owner `owner`, polling once a minute; waits until it is ready. Returns the cells'
/// configurations, its metrics address, and the process.
async fn one_process_of_two_cells(
    db: &TestDb,
    owner: &str,
) -> (
    DatabaseConfig,
    DatabaseConfig,
    String,
    crate::support::Processes,
) {
    let (a, b) = (cell_config(db, "cell_a"), cell_config(db, "cell_b"));
    for cfg in [&a, &b] {
        schema::migrate(cfg).await.unwrap();
    }
    let metrics = format!("127.0.0.1:{}", crate::support::free_port());
    let args = ["--cells", "cell_a,cell_b", "--poll-interval", "60s"];
    let args = [&args[..], &["--metrics-listen", &metrics]].concat();
    let process = crate::support::spawn_replica_logged(
        &db.config.url,
        owner,
        &args,
        std::process::Stdio::null(),
        "warn",
    );
    let processes = crate::support::Processes(vec![process]);
    eventually("both cells' replicas to be ready", || async {
        let ready = reqwest::get(format!("http://{metrics}/readyz")).await;
        ready.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (a, b, metrics, processes)
}

/// The backend holding owner `$1`'s lock in the session's cell, if any.
const OWNER_LOCK_HOLDER: &str = "
SELECT l.pid FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((l.classid::bigint << 32) | l.objid::bigint) = durable_etl_owner_lock_key($1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_whose_replica_stops_with_an_error_drains_the_other_cells_and_work_exits_with_it() {
    let db = TestDb::migrated().await;
    let (a, b, _, mut processes) = one_process_of_two_cells(&db, "twin").await;
    let client_b = session(&b).await;
    let holder: i32 = client_b
        .query_one(OWNER_LOCK_HOLDER, &[&"twin"])
        .await
        .unwrap()
        .get(0);
    // Another process queues for cell_b's owner lock of `twin`; the replica's cell_b session is
    // cut, the lock passes to that process, and the reconnecting replica finds its owner id
    // taken in cell_b: that replica stops with an error, and cell_a's drains with it.
    let contender = session(&b).await;
    let queued = tokio::spawn(async move {
        contender
            .execute(
                "SELECT pg_advisory_lock(durable_etl_owner_lock_key('twin'))",
                &[],
            )
            .await
            .unwrap();
        contender
    });
    let waiting = "pg_locks WHERE locktype = 'advisory' AND NOT granted
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    eventually("the contender to queue for the lock", || async {
        count(&client_b, waiting).await == 1
    })
    .await;
    client_b
        .execute("SELECT pg_terminate_backend($1)", &[&holder])
        .await
        .unwrap();
    let _contender = queued.await.unwrap();
    let mut process = processes.0.remove(0);
    let exited = tokio::task::spawn_blocking(move || process.wait().unwrap());
    let status = tokio::time::timeout(Duration::from_secs(30), exited)
        .await
        .expect("work to exit")
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    // cell_a's replica drained: nothing of it holds cell_a's owner lock any more.
    let client_a = session(&a).await;
    let held = client_a
        .query_opt(OWNER_LOCK_HOLDER, &[&"twin"])
        .await
        .unwrap();
    assert!(held.is_none());
}
