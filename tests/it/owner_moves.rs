//! Moving an owner between two plain PostgreSQL cells (`cells move-owner`) while its jobs run:
//! an application keeps enqueueing through the directory, replicas of both cells run, and the
//! mover is killed at each of its steps and run again. Nothing is lost, nothing runs twice, and
//! the old cell keeps nothing of the owner but the fence that refuses its enqueues.

use crate::directory::{
    ok, owners_of_each_cell, replicas_of_each_cell, routed_api, routed_keys, run, TwoCells, SECRET,
};
use crate::support::{binary, count, eventually, load_request};
use durable_etl::config::DatabaseConfig;
use durable_etl::error::Error;
use durable_etl::kinds::etl::enqueue::{enqueue_many, NewJob};
use durable_etl::schedule::ScheduleOptions;
use durable_etl::{directory, Jobs, Secret};
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// SIGABRT, which a crash point raises.
const SIGABRT: i32 = 6;

/// Every table that holds rows of an owner, each with its filter by the owner's key (`{o}`).
const OWNER_ROWS: [&str; 11] = [
    "etl_job_intake WHERE owner_key = {o}",
    "etl_job_records WHERE owner_key = {o}",
    "etl_job_outcomes WHERE owner_key = {o}",
    "etl_moving_rows WHERE owner_key = {o}",
    "etl_job_attempts WHERE job_id IN (SELECT id FROM etl_job_intake WHERE owner_key = {o})",
    "etl_retained_payloads WHERE job_id IN (SELECT id FROM etl_job_intake WHERE owner_key = {o})",
    "etl_dead_letters WHERE owner_key = {o}",
    "etl_schedules WHERE owner_key = {o}",
    "etl_schedule_fires WHERE owner_key = {o}",
    "etl_target_rows WHERE owner_key = {o}",
    "etl_api_clients WHERE owner_key = {o}",
];

/// A job of the shipped no-op kind that takes its time, so some are running at every move.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Pause {
    /// How long it runs.
    pause_ms: u64,
}

impl durable_etl::Job for Pause {
    const KIND: &'static str = durable_etl::job::handler::NOOP_KIND;
}

/// What the application enqueued (each acknowledged once): loads of two records, and pauses.
#[derive(Debug, Default, Clone, Copy)]
struct Fed {
    /// ETL loads.
    loads: i64,
    /// Pauses.
    pauses: i64,
}

/// An application enqueueing the owner's jobs, one at a time, in the cell the directory names
/// (`base`: the directory's settings), until `stop`: each job is retried while its cell refuses
/// it as moved, after finding the owner's cell again.
async fn feed(base: DatabaseConfig, owner: String, stop: Arc<AtomicBool>) -> Fed {
    let secret = Secret::new(SECRET).unwrap();
    let jobs = Jobs::new(secret.clone(), &owner);
    let owner_key = jobs.owner_key();
    let dir = durable_etl::db::connect(&base, "app").await.unwrap();
    let mut sessions: HashMap<String, tokio_postgres::Client> = HashMap::new();
    let mut fed = Fed::default();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        loop {
            let cell = directory::place(&dir, &owner_key).await.unwrap();
            if !sessions.contains_key(&cell) {
                let config = directory::cell(&dir, &cell)
                    .await
                    .unwrap()
                    .config(&base)
                    .unwrap();
                let session = durable_etl::db::connect(&config, "app").await.unwrap();
                sessions.insert(cell.clone(), session);
            }
            let session = &sessions[&cell];
            let done = if i % 4 == 3 {
                let pause = Pause { pause_ms: 600 };
                jobs.enqueue(session, &pause, Default::default())
                    .await
                    .map(drop)
            } else {
                let request = load_request("moving", i, 2);
                let key = format!("moving-{i}");
                let job = NewJob {
                    idempotency_key: &key,
                    request: &request,
                    max_attempts: 5,
                    retain: None,
                };
                enqueue_many(session, &secret, &owner_key, &[job])
                    .await
                    .map(drop)
            };
            match done {
                Ok(()) => break,
                Err(Error::OwnerMoved) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("enqueue {i}: {e:?}"),
            }
        }
        if i % 4 == 3 {
            fed.pauses += 1;
        } else {
            fed.loads += 1;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    fed
}

/// The owner's rows `session` holds, by table (those with any).
async fn rows_of(session: &tokio_postgres::Client, owner: &str) -> Vec<(String, i64)> {
    let mut held = Vec::new();
    for table in OWNER_ROWS {
        let query = table.replace("{o}", owner);
        let n = count(session, &query).await;
        if n > 0 {
            held.push((query, n));
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_moves_back_and_forth_with_jobs_in_flight_and_the_mover_killed_at_each_step() {
    let cells = TwoCells::start().await;
    let url = cells.url.clone();
    let owners = owners_of_each_cell(&url);
    let owner = owners["cell_near"].clone();
    let bystander = owners["cell_far"].clone();
    let _replicas = replicas_of_each_cell(&url);
    // A schedule of the owner's, firing each second, moves with it and fires on.
    let owner_jobs = Jobs::new(Secret::new(SECRET).unwrap(), &owner);
    let tick = Pause { pause_ms: 1 };
    owner_jobs
        .schedules()
        .put(
            &cells.session("cell_near").await,
            "tick",
            "* * * * * *",
            &tick,
            ScheduleOptions::default(),
        )
        .await
        .unwrap();
    let owner_key = Jobs::new(Secret::new(SECRET).unwrap(), &owner).owner_key();
    let hex: String = owner_key.iter().map(|b| format!("{b:02x}")).collect();
    let literal = format!("'\\x{hex}'::bytea");
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = tokio::spawn(feed(cells.db.config.clone(), owner.clone(), stop.clone()));
    let dir = cells.db.client().await;

    let mut at = "cell_near";
    let rounds = [
        ("cell_far", "move.fenced"),
        ("cell_near", "move.drained"),
        ("cell_far", "move.copied"),
        ("cell_near", "move.switched"),
    ];
    let mut fired_before = 0;
    for (to, crash) in rounds {
        let old = cells.session(at).await;
        // The owner's schedule fires where the owner is.
        let fires = format!("etl_schedule_fires WHERE owner_key = {literal}");
        eventually(&format!("the owner's schedule fired in {at}"), || async {
            count(&old, &fires).await > fired_before
        })
        .await;
        eventually(&format!("a job of the owner running in {at}"), || async {
            let running =
                format!("etl_job_records WHERE status = 'running' AND owner_key = {literal}");
            count(&old, &running).await > 0
        })
        .await;
        let args = ["cells", "move-owner", "--owner", &owner, "--to", to];
        let crashed = binary(&url, &args)
            .env("DURABLE_ETL_SECRET", SECRET)
            .env("FAILPOINTS", format!("{crash}=return"))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(crashed.signal(), Some(SIGABRT), "{crash}: {crashed:?}");
        let started = std::time::Instant::now();
        let carried_on = ok(&url, &args);
        eprintln!(
            "{at} -> {to}, carried on after {crash}: {:?}",
            started.elapsed()
        );
        assert!(carried_on.trim_end().ends_with("moved"), "{carried_on}");
        let found = directory::find(&dir, &owner_key).await.unwrap();
        assert_eq!(found.as_deref(), Some(to), "after {crash}");
        // The old cell keeps nothing of the owner but the fence naming where it went.
        assert_eq!(rows_of(&old, &literal).await, vec![], "{at} after {crash}");
        let fence = format!("etl_moved_owners WHERE owner_key = {literal} AND moved_to = '{to}'");
        assert_eq!(count(&old, &fence).await, 1);
        let new = cells.session(to).await;
        assert_eq!(
            count(
                &new,
                &format!("etl_moved_owners WHERE owner_key = {literal}")
            )
            .await,
            0
        );
        fired_before = count(&new, &fires).await;
        at = to;
    }
    stop.store(true, Ordering::Relaxed);
    let fed = feeder.await.unwrap();
    assert!(fed.loads > 0 && fed.pauses > 0, "{fed:?}");

    // Every job the application was told was enqueued, and every fire's, succeeded, once, in
    // the owner's cell now.
    let near = cells.session("cell_near").await;
    assert!(owner_jobs.schedules().pause(&near, "tick").await.unwrap());
    let o = |q: &str| q.replace("{o}", &literal);
    let fires = o("etl_schedule_fires WHERE owner_key = {o} AND outcome = 'enqueued'");
    let fired = count(&near, &fires).await;
    assert!(fired >= 2, "{fired} fires");
    let fire_instants =
        o("(SELECT DISTINCT fire_at FROM etl_schedule_fires WHERE owner_key = {o}) f");
    let recorded = o("etl_schedule_fires WHERE owner_key = {o}");
    assert_eq!(
        count(&near, &fire_instants).await,
        count(&near, &recorded).await
    );
    let total = fed.loads + fed.pauses + fired;
    let succeeded = format!("etl_jobs WHERE owner_key = {literal} AND status = 'succeeded'");
    eventually("every job succeeded in the owner's cell", || async {
        count(&near, &succeeded).await == total
    })
    .await;
    let fires_ran =
        format!("{fires} AND job_id IN (SELECT id FROM etl_jobs WHERE status = 'succeeded')");
    assert_eq!(count(&near, &fires_ran).await, fired);
    assert_eq!(
        count(&near, &o("etl_schedules WHERE owner_key = {o}")).await,
        1
    );
    assert_eq!(
        count(&near, &o("etl_job_intake WHERE owner_key = {o}")).await,
        total
    );
    assert_eq!(
        count(&near, &o("etl_job_outcomes WHERE owner_key = {o}")).await,
        total
    );
    assert_eq!(
        count(&near, &o("etl_job_records WHERE owner_key = {o}")).await,
        0
    );
    assert_eq!(
        count(&near, &o("etl_moving_rows WHERE owner_key = {o}")).await,
        0
    );
    // Each load's rows written once, by one run that found none of them there before: a run
    // after another (in either cell) would have found them and counted them unchanged.
    let loads = o("etl_jobs WHERE owner_key = {o} AND kind = 'etl.load'");
    assert_eq!(count(&near, &loads).await, fed.loads);
    let clean = format!(
        "{loads} AND (output->>'rows_inserted')::int = 2
             AND (output->>'rows_updated')::int = 0 AND (output->>'rows_unchanged')::int = 0"
    );
    assert_eq!(count(&near, &clean).await, fed.loads);
    assert_eq!(
        count(&near, &o("etl_target_rows WHERE owner_key = {o}")).await,
        2 * fed.loads
    );
    // The far cell keeps nothing of the owner, and its own owner was never touched.
    let far = cells.session("cell_far").await;
    assert_eq!(rows_of(&far, &literal).await, vec![]);
    let bystander_key = Jobs::new(Secret::new(SECRET).unwrap(), &bystander).owner_key();
    assert_eq!(
        directory::find(&dir, &bystander_key)
            .await
            .unwrap()
            .as_deref(),
        Some("cell_far")
    );
    let gap: f64 = near
        .query_one(
            &o(
                "SELECT coalesce(extract(epoch FROM max(gap)), 0)::float8 FROM (
                    SELECT started_at - lag(started_at) OVER (ORDER BY started_at) AS gap
                      FROM etl_job_outcomes WHERE owner_key = {o}) g",
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("{total} jobs; longest time without a job of the owner starting: {gap:.3} s");
    // No move is left recorded.
    assert_eq!(count(&dir, "durable_etl_directory.moves").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_that_cannot_be_made_is_refused_and_a_moving_owner_is_refused_everywhere() {
    let cells = TwoCells::start().await;
    let url = cells.url.clone();
    let owners = owners_of_each_cell(&url);
    let owner = owners["cell_near"].as_str();
    let keys = routed_keys(&url, &owners);
    let (key_id, key) = keys["cell_near"].clone();
    let near = cells.session("cell_near").await;
    let before = count(&near, "etl_moved_owners").await;

    // What cannot be moved is refused, exit 2, naming why, and changes nothing; an owner in
    // the cell already stays.
    for (args, why) in [
        (
            ["cells", "move-owner", "--owner", owner, "--to", "cell_gone"],
            "no cell of that name",
        ),
        (
            [
                "cells",
                "move-owner",
                "--owner",
                "never-placed",
                "--to",
                "cell_far",
            ],
            "has no cell yet",
        ),
    ] {
        let refused = run(&url, &args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    let stay = ["cells", "move-owner", "--owner", owner, "--to", "cell_near"];
    assert!(ok(&url, &stay).contains("in cell_near already"));
    assert_eq!(count(&near, "etl_moved_owners").await, before);

    // A cell at another schema version takes no owner.
    ok(
        &url,
        &[
            "migrate",
            "--directory",
            "--cell",
            "cell_far",
            "--down-to",
            "41",
        ],
    );
    let to_far = ["cells", "move-owner", "--owner", owner, "--to", "cell_far"];
    let refused = run(&url, &to_far);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("schema_too_old"), "{stderr}");
    ok(&url, &["migrate", "--directory", "--cell", "cell_far"]);

    // A move stopped after its fence: the owner's enqueues in its cell, its requests through a
    // routed API, a new key and a move elsewhere are refused until the move is carried on.
    let (addr, _api) = routed_api(&url).await;
    let http = reqwest::Client::new();
    let jobs_of = || {
        http.get(format!("http://{addr}/v1/etl-jobs"))
            .bearer_auth(&key)
            .send()
    };
    assert_eq!(jobs_of().await.unwrap().status(), 200);
    let crashed = binary(&url, &to_far)
        .env("DURABLE_ETL_SECRET", SECRET)
        .env("FAILPOINTS", "move.fenced=return")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(crashed.signal(), Some(SIGABRT));
    let jobs = Jobs::new(Secret::new(SECRET).unwrap(), owner);
    let refused = jobs
        .enqueue(&near, &Pause { pause_ms: 1 }, Default::default())
        .await;
    assert!(matches!(refused, Err(Error::OwnerMoved)), "{refused:?}");
    let answer = jobs_of().await.unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    let problem: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(problem["code"], "owner_moved");
    for args in [
        &["api-keys", "create", "--directory", "--owner", owner][..],
        &["api-keys", "revoke", "--directory", &key_id][..],
    ] {
        let refused = run(&url, args);
        assert!(!refused.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains("owner_moved") || stderr.contains("moving"),
            "{args:?}: {stderr}"
        );
    }
    let back = run(&url, &stay);
    assert_eq!(back.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&back.stderr).contains("carry that move on first"));

    // Carried on, the move ends; the key works in the new cell, and is revoked there.
    assert!(ok(&url, &to_far).trim_end().ends_with("moved"));
    assert_eq!(jobs_of().await.unwrap().status(), 200);
    ok(&url, &["api-keys", "revoke", "--directory", &key_id]);
    assert_eq!(jobs_of().await.unwrap().status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_waits_for_a_transaction_open_at_its_fence_and_takes_what_it_enqueued() {
    let cells = TwoCells::start().await;
    let url = cells.url.clone();
    let owners = owners_of_each_cell(&url);
    let owner = owners["cell_near"].clone();
    let _replicas = replicas_of_each_cell(&url);
    let jobs = Jobs::new(Secret::new(SECRET).unwrap(), &owner);
    let hex: String = jobs
        .owner_key()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let literal = format!("'\\x{hex}'::bytea");
    let near = cells.session("cell_near").await;

    // An application's repeatable-read transaction took its snapshot before the fence: the
    // intake's check reads that snapshot, so its enqueue after the fence is accepted.
    let app = cells.session("cell_near").await;
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM etl_queues")
        .await
        .unwrap();
    let args = ["cells", "move-owner", "--owner", &owner, "--to", "cell_far"];
    let mut mover = binary(&url, &args)
        .env("DURABLE_ETL_SECRET", SECRET)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let fenced = format!("etl_moved_owners WHERE owner_key = {literal}");
    eventually("the fence", || async { count(&near, &fenced).await == 1 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        mover.try_wait().unwrap().is_none(),
        "the move went on past a transaction open at its fence"
    );
    // A second mover of the owner meanwhile is refused, and changes nothing.
    let second = run(&url, &args);
    assert_eq!(second.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("moving this owner right now"), "{stderr}");
    jobs.enqueue(&app, &Pause { pause_ms: 1 }, Default::default())
        .await
        .unwrap();
    app.batch_execute("COMMIT").await.unwrap();
    let moved = mover.wait_with_output().unwrap();
    assert!(moved.status.success());
    assert!(String::from_utf8_lossy(&moved.stdout).contains("moved"));

    // The job went with the owner and ran in the new cell, woken there (the poll is a minute
    // away); the old cell keeps nothing of the owner.
    let far = cells.session("cell_far").await;
    let succeeded = format!("etl_jobs WHERE owner_key = {literal} AND status = 'succeeded'");
    eventually("the job ran in the new cell", || async {
        count(&far, &succeeded).await == 1
    })
    .await;
    assert_eq!(rows_of(&near, &literal).await, vec![]);

    // A transaction begun after the fence is refused, read committed or repeatable read.
    for isolation in ["READ COMMITTED", "REPEATABLE READ"] {
        app.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
            .await
            .unwrap();
        let refused = jobs
            .enqueue(&app, &Pause { pause_ms: 1 }, Default::default())
            .await;
        assert!(
            matches!(refused, Err(Error::OwnerMoved)),
            "{isolation}: {refused:?}"
        );
        app.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(rows_of(&near, &literal).await, vec![]);
}
