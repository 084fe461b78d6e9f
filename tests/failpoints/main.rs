//! Crash points: the real binary, built with the `failpoints` feature, is told through
//! `FAILPOINTS=<site>=return` to abort at one exact step of a job's life (after the claim, with
//! effects written, between effects and COMMIT, after COMMIT, in a heartbeat, while scheduling a
//! retry, while releasing on shutdown). A second replica then takes over, and the invariants are
//! read from the database: the job ends `succeeded` exactly once (one ledger, its target rows
//! once, no live row left with its payload), with the attempts the crash point implies.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

// This binary uses part of the shared test support (and of what it re-exports).
#[allow(dead_code, unused_imports)]
#[path = "../it/support.rs"]
mod support;

use durable_etl::digest::{DigestKind, Secret};
use durable_etl::intake::IntakeLimits;
use durable_etl::kinds::etl::enqueue::{enqueue, NewJob};
use durable_etl::kinds::etl::request;
use serde_json::json;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{count, eventually, signal, Processes, TestDb, LEDGERS};
use tokio_postgres::Client;
use uuid::Uuid;

/// Records each test job loads.
const RECORDS: i64 = 3;

/// SIGABRT, which `std::process::abort` raises at a crash point.
const SIGABRT: i32 = 6;

/// Starts a replica of the real binary on `db` as `owner`, with crash point `crash` armed (if
/// any) and extra `args`.
fn replica(db: &TestDb, owner: &str, crash: Option<&str>, args: &[&str]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    command
        .env("DATABASE_URL", &db.config.url)
        .env("RUST_LOG", "warn")
        .env_remove("FAILPOINTS")
        .args(["work", "--owner-id", owner, "--poll-interval", "100ms"])
        .args(args)
        .stderr(Stdio::null());
    if let Some(site) = crash {
        command.env("FAILPOINTS", format!("{site}=return"));
    }
    command.spawn().unwrap()
}

/// Enqueues one ETL job loading [`RECORDS`] rows (keys `k0..`); returns its id.
async fn enqueue_load(client: &Client) -> Uuid {
    let secret = Secret::new("failpoints-secret-0123456789").unwrap();
    let owner = secret.digest(DigestKind::Principal, b"failpoints");
    let records: Vec<_> = (0..RECORDS)
        .map(|i| json!({"id": format!("k{i}"), "v": i}))
        .collect();
    let parsed = request::parse(
        &json!({"dataset": "d", "key": "id", "records": records}),
        IntakeLimits::default(),
    )
    .unwrap();
    let job = NewJob {
        idempotency_key: "crash",
        request: &parsed,
        max_attempts: 5,
        retain: None,
    };
    enqueue(client, &secret, &owner, job).await.unwrap().id
}

/// Opens a transaction on a new session that inserts target row `k0` uncommitted, so the job's
/// load waits on it (or times out on it) until the returned client is dropped.
async fn block_first_row(db: &TestDb, job: Uuid) -> Client {
    let holder = db.client().await;
    holder
        .batch_execute(&format!(
            "BEGIN; INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             SELECT owner_key, 'd', 'k0', '{{}}', id FROM etl_job_records WHERE id = '{job}'"
        ))
        .await
        .unwrap();
    holder
}

/// Waits (bounded) for `child` to end, and asserts it aborted at its crash point.
async fn aborted(child: &mut Child) {
    for _ in 0..3000 {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(
                status.signal(),
                Some(SIGABRT),
                "ended by its crash point: {status}"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the replica never reached its crash point");
}

/// Waits until `job` is running (claimed).
async fn until_running(client: &Client, job: Uuid) {
    eventually("the job is running", || async {
        count(
            client,
            &format!("etl_job_records WHERE id = '{job}' AND status = 'running'"),
        )
        .await
            == 1
    })
    .await;
}

/// Starts a clean replica, waits for `job` to succeed, and checks it happened exactly once,
/// after `attempts` attempts.
async fn recovered_exactly_once(db: &TestDb, client: &Client, job: Uuid, attempts: i32) {
    let _b = Processes(vec![replica(db, "b", None, &[])]);
    eventually("the job succeeded", || async {
        count(
            client,
            &format!("etl_jobs WHERE id = '{job}' AND status = 'succeeded'"),
        )
        .await
            == 1
    })
    .await;
    let row = support::job_row(client, job).await;
    assert_eq!(row.attempts, attempts);
    assert!(!row.live, "no live row, so no payload, is left");
    assert_eq!(count(client, LEDGERS).await, 1);
    assert_eq!(count(client, "etl_target_rows").await, RECORDS);
    assert_eq!(count(client, "etl_job_records").await, 0);
}

/// Where a job stands right after its replica crashed.
#[derive(Debug, PartialEq, Eq)]
enum AfterCrash {
    /// Never claimed: `pending`, no attempt counted, none in its history.
    Unclaimed,
    /// Claimed (one attempt counted) and not finished, its effects absent: still `running`
    /// under the dead replica's claim, or already given back by recovery (`pending`, its lease
    /// cleared, the attempt in its history as `recovered`). The second happens when the dead
    /// replica's own recovery pass was in flight: the server runs a statement the process sent
    /// before it died, and that statement rightly finds the owner dead.
    ClaimedUnfinished,
    /// `succeeded`.
    Succeeded,
}

/// Reads where `job` stands after the crash (see [`AfterCrash`]), asserting that no effect of
/// an unfinished attempt is visible; panics on any other state.
async fn after_crash(client: &Client, job: Uuid) -> AfterCrash {
    // One statement, so one snapshot: the dead replica's in-flight recovery may commit between
    // two reads.
    let row = client
        .query_one(
            "SELECT v.status, v.attempts,
                    v.lease_owner_id IS NULL AND v.lease_claim_id IS NULL,
                    (SELECT count(*) FROM etl_job_attempts a WHERE a.job_id = v.id),
                    (SELECT count(*) FROM etl_job_attempts a
                      WHERE a.job_id = v.id AND a.ending = 'recovered'),
                    (SELECT count(*) FROM etl_target_rows)
               FROM etl_jobs v WHERE v.id = $1",
            &[&job],
        )
        .await
        .unwrap();
    let (status, attempts, lease_cleared): (String, i32, bool) =
        (row.get(0), row.get(1), row.get(2));
    let (history, recovered, effects): (i64, i64, i64) = (row.get(3), row.get(4), row.get(5));
    match (status.as_str(), attempts) {
        ("succeeded", 1) if effects == RECORDS => AfterCrash::Succeeded,
        ("pending", 0) if history == 0 && effects == 0 => AfterCrash::Unclaimed,
        ("running", 1) if history == 0 && effects == 0 => AfterCrash::ClaimedUnfinished,
        ("pending", 1) if recovered == 1 && history == 1 && lease_cleared && effects == 0 => {
            AfterCrash::ClaimedUnfinished
        }
        (status, attempts) => panic!(
            "after the crash: {status} after {attempts} attempts, \
             {history} in its history ({recovered} recovered), {effects} target rows"
        ),
    }
}

/// The job is enqueued, replica `a` aborts at `site` on its own, and `b` finishes the job.
/// Returns where the job stood right after the crash.
async fn crash_at(site: &str, attempts: i32) -> AfterCrash {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let job = enqueue_load(&client).await;
    let mut a = Processes(vec![replica(&db, "a", Some(site), &[])]);
    aborted(&mut a.0[0]).await;
    let after = after_crash(&client, job).await;
    recovered_exactly_once(&db, &client, job, attempts).await;
    after
}

#[tokio::test]
async fn a_crash_before_the_claim_leaves_the_job_pending() {
    assert_eq!(crash_at("claim.before", 1).await, AfterCrash::Unclaimed);
}

#[tokio::test]
async fn a_crash_right_after_the_claim_commits_is_recovered_from_the_dead_owner() {
    assert_eq!(
        crash_at("claim.after_commit", 2).await,
        AfterCrash::ClaimedUnfinished
    );
}

#[tokio::test]
async fn a_crash_with_effects_written_but_uncommitted_leaves_no_effect() {
    assert_eq!(
        crash_at("effects.applied", 2).await,
        AfterCrash::ClaimedUnfinished
    );
}

#[tokio::test]
async fn a_crash_between_effects_and_commit_leaves_no_effect() {
    assert_eq!(
        crash_at("commit.before", 2).await,
        AfterCrash::ClaimedUnfinished
    );
}

#[tokio::test]
async fn a_crash_right_after_commit_never_runs_the_job_again() {
    assert_eq!(crash_at("commit.after", 1).await, AfterCrash::Succeeded);
}

#[tokio::test]
async fn a_crash_in_a_heartbeat_is_recovered_and_the_load_commits_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let job = enqueue_load(&client).await;
    let holder = block_first_row(&db, job).await;
    let args = ["--heartbeat-interval", "200ms", "--lease", "1s"];
    let mut a = Processes(vec![replica(&db, "a", Some("heartbeat"), &args)]);
    aborted(&mut a.0[0]).await;
    drop(holder);
    recovered_exactly_once(&db, &client, job, 2).await;
}

#[tokio::test]
async fn a_crash_while_scheduling_a_retry_is_recovered_and_the_load_commits_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let job = enqueue_load(&client).await;
    // The load times out on the held row: a transient failure, so the replica schedules a retry.
    let holder = block_first_row(&db, job).await;
    let args = ["--lock-timeout", "200ms"];
    let mut a = Processes(vec![replica(&db, "a", Some("retry.schedule"), &args)]);
    aborted(&mut a.0[0]).await;
    drop(holder);
    recovered_exactly_once(&db, &client, job, 2).await;
}

#[tokio::test]
async fn a_crash_while_releasing_on_shutdown_is_recovered_and_the_load_commits_once() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let job = enqueue_load(&client).await;
    let holder = block_first_row(&db, job).await;
    let args = ["--shutdown-grace", "100ms"];
    let mut a = Processes(vec![replica(&db, "a", Some("release"), &args)]);
    until_running(&client, job).await;
    signal(&a.0[0], "TERM");
    aborted(&mut a.0[0]).await;
    // The release never ran: the job is still held under the dead replica's claim (or its own
    // in-flight recovery pass already gave it back), its attempt counted and charged.
    assert_eq!(
        after_crash(&client, job).await,
        AfterCrash::ClaimedUnfinished
    );
    drop(holder);
    recovered_exactly_once(&db, &client, job, 2).await;
}

/// Starts a replica, with crash point `crash` armed, beside a schedule firing every second
/// (catching up every missed fire), waits for it to abort there, then lets a clean replica run
/// on: each fire makes exactly one job, the one the crash interrupted included, and none is
/// missed. Before the commit the fire's job, record and move are all rolled back; after it, all
/// three hold.
async fn a_crash_firing_a_schedule_leaves_one_job_per_fire(crash: &str) {
    use durable_etl::schedule::{Missed, ScheduleOptions};
    use durable_etl::{Job, Jobs};
    /// What the schedule makes: a kind no replica runs, so its jobs stay to be counted.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Tick;
    impl Job for Tick {
        const KIND: &'static str = "test.tick";
    }
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = Jobs::new(Secret::new("failpoints-secret-0123456789").unwrap(), "ops");
    let options = ScheduleOptions {
        missed: Missed::CatchUp(1000),
        ..ScheduleOptions::default()
    };
    let first = jobs
        .schedules()
        .put(&client, "tick", "* * * * * *", &Tick, options)
        .await
        .unwrap()
        .next_fire_at;
    let mut a = replica(&db, "a", Some(crash), &[]);
    aborted(&mut a).await;
    let (made, moved) = (
        count(&client, "etl_jobs WHERE kind = 'test.tick'").await,
        count(&client, "etl_schedules WHERE last_fire_at IS NOT NULL").await,
    );
    if crash == "schedule.before_commit" {
        assert_eq!((made, moved), (0, 0), "rolled back whole");
    } else {
        assert!(made >= 1 && moved == 1, "committed whole: {made}, {moved}");
    }
    let b = Processes(vec![replica(&db, "b", None, &[])]);
    eventually("three more fires", || async {
        count(&client, "etl_schedule_fires").await >= made + 3
    })
    .await;
    drop(b);
    let rows = client
        .query_one(
            "SELECT count(*), count(DISTINCT f.fire_at), min(f.fire_at),
                    extract(epoch FROM max(f.fire_at) - min(f.fire_at))::int8 + 1,
                    (SELECT count(*) FROM etl_jobs WHERE kind = 'test.tick')
               FROM etl_schedule_fires f WHERE f.outcome = 'enqueued'",
            &[],
        )
        .await
        .unwrap();
    let (fires, distinct, earliest): (i64, i64, chrono::DateTime<chrono::Utc>) =
        (rows.get(0), rows.get(1), rows.get(2));
    assert_eq!(earliest, first, "the interrupted fire was made");
    assert_eq!(fires, distinct);
    assert_eq!(
        fires,
        rows.get::<_, i64>(3),
        "every second fired, none missed"
    );
    assert_eq!(fires, rows.get::<_, i64>(4), "one job per fire");
}

#[tokio::test]
async fn a_crash_before_a_fires_commit_leaves_nothing_and_the_fire_is_made_once() {
    a_crash_firing_a_schedule_leaves_one_job_per_fire("schedule.before_commit").await;
}

#[tokio::test]
async fn a_crash_after_a_fires_commit_keeps_it_and_the_next_fire_follows_once() {
    a_crash_firing_a_schedule_leaves_one_job_per_fire("schedule.after_commit").await;
}
