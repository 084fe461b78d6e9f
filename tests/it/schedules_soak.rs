//! The schedules' soak: three replica processes fire 200 schedules every second for about two
//! minutes while they are SIGKILLed and restarted, twice all at once (an outage), and one of them
//! runs with its own clock 30 seconds fast or slow (libfaketime; the database's clock decides).
//! Every fire makes exactly one job, none twice; `catch_up` schedules miss no second and
//! `coalesce` ones make one job for each outage.

use crate::support::{count, eventually, Processes, TestDb};
use durable_etl::schedule::{Missed, ScheduleOptions};
use durable_etl::{Job, Jobs, Secret};
use serde::{Deserialize, Serialize};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_postgres::Client;

/// What the schedules make: jobs of a kind the replicas do not run, so they only pile up.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick;

impl Job for Tick {
    const KIND: &'static str = "test.tick";
}

/// libfaketime as Debian installs it (package `faketime`, which CI installs).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How many schedules of each missed-fire policy.
const PER_POLICY: usize = 100;

/// A replica process named `owner` against `url`, its own wall clock shifted by `skew` (as
/// libfaketime reads it: `+30s`, `-30s`) if any, its log at `info` into `log`.
fn replica(url: &str, owner: &str, skew: Option<&str>, log: &std::path::Path) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    command
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "info")
        .args(["work", "--owner-id", owner, "--poll-interval", "30s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(skew) = skew {
        assert!(
            std::path::Path::new(FAKETIME).exists(),
            "install Debian's faketime"
        );
        command
            .env("LD_PRELOAD", FAKETIME)
            .env("FAKETIME", skew)
            // Timers stay real: only the wall clock is skewed.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    command.spawn().unwrap()
}

/// How far the first line of log `log` is dated from now, in seconds (positive: ahead).
async fn logged_skew(log: &std::path::Path) -> f64 {
    let mut first = String::new();
    for _ in 0..300 {
        first = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        if !first.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stamp = first.split_whitespace().next().unwrap_or_default();
    let at = chrono::DateTime::parse_from_rfc3339(stamp).unwrap_or_else(|_| panic!("{first}"));
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds() as f64 / 1000.0
}

/// The database's clock.
async fn clock(client: &Client) -> chrono::DateTime<chrono::Utc> {
    client
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Kills `child` and waits for it.
fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_killed_skewed_and_all_down_twice_make_one_job_per_fire_for_two_minutes() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = Jobs::new(
        Secret::new("schedules-soak-secret-0123456789").unwrap(),
        "alice",
    )
    .schedules();
    for i in 0..PER_POLICY {
        for (name, missed) in [
            (format!("c{i}"), Missed::CatchUp(1000)),
            (format!("g{i}"), Missed::Coalesce),
        ] {
            let options = ScheduleOptions {
                missed,
                ..ScheduleOptions::default()
            };
            schedules
                .put(&client, &name, "* * * * * *", &Tick, options)
                .await
                .unwrap();
        }
    }
    let logs = std::env::temp_dir().join(format!("durable-etl-soak-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&logs).unwrap();
    let url = db.config.url.clone();
    let log = |name: &str, n: usize| logs.join(format!("{name}-{n}.log"));
    // r0 is the skewed one: +30 s, then -30 s, then +30 s… at each start.
    let skew = |n: usize| if n % 2 == 0 { "+30s" } else { "-30s" };
    let names = ["r0", "r1", "r2"];
    let mut starts = [0usize; 3];
    let start = |i: usize, n: usize| {
        let skewed = (i == 0).then(|| skew(n));
        replica(&url, names[i], skewed, &log(names[i], n))
    };
    let mut replicas: Vec<Child> = (0..3).map(|i| start(i, 0)).collect();
    // The skew is real: the skewed replica's own log is dated 30 s off, both ways.
    let ahead = logged_skew(&log("r0", 0)).await;
    assert!((25.0..35.0).contains(&ahead), "r0 logs {ahead} s ahead");
    let mut outages = Vec::new();
    for round in 0..36 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if round == 12 || round == 24 {
            // An outage: every replica down for 4 s, then the skewed one alone for 4 s.
            for replica in &mut replicas {
                kill(replica);
            }
            let down = clock(&client).await;
            tokio::time::sleep(Duration::from_secs(4)).await;
            let up = clock(&client).await;
            starts[0] += 1;
            replicas[0] = start(0, starts[0]);
            tokio::time::sleep(Duration::from_secs(4)).await;
            let others = clock(&client).await;
            for i in 1..3 {
                starts[i] += 1;
                replicas[i] = start(i, starts[i]);
            }
            outages.push((down, up, others));
            continue;
        }
        let victim = round % names.len();
        kill(&mut replicas[victim]);
        starts[victim] += 1;
        replicas[victim] = start(victim, starts[victim]);
        if victim == 0 && starts[0] == 1 {
            let behind = logged_skew(&log("r0", 1)).await;
            assert!((-35.0..-25.0).contains(&behind), "r0 logs {behind} s off");
        }
    }
    for replica in &mut replicas {
        kill(replica);
    }
    // One replica catches up what the last kills left due, then stops.
    let closer = Processes(vec![replica(&url, "closer", None, &log("closer", 0))]);
    eventually("every schedule fired up to now", || async {
        count(
            &client,
            "etl_schedules WHERE next_fire_at < clock_timestamp() - interval '1 second'",
        )
        .await
            == 0
    })
    .await;
    drop(closer);
    std::fs::remove_dir_all(&logs).unwrap();

    // Every fire made one job of its own, and no job exists without its fire.
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT job_id),
                    (SELECT count(*) FROM etl_jobs WHERE kind = 'test.tick'),
                    count(*) FILTER (WHERE outcome <> 'enqueued'),
                    count(*) FILTER (WHERE fired_at < fire_at)
               FROM etl_schedule_fires",
            &[],
        )
        .await
        .unwrap();
    let (fires, distinct_jobs, jobs_made): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert!(
        fires >= 2 * PER_POLICY as i64 * 100,
        "{fires} fires in two minutes"
    );
    assert_eq!(distinct_jobs, fires, "each fire its own job");
    assert_eq!(jobs_made, fires, "no job without its fire, none twice");
    assert_eq!(row.get::<_, i64>(3), 0, "none missed or skipped");
    assert_eq!(
        row.get::<_, i64>(4),
        0,
        "none fired early, skewed clock or not"
    );
    // Catch-up: every second of every schedule, from its first fire to its last.
    let gapped = count(
        &client,
        "(SELECT name FROM etl_schedule_fires WHERE name LIKE 'c%' GROUP BY name
           HAVING extract(epoch FROM max(fire_at) - min(fire_at))::int8 + 1 <> count(*)) g",
    )
    .await;
    assert_eq!(gapped, 0, "catch-up schedules missed no second");
    for (down, up, others) in outages {
        // While every replica was down nothing fired; the skewed replica, alone, fired every
        // schedule; and each coalescing schedule made one job for the whole outage.
        let alone = client
            .query_one(
                "SELECT count(DISTINCT name) FROM etl_schedule_fires
                  WHERE fired_at > $1 AND fired_at < $2",
                &[&up, &others],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(
            alone,
            2 * PER_POLICY as i64,
            "the skewed replica fired them all"
        );
        let spans = client
            .query(
                "SELECT s.name,
                        (SELECT max(fire_at) FROM etl_schedule_fires f
                          WHERE f.name = s.name AND f.fire_at <= $1),
                        (SELECT min(fire_at) FROM etl_schedule_fires f
                          WHERE f.name = s.name AND f.fire_at > $1)
                   FROM etl_schedules s WHERE s.name LIKE 'g%'",
                &[&down],
            )
            .await
            .unwrap();
        assert_eq!(spans.len(), PER_POLICY);
        for span in spans {
            let name: String = span.get(0);
            let before: chrono::DateTime<chrono::Utc> = span.get(1);
            let after: chrono::DateTime<chrono::Utc> = span.get(2);
            assert!(
                after > up - chrono::Duration::seconds(1),
                "{name}: fired at {after} while all were down ({down} to {up})"
            );
            assert!(
                after - before >= chrono::Duration::seconds(3),
                "{name}: one job for the outage, {before} then {after}"
            );
        }
    }
}
