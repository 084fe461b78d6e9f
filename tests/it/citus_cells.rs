//! Cells on Citus schema-based sharding, on a private coordinator and two workers: a cell is
//! migrated through the coordinator into one worker, and sessions on that worker run it.

use crate::support::{
    count, enqueue_loads, eventually, insert_jobs, post_load, spawn_replica_logged, Citus,
    LOAD_SECRET,
};
use durable_etl::config::DatabaseConfig;
use durable_etl::job::handler::NOOP_KIND;
use durable_etl::{db, schema};
use serde_json::json;
use std::process::Child;

/// Cell `cell` of the Citus node at `url`.
fn cell_at(url: String, cell: &str) -> DatabaseConfig {
    DatabaseConfig {
        cell: Some(cell.to_owned()),
        ..DatabaseConfig::new(url)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_migrated_through_the_coordinator_lives_whole_on_one_worker() {
    let citus = Citus::start().await;
    let through = cell_at(Citus::url(&citus.coordinator), "cell_one");
    let report = schema::migrate(&through).await.unwrap();
    assert_eq!(report.version, schema::latest_version());
    assert_eq!(report.changed.len(), schema::MIGRATIONS.len());

    // The schema is distributed, and every table of the cell is one shard, all on one worker.
    let coordinator = Citus::session(&citus.coordinator).await;
    assert_eq!(
        count(
            &coordinator,
            "pg_dist_schema WHERE schemaid = 'cell_one'::regnamespace"
        )
        .await,
        1
    );
    let tables = count(&coordinator, "pg_tables WHERE schemaname = 'cell_one'").await;
    let placements: Vec<(i64, i32)> = coordinator
        .query(
            "SELECT count(*), nodeport FROM citus_shards
              WHERE table_name::text LIKE 'cell_one.%' GROUP BY nodeport",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let port = citus.node_of("cell_one").await;
    assert_eq!(placements, [(tables, i32::from(port))]);
    assert!(citus.workers.iter().any(|w| w.port() == port));

    // On that worker a session of the cell finds it whole: the migrations' history, its own
    // channel, and no other cell's.
    let worker = citus.workers.iter().find(|w| w.port() == port).unwrap();
    let on_worker = cell_at(Citus::url(worker), "cell_one");
    let session = db::connect(&on_worker, "test").await.unwrap();
    db::check_session_settings(&session, &on_worker)
        .await
        .unwrap();
    assert_eq!(
        schema::check_compatible(&session).await.unwrap(),
        schema::latest_version()
    );
    let channel: String = session
        .query_one("SELECT durable_etl_channel()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, "durable_etl_jobs.cell_one");
    // A replica's vacuum reads the statistics of, and vacuums, the shard its node view reads.
    insert_jobs(&session, "test.vacuum", &[json!({})], 3).await;
    let due: (String, bool) = session
        .query_one(durable_etl::worker::maintain::vacuum::DUE_SQL, &[&0i64])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert!(due.0.starts_with("etl_job_records_"), "the shard: {due:?}");
    assert!(due.1);
    durable_etl::worker::maintain::vacuum::vacuum(&session, &due.0)
        .await
        .unwrap();
    let vacuums: i64 = session
        .query_one(
            &format!("SELECT pg_stat_get_vacuum_count('{}'::regclass)", due.0),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(vacuums, 1);
    // Migrating again through the coordinator applies nothing.
    assert!(schema::migrate(&through).await.unwrap().changed.is_empty());

    // A directory on the coordinator stays the coordinator's (not a distributed schema); a cell
    // it lists without a server is found through the coordinator, on its worker.
    durable_etl::directory::init(&coordinator).await.unwrap();
    durable_etl::directory::add(&coordinator, "cell_one", None)
        .await
        .unwrap();
    assert_eq!(
        count(
            &coordinator,
            "pg_dist_schema WHERE schemaid = 'durable_etl_directory'::regnamespace"
        )
        .await,
        0
    );
    let listed = cell_at(Citus::url(&citus.coordinator), "cell_one");
    let found = durable_etl::directory::cell_config(&listed).await.unwrap();
    assert_eq!(
        db::citus::find_node(&found).await.unwrap().url,
        on_worker.url
    );
}

/// The coordinator's URL and the cell `cell` migrated through it, with a session of the cell on
/// the worker that holds it (its node views readied).
async fn migrated(citus: &Citus, cell: &str) -> (String, tokio_postgres::Client) {
    let coordinator = Citus::url(&citus.coordinator);
    schema::migrate(&cell_at(coordinator.clone(), cell))
        .await
        .unwrap();
    (coordinator, on_node(citus, cell).await)
}

/// A session of cell `cell` on the worker that holds it now, its node views readied.
async fn on_node(citus: &Citus, cell: &str) -> tokio_postgres::Client {
    let port = citus.node_of(cell).await;
    let worker = citus.workers.iter().find(|w| w.port() == port).unwrap();
    let cfg = cell_at(Citus::url(worker), cell);
    let client = db::connect(&cfg, "test").await.unwrap();
    let here = db::check_cell(&client, &cfg).await.unwrap();
    assert_eq!(here.as_deref(), Some(cell), "a Citus cell of this node");
    client
}

/// A replica process, killed when dropped (a failed test leaves none behind).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A replica of cell `cell` started as a deployment starts it: the real binary, given the
/// coordinator's URL, polling once a minute (only wakes and its own claims bring work), its
/// warnings written to `log`.
fn replica(coordinator: &str, cell: &str, owner: &str, log: &std::path::Path) -> Running {
    replica_with(coordinator, cell, owner, log, &[])
}

/// [`replica`], with `more` arguments.
fn replica_with(
    coordinator: &str,
    cell: &str,
    owner: &str,
    log: &std::path::Path,
    more: &[&str],
) -> Running {
    let args = [
        "--cell",
        cell,
        "--poll-interval",
        "60s",
        "--secret",
        LOAD_SECRET,
    ];
    Running(spawn_replica_logged(
        coordinator,
        owner,
        &[&args[..], more].concat(),
        std::fs::File::create(log).unwrap().into(),
        "warn",
    ))
}

/// A file for the warnings of replica `owner` of this test process.
fn log_file(owner: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "durable-etl-citus-{}-{owner}.log",
        std::process::id()
    ))
}

/// Waits until `n` replicas of the cell beat on `client`'s node.
async fn until_beating(client: &tokio_postgres::Client, n: i64) {
    eventually(&format!("{n} replicas beating"), || async move {
        count(client, "etl_owner_beats").await == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_given_the_coordinator_run_the_cell_on_its_node_woken_by_its_enqueues() {
    let citus = Citus::start().await;
    let (coordinator, client) = migrated(&citus, "cell_run").await;
    let mut replicas: Vec<Running> = ["run-a", "run-b"]
        .iter()
        .map(|owner| replica(&coordinator, "cell_run", owner, &log_file(owner)))
        .collect();
    until_beating(&client, 2).await;

    // ETL jobs enqueued on the node run once each, brought by their wakes (the poll is a minute
    // away), their effects written once.
    let ids = enqueue_loads(&client, "run", 60, 2, 3).await;
    eventually("60 loads succeeded", || async {
        count(&client, "etl_jobs WHERE status = 'succeeded'").await == 60
    })
    .await;
    assert_eq!(count(&client, "etl_target_rows").await, 120);
    assert_eq!(count(&client, "etl_jobs WHERE attempts = 1").await, 60);
    assert_eq!(ids.len(), 60);

    // A replica killed with jobs in flight: the other recovers them on the same node (its
    // owner locks and beats are the node's), each ends once. (Recovery runs twice per poll
    // interval: within 30 s here.)
    let paused = vec![json!({"pause_ms": 3000}); 8];
    insert_jobs(&client, NOOP_KIND, &paused, 3).await;
    eventually("paused jobs running", || async {
        count(&client, "etl_job_records WHERE status = 'running'").await > 0
    })
    .await;
    let holder: String = client
        .query_one(
            "SELECT lease_owner_id FROM etl_job_records WHERE status = 'running' LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let killed = usize::from(holder == "run-b");
    replicas[killed].0.kill().unwrap();
    replicas[killed].0.wait().unwrap();
    eventually("the paused jobs succeeded", || async {
        count(&client, "etl_jobs WHERE status = 'succeeded'").await == 68
    })
    .await;
    assert_eq!(count(&client, "etl_job_records").await, 0);
    assert_eq!(count(&client, "etl_job_outcomes").await, 68);

    // Only the cell's node has its views; the other worker and the coordinator have none.
    let port = citus.node_of("cell_run").await;
    for (node, views) in citus
        .count_on_each("pg_namespace WHERE nspname = '_cell_run'")
        .await
    {
        assert_eq!(views, i64::from(node == port), "node {node}");
    }
    for (i, mut replica) in replicas
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != killed)
    {
        assert!(
            replica.0.try_wait().unwrap().is_none(),
            "replica {i} exited"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_the_node_views_is_carried_by_a_move_or_refused_after_it() {
    let citus = Citus::start().await;
    let (coordinator, mut client) = migrated(&citus, "cell_fence").await;
    let to = citus.other_worker("cell_fence").await;

    // A transaction that wrote through the node views holds the fence: the move waits for it,
    // and carries its write over.
    let tx = client.transaction().await.unwrap();
    let carried = insert_jobs(&tx, "test.fence", &[json!({})], 3).await[0];
    let mover = Citus::session(&citus.coordinator).await;
    let move_done = tokio::spawn(async move { Citus::move_schema(&mover, "cell_fence", to).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !move_done.is_finished(),
        "the move did not wait for the fence"
    );
    tx.commit().await.unwrap();
    move_done.await.unwrap();
    assert_eq!(citus.node_of("cell_fence").await, to);

    // After the move, a write on the old node is refused and its transaction rolls back: by the
    // fence while the old shards are kept, by Citus once they (and their views) are dropped.
    let refused = client
        .execute(
            "INSERT INTO etl_queues (queue, paused) VALUES ('after_move', true)",
            &[],
        )
        .await
        .expect_err("a write on the node the cell left");
    let views_left = count(
        &client,
        "pg_class WHERE relnamespace = to_regnamespace('_cell_fence') AND relkind = 'v'",
    )
    .await;
    assert!(
        refused.code().map(|c| c.code()) == Some(db::citus::CELL_MOVED) || views_left == 0,
        "{:?}",
        refused.code()
    );
    let new_node = on_node(&citus, "cell_fence").await;
    assert_eq!(count(&new_node, "etl_job_records").await, 1);
    assert_eq!(
        count(
            &new_node,
            &format!("etl_job_records WHERE id = '{carried}'")
        )
        .await,
        1
    );
    assert_eq!(
        count(&new_node, "etl_queues WHERE queue = 'after_move'").await,
        0
    );
    drop(coordinator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_move_with_jobs_in_flight_loses_nothing_and_the_replicas_follow_it() {
    let citus = Citus::start().await;
    let (coordinator, client) = migrated(&citus, "cell_move").await;
    let to = citus.other_worker("cell_move").await;
    let owners = ["move-a", "move-b"];
    let mut replicas: Vec<Running> = owners
        .iter()
        .map(|owner| replica(&coordinator, "cell_move", owner, &log_file(owner)))
        .collect();
    until_beating(&client, 2).await;

    // Loads enqueued, and jobs computing in every slot, when the move starts (`block_writes`:
    // the cell's unlogged tables keep Citus from moving it by logical replication).
    enqueue_loads(&client, "before", 100, 2, 5).await;
    insert_jobs(&client, NOOP_KIND, &vec![json!({"pause_ms": 1500}); 16], 5).await;
    eventually("jobs running", || async {
        count(&client, "etl_job_records WHERE status = 'running'").await > 0
    })
    .await;
    let started = std::time::Instant::now();
    Citus::move_schema(&Citus::session(&citus.coordinator).await, "cell_move", to).await;
    let moving = started.elapsed();
    assert_eq!(citus.node_of("cell_move").await, to);

    // Jobs enqueued on the new node run on the replicas that followed the cell there, woken by
    // their enqueue (the poll is a minute away).
    let client = on_node(&citus, "cell_move").await;
    enqueue_loads(&client, "after", 50, 2, 5).await;
    eventually("every job succeeded on the new node", || async {
        count(&client, "etl_jobs WHERE status = 'succeeded'").await == 166
    })
    .await;
    // Nothing lost, nothing done twice: one outcome per job, each load's rows written once.
    assert_eq!(count(&client, "etl_job_records").await, 0);
    assert_eq!(count(&client, "etl_job_outcomes").await, 166);
    assert_eq!(count(&client, "etl_target_rows").await, 300);
    assert_eq!(
        count(
            &client,
            "(SELECT dataset, record_key FROM etl_target_rows GROUP BY 1, 2 HAVING count(*) > 1) d"
        )
        .await,
        0
    );
    // Both replicas followed the move and run on, the one that ran jobs and the one that may
    // have been idle (its placement watch saw the move).
    for (owner, replica) in owners.iter().zip(&mut replicas) {
        let log = std::fs::read_to_string(log_file(owner)).unwrap();
        assert!(log.contains("cell_moved"), "{owner} did not follow:\n{log}");
        assert!(replica.0.try_wait().unwrap().is_none(), "{owner} exited");
    }
    let gap: f64 = client
        .query_one(
            "SELECT coalesce(extract(epoch FROM max(gap)), 0)::float8 FROM (
                 SELECT started_at - lag(started_at) OVER (ORDER BY started_at) AS gap
                   FROM etl_job_outcomes) g",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("the move took {moving:?}; longest time without a job starting: {gap:.3} s");
}

/// An idle replica (no job to claim, so no claim meets the fence) follows a move by its
/// placement watch alone: it starts again on the new node, serves the new incarnation's counters
/// on the same metrics address, and runs what is enqueued there, woken (the poll is a minute
/// away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_follows_a_move_by_its_placement_watch_and_serves_its_metrics_again() {
    let citus = Citus::start().await;
    let (coordinator, client) = migrated(&citus, "cell_idle").await;
    let to = citus.other_worker("cell_idle").await;
    let metrics = format!("127.0.0.1:{}", crate::support::free_port());
    let log = log_file("idle");
    let mut running = replica_with(
        &coordinator,
        "cell_idle",
        "idle",
        &log,
        &["--metrics-listen", &metrics],
    );
    until_beating(&client, 1).await;
    let http = reqwest::Client::new();
    let succeeded = || async {
        let text = http
            .get(format!("http://{metrics}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("durable_etl_jobs_succeeded_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    insert_jobs(&client, NOOP_KIND, &[json!({})], 3).await;
    eventually("the job ran on the first node", || async {
        succeeded().await == Some(1.0)
    })
    .await;

    let moved = std::time::Instant::now();
    Citus::move_schema(&Citus::session(&citus.coordinator).await, "cell_idle", to).await;
    // The beats table moved with the cell: wait for a beat written on the new node.
    let client = on_node(&citus, "cell_idle").await;
    eventually("a beat on the new node", || async {
        client
            .query_one(
                "SELECT count(*) FROM etl_owner_beats
                  WHERE beat_at > now() - interval '200 milliseconds'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;
    let followed = moved.elapsed();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("cell_moved"), "{text}");
    assert!(
        running.0.try_wait().unwrap().is_none(),
        "the replica exited"
    );
    // The metrics address serves the new incarnation: its counters start again.
    eventually("the new incarnation's counters", || async {
        succeeded().await == Some(0.0)
    })
    .await;
    insert_jobs(&client, NOOP_KIND, &[json!({})], 3).await;
    eventually("the job enqueued on the new node ran, woken", || async {
        succeeded().await == Some(1.0)
    })
    .await;
    assert_eq!(
        count(&client, "etl_jobs WHERE status = 'succeeded'").await,
        2
    );
    eprintln!("the idle replica beat on the new node {followed:?} after the move began");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_on_citus_runs_its_cell_on_the_worker_it_names() {
    let citus = Citus::start().await;
    let url = Citus::url(&citus.coordinator);
    let run = |args: &[&str]| {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        crate::support::binary(&url, &all)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    let common = [
        "--jobs",
        "300",
        "--replicas",
        "2",
        "--cell",
        "cell_bench",
        "--citus",
        "--bench-database",
        "durable_etl_bench_citus_test",
        "--json",
    ];
    for worker in [1, 0] {
        let mut args = vec!["burn-down", "--citus-worker"];
        let position = worker.to_string();
        args.push(&position);
        args.extend_from_slice(&common);
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["succeeded"], 300, "{report}");
        assert_eq!(report["config"]["citus"], true);
        let port = citus.workers[worker].port();
        assert!(
            stderr.contains(&format!("on the Citus node 127.0.0.1:{port}")),
            "{stderr}"
        );
    }
    // The bench dropped what it made on every node.
    let left = citus
        .count_on_each("pg_database WHERE datname = 'durable_etl_bench_citus_test'")
        .await;
    assert!(left.iter().all(|&(_, n)| n == 0), "{left:?}");
    // Without a cell, or in a mode it does not run, it is refused before it makes anything.
    let no_cell = run(&[
        "burn-down",
        "--citus",
        "--bench-database",
        "durable_etl_bench_c2",
    ]);
    assert_eq!(no_cell.status.code(), Some(2));
    let recovery = run(&[
        "recovery",
        "--citus",
        "--cell",
        "cell_bench",
        "--bench-database",
        "durable_etl_bench_c3",
    ]);
    assert_eq!(recovery.status.code(), Some(2));
    let made = citus
        .count_on_each(
            "pg_database WHERE datname IN ('durable_etl_bench_c2', 'durable_etl_bench_c3')",
        )
        .await;
    assert!(made.iter().all(|&(_, n)| n == 0), "{made:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_through_the_coordinator_rebuilds_the_cells_node_views() {
    let citus = Citus::start().await;
    let (coordinator, client) = migrated(&citus, "cell_mig").await;
    let views = "pg_class WHERE relnamespace = to_regnamespace('_cell_mig') AND relkind = 'v'";
    let built = count(&client, views).await;
    assert!(built > 20, "{built} views");
    let run = |args: &[&str]| {
        crate::support::binary(&coordinator, args)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    let previous = (schema::latest_version() - 1).to_string();
    let down = run(&["migrate", "--cell", "cell_mig", "--down-to", &previous]);
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    // Reversing dropped the node's views (they read every column a migration may change).
    assert_eq!(count(&client, views).await, 0);
    let up = run(&["migrate", "--cell", "cell_mig"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    // Applying rebuilt them on the cell's node: a session of the cell reads the cell there.
    assert_eq!(count(&client, views).await, built);
    let node = on_node(&citus, "cell_mig").await;
    assert_eq!(
        schema::check_compatible(&node).await.unwrap(),
        schema::latest_version()
    );
    assert_eq!(count(&node, "etl_jobs").await, 0);
}

/// An API serving every cell of a directory on the coordinator finds a cell's worker when it
/// opens it, and, once the cell moved to the other worker, serves it there by itself: the move
/// is seen within a second, and the next request opens the cell on its new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_api_serves_a_cell_on_its_new_node_after_a_schema_move() {
    let citus = Citus::start().await;
    let (coordinator, _) = migrated(&citus, "cell_routed").await;
    let directory_session = Citus::session(&citus.coordinator).await;
    durable_etl::directory::init(&directory_session)
        .await
        .unwrap();
    durable_etl::directory::add(&directory_session, "cell_routed", None)
        .await
        .unwrap();
    let args = [
        "api-keys",
        "create",
        "--directory",
        "--owner",
        "routed-owner",
    ];
    let created = crate::support::binary(&coordinator, &args)
        .output()
        .unwrap();
    assert!(created.status.success());
    let created = String::from_utf8(created.stdout).unwrap();
    let key = created
        .lines()
        .find_map(|l| l.strip_prefix("key:"))
        .unwrap()
        .trim();
    let addr = format!("127.0.0.1:{}", crate::support::free_port());
    let _api = Running(
        crate::support::binary(&coordinator, &["serve", "--directory", "--listen", &addr])
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::new();
    eventually("the routed API to be ready", || async {
        let ready = http.get(format!("http://{addr}/readyz")).send().await;
        ready.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let record = |id: &str| vec![json!({"id": id})];
    let before = post_load(&http, &addr, key, "before", record("a"))
        .await
        .unwrap();
    assert_eq!(before.status(), 202);

    let to = citus.other_worker("cell_routed").await;
    Citus::move_schema(&Citus::session(&citus.coordinator).await, "cell_routed", to).await;
    assert_eq!(citus.node_of("cell_routed").await, to);
    // Served again on the new node without a restart (a request meanwhile may be refused with
    // a 503 and tried again).
    eventually("a submission accepted after the move", || async {
        let after = post_load(&http, &addr, key, "after", record("b")).await;
        after.is_ok_and(|r| r.status() == 202)
    })
    .await;
    let node = on_node(&citus, "cell_routed").await;
    assert_eq!(count(&node, "etl_jobs").await, 2);
    let listed = http
        .get(format!("http://{addr}/v1/etl-jobs"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let listed: serde_json::Value = listed.json().await.unwrap();
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(2), "{listed}");
}
