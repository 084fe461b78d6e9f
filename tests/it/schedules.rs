//! Recurring schedules against PostgreSQL: each fire makes one job whoever evaluates it, racing
//! evaluators included; missed fires follow their policy; overlap, pause, resume and delete;
//! declared schedules of two releases side by side; owner scoping; refusals that write nothing;
//! and a replica that runs what its schedules make without waiting for its poll.

use crate::support::{count, eventually, pool, TestDb};
use durable_etl::schedule::{Missed, Overlap, ScheduleOptions};
use durable_etl::worker::scheduler::{self, Fired};
use durable_etl::{
    shutdown, Code, Error, Job, JobContext, JobError, Jobs, Perform, Registry, Secret, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio_postgres::Client;

/// The test's report kind: what a schedule makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Report {
    /// Which report.
    name: String,
}

impl Job for Report {
    const KIND: &'static str = "test.report";
}

/// Runs reports, writing nothing.
struct Reporter;

impl Perform for Reporter {
    type Job = Report;
    type Effects = ();

    async fn compute(&self, _job: Report, _ctx: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

/// The handle of owner `owner`.
fn jobs(owner: &str) -> Jobs {
    Jobs::new(Secret::new("schedules-test-secret").unwrap(), owner)
}

/// A report named `name`.
fn report(name: &str) -> Report {
    Report {
        name: name.to_owned(),
    }
}

/// Moves schedule `name`'s next fire `seconds` whole seconds into the past (as if no replica
/// evaluated it meanwhile).
async fn due_since(client: &Client, name: &str, seconds: i32) {
    client
        .execute(
            "UPDATE etl_schedules
                SET next_fire_at = date_trunc('second', clock_timestamp())
                                   - make_interval(secs => $2)
              WHERE name = $1",
            &[&name, &f64::from(seconds)],
        )
        .await
        .unwrap();
}

/// One evaluation pass on a connection of its own.
async fn fire(db: &TestDb) -> Fired {
    let mut client = db.client().await;
    scheduler::fire_due(&mut client).await.unwrap()
}

/// The outcomes recorded for schedule `name`, oldest first.
async fn outcomes(client: &Client, name: &str) -> Vec<String> {
    crate::support::first_column(
        client,
        &format!("SELECT outcome FROM etl_schedule_fires WHERE name = '{name}' ORDER BY fire_at"),
    )
    .await
}

#[tokio::test]
async fn a_due_fire_makes_one_job_and_a_locked_schedule_is_skipped_not_fired_twice() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    schedules
        .put(
            &client,
            "nightly",
            "0 0 * * *",
            &report("n"),
            ScheduleOptions::default(),
        )
        .await
        .unwrap();
    // Due since midnight: no later fire comes due while the test runs (bar a midnight).
    client
        .execute(
            "UPDATE etl_schedules SET next_fire_at = date_trunc('day', clock_timestamp())",
            &[],
        )
        .await
        .unwrap();
    // Another evaluator holds the row: this one skips it and fires nothing.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute(
        "SELECT FROM etl_schedules WHERE name = 'nightly' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(fire(&db).await.schedules, 0);
    held.rollback().await.unwrap();
    let fired = fire(&db).await;
    assert_eq!((fired.schedules, fired.jobs), (1, 1));
    // The fire is made: again, nothing is due.
    assert_eq!(fire(&db).await.schedules, 0);
    // A fire replayed (its schedule moved back onto it) returns the job it made: no second one.
    client
        .execute("UPDATE etl_schedules SET next_fire_at = last_fire_at", &[])
        .await
        .unwrap();
    let replayed = fire(&db).await;
    assert_eq!((replayed.schedules, replayed.jobs), (1, 0));
    assert_eq!(
        count(&client, "etl_jobs WHERE kind = 'test.report'").await,
        1
    );
    let row = client
        .query_one(
            "SELECT j.run_at >= f.fire_at AND j.run_at <= clock_timestamp(),
                    j.queue, j.max_attempts, s.next_fire_at > f.fire_at,
                    s.last_job_id = j.id
               FROM etl_schedule_fires f JOIN etl_jobs j ON j.id = f.job_id
               JOIN etl_schedules s ON s.name = f.name",
            &[],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "the job is due at once, since its fire"
    );
    assert_eq!(
        (row.get::<_, String>(1), row.get::<_, i32>(2)),
        ("default".to_owned(), 5)
    );
    assert!(row.get::<_, bool>(3) && row.get::<_, bool>(4));
    // The job is the owner's, as one enqueued through the handle would be.
    let listed = jobs("alice")
        .list(&client, Default::default(), None, 10)
        .await
        .unwrap();
    assert_eq!(listed.jobs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_evaluators_make_exactly_one_job_per_fire_and_miss_none() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    for i in 0..20 {
        let options = ScheduleOptions {
            missed: Missed::CatchUp(1000),
            ..ScheduleOptions::default()
        };
        schedules
            .put(
                &client,
                &format!("s{i}"),
                "* * * * * *",
                &report("r"),
                options,
            )
            .await
            .unwrap();
    }
    // Four evaluators race for 3 seconds, each looping as fast as it can.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let db = &db;
            async move {
                let mut client = db.client().await;
                while tokio::time::Instant::now() < until {
                    scheduler::fire_due(&mut client).await.unwrap();
                }
            }
        })
        .collect();
    futures::future::join_all(racers).await;
    let fires = count(&client, "etl_schedule_fires WHERE outcome = 'enqueued'").await;
    let made = count(&client, "etl_jobs WHERE kind = 'test.report'").await;
    assert!(fires >= 20 * 2, "{fires} fires");
    assert_eq!(made, fires, "one job per fire");
    // Per schedule, its fires are every second from its first to its last: none missed.
    let gaps = count(
        &client,
        "(SELECT name, max(fire_at) - min(fire_at) AS span, count(*) AS n
            FROM etl_schedule_fires GROUP BY name) s
          WHERE extract(epoch FROM span)::int + 1 <> n",
    )
    .await;
    assert_eq!(gaps, 0, "every second fired once");
}

#[tokio::test]
async fn missed_fires_coalesce_catch_up_or_are_skipped_when_an_evaluator_comes_back() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    // Three every second, missed for 10 seconds; a yearly one, missed for 400 days.
    for (name, cron, missed, since) in [
        ("coalesced", "* * * * * *", Missed::Coalesce, 10),
        ("caught_up", "* * * * * *", Missed::CatchUp(4), 10),
        ("skipped", "* * * * * *", Missed::Skip, 10),
        ("yearly", "@yearly", Missed::Skip, 400 * 86_400),
    ] {
        let options = ScheduleOptions {
            missed,
            ..ScheduleOptions::default()
        };
        schedules
            .put(&client, name, cron, &report(name), options)
            .await
            .unwrap();
        due_since(&client, name, since).await;
    }
    let fired = fire(&db).await;
    assert_eq!(fired.schedules, 4);
    assert_eq!(outcomes(&client, "coalesced").await, ["enqueued"]);
    assert_eq!(outcomes(&client, "caught_up").await, ["enqueued"; 4]);
    // Under skip the late fires make nothing; the one on time still runs.
    assert_eq!(outcomes(&client, "skipped").await, ["enqueued"]);
    assert_eq!(outcomes(&client, "yearly").await, ["missed"]);
    assert_eq!(fired.jobs, 6);
    assert!(fired.without_job > 10 + 7 + 10, "{fired:?}");
    // Missed fires by policy: the coalesced ones, those beyond the catch-up bound of 4, and the
    // late ones skipped (the yearly's among them).
    let missed = fired.missed;
    assert!(missed.coalesce >= 10, "{fired:?}");
    assert_eq!(missed.catch_up, missed.coalesce - 3, "{fired:?}");
    assert!(missed.skip > missed.coalesce, "{fired:?}");
    assert_eq!(
        missed.coalesce + missed.catch_up + missed.skip,
        fired.without_job,
        "{fired:?}"
    );
    // One lateness per job; the oldest fire caught up was some 3 seconds late.
    assert_eq!(fired.lateness.len(), 6);
    assert!(
        fired.lateness.iter().max() >= Some(&Duration::from_secs(3)),
        "{fired:?}"
    );
    assert_eq!(fired.overlapped, 0);
    // Each job is due at its fire's instant, however late it was made.
    let dated = "etl_schedule_fires f JOIN etl_jobs j ON j.id = f.job_id";
    assert_eq!(count(&client, dated).await, 6);
    assert_eq!(
        count(&client, &format!("{dated} WHERE j.run_at <> f.fire_at")).await,
        0
    );
}

/// The test's second kind, so one pass fires schedules of two kinds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Digest {
    /// How many days it sums.
    days: u32,
}

impl Job for Digest {
    const KIND: &'static str = "test.digest";
}

#[tokio::test]
async fn one_pass_fires_schedules_of_several_owners_and_kinds_each_job_its_own_schedules() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    for owner in ["alice", "bob"] {
        let schedules = jobs(owner).schedules();
        for i in 0..3 {
            let (report_name, digest_name) = (format!("report_{i}"), format!("digest_{i}"));
            let options = ScheduleOptions::default;
            schedules
                .put(
                    &client,
                    &report_name,
                    "* * * * * *",
                    &report(owner),
                    options(),
                )
                .await
                .unwrap();
            let digest = Digest { days: i };
            schedules
                .put(&client, &digest_name, "* * * * * *", &digest, options())
                .await
                .unwrap();
            due_since(&client, &report_name, 2).await;
            due_since(&client, &digest_name, 2).await;
        }
    }
    let fired = fire(&db).await;
    assert_eq!((fired.schedules, fired.jobs), (12, 12));
    // Each job has its schedule's owner, kind and arguments, and is dated at its fire.
    let own = "etl_schedule_fires f JOIN etl_schedules s USING (owner_key, name)
               JOIN etl_job_records j ON j.id = f.job_id";
    assert_eq!(count(&client, own).await, 12);
    assert_eq!(
        count(
            &client,
            &format!(
                "{own} WHERE (j.owner_key, j.kind, j.request_payload, j.run_at)
                         IS DISTINCT FROM (s.owner_key, s.kind, s.args, f.fire_at)"
            )
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &client,
            "etl_schedules WHERE next_fire_at <= clock_timestamp() - interval '1 second'"
        )
        .await,
        0,
        "every schedule moved past its fire"
    );
}

#[tokio::test]
async fn under_overlap_skip_a_fire_makes_no_job_while_the_last_one_lives() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    let options = ScheduleOptions {
        overlap: Overlap::Skip,
        ..ScheduleOptions::default()
    };
    schedules
        .put(&client, "exclusive", "* * * * * *", &report("x"), options)
        .await
        .unwrap();
    due_since(&client, "exclusive", 0).await;
    assert_eq!(fire(&db).await.jobs, 1);
    // Its job is still pending: the next fire, a second later, overlaps it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let overlapped = fire(&db).await;
    assert_eq!((overlapped.jobs, overlapped.overlapped), (0, 1));
    assert_eq!(
        outcomes(&client, "exclusive").await,
        ["enqueued", "overlapped"]
    );
    // Once it ended, the next fire makes one again.
    client
        .execute(
            "DELETE FROM etl_job_records WHERE kind = 'test.report'",
            &[],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(fire(&db).await.jobs, 1);
}

#[tokio::test]
async fn a_paused_schedule_fires_nothing_resumes_from_now_and_is_its_owners_alone() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let (alice, bob) = (jobs("alice").schedules(), jobs("bob").schedules());
    alice
        .put(
            &client,
            "daily",
            "0 6 * * *",
            &report("d"),
            ScheduleOptions::default(),
        )
        .await
        .unwrap();
    // Bob sees none of Alice's, and can touch none.
    assert_eq!(bob.get(&client, "daily").await.unwrap(), None);
    assert!(bob.list(&client).await.unwrap().is_empty());
    assert!(!bob.pause(&client, "daily").await.unwrap());
    assert!(!bob.delete(&client, "daily").await.unwrap());

    assert!(alice.pause(&client, "daily").await.unwrap());
    due_since(&client, "daily", 30).await;
    assert_eq!(fire(&db).await.schedules, 0, "paused");
    assert!(alice.resume(&client, "daily").await.unwrap());
    let resumed = alice.get(&client, "daily").await.unwrap().unwrap();
    assert!(!resumed.paused);
    assert!(resumed.next_fire_at > chrono::Utc::now(), "{resumed:?}");
    assert_eq!(fire(&db).await.jobs, 0, "the passed fires are not missed");
    assert!(
        alice.resume(&client, "daily").await.unwrap(),
        "resumed twice"
    );
    assert!(!alice.resume(&client, "nothing").await.unwrap());

    // A name no schedule can have is nobody's, and never reaches the database.
    for odd in ["Bad Name", "nul\u{0}byte", ""] {
        assert_eq!(alice.get(&client, odd).await.unwrap(), None);
        assert!(!alice.pause(&client, odd).await.unwrap());
        assert!(!alice.resume(&client, odd).await.unwrap());
        assert!(!alice.delete(&client, odd).await.unwrap());
        assert!(alice.fires(&client, odd, 5).await.unwrap().is_empty());
    }
    assert!(alice.delete(&client, "daily").await.unwrap());
    assert_eq!(count(&client, "etl_schedules").await, 0);
    assert!(!alice.delete(&client, "daily").await.unwrap());
}

#[tokio::test]
async fn two_releases_declare_their_schedules_side_by_side_and_a_redeclare_keeps_the_next_fire() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("ops").schedules();
    // Release 1 declares a and b; release 2, rolling out beside it, a (changed) and c.
    for (name, cron) in [("a", "0 * * * *"), ("b", "0 0 * * *")] {
        schedules
            .declare(
                &client,
                name,
                cron,
                &report("v1"),
                ScheduleOptions::default(),
            )
            .await
            .unwrap();
    }
    let before = schedules.get(&client, "a").await.unwrap().unwrap();
    for (name, cron) in [("a", "0 * * * *"), ("c", "*/5 * * * *")] {
        schedules
            .declare(
                &client,
                name,
                cron,
                &report("v2"),
                ScheduleOptions::default(),
            )
            .await
            .unwrap();
    }
    let names: Vec<String> = schedules
        .list(&client)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        ["a", "b", "c"],
        "nothing a release does not know is deleted"
    );
    let after = schedules.get(&client, "a").await.unwrap().unwrap();
    assert!(after.declared);
    assert_eq!(
        after.next_fire_at, before.next_fire_at,
        "same expression: same next fire"
    );
    let args: serde_json::Value = client
        .query_one("SELECT args FROM etl_schedules WHERE name = 'a'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(args, serde_json::json!({"name": "v2"}));
    // A new expression moves the next fire to its own.
    let options = ScheduleOptions {
        time_zone: Some("Asia/Kolkata"),
        ..ScheduleOptions::default()
    };
    let moved = schedules
        .put(&client, "a", "15 * * * *", &report("v2"), options)
        .await
        .unwrap();
    assert_eq!(moved.time_zone, "Asia/Kolkata");
    assert!(!moved.declared);
    assert_eq!(
        chrono::Timelike::minute(&moved.next_fire_at),
        45,
        "xx:15 in Kolkata (+05:30) is xx:45 UTC"
    );
}

/// A job whose arguments do not serialize (a map with keys that are not strings).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Unserializable {
    /// Keyed by pairs, which JSON cannot key by.
    by_pair: std::collections::BTreeMap<(u8, u8), u8>,
}

impl Job for Unserializable {
    const KIND: &'static str = "test.unserializable";
}

#[tokio::test]
async fn a_schedule_set_is_declared_in_one_transaction_and_a_refusal_writes_none_of_it() {
    use durable_etl::schedule::ScheduleSet;
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let schedules = jobs("alice").schedules();
    let london = ScheduleOptions {
        time_zone: Some("Europe/London"),
        queue: Some("reports"),
        priority: Some(3),
        max_attempts: Some(7),
        missed: Missed::CatchUp(5),
        overlap: Overlap::Skip,
    };
    let release = ScheduleSet::new()
        .schedule("nightly", "30 1 * * *", &report("n"), london)
        .schedule(
            "hourly",
            "@hourly",
            &report("h"),
            ScheduleOptions::default(),
        );
    assert_eq!((release.len(), release.is_empty()), (2, false));
    // One bad schedule refuses the whole set, pointing at it.
    let refusals = [
        (
            release.clone().schedule(
                "broken",
                "61 * * * *",
                &report("b"),
                ScheduleOptions::default(),
            ),
            Code::ScheduleInvalid,
            "/2/cron",
        ),
        (
            release.clone().schedule(
                "unserializable",
                "@daily",
                &Unserializable {
                    by_pair: [((1, 2), 3)].into(),
                },
                ScheduleOptions::default(),
            ),
            Code::InvalidPayload,
            "/2",
        ),
        (
            release.clone().schedule(
                "Bad Name",
                "@daily",
                &report("b"),
                ScheduleOptions::default(),
            ),
            Code::ScheduleInvalid,
            "/2/name",
        ),
    ];
    for (set, code, pointer) in refusals {
        match set.declare(&mut client, &schedules).await {
            Err(Error::Rejected(r)) => assert_eq!((r.code, r.pointer.as_str()), (code, pointer)),
            other => panic!("{other:?}"),
        }
        assert_eq!(count(&client, "etl_schedules").await, 0, "none of the set");
    }
    let stored = release.declare(&mut client, &schedules).await.unwrap();
    let names: Vec<&str> = stored.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["nightly", "hourly"]);
    let nightly = &stored[0];
    assert!(nightly.declared);
    assert_eq!(
        (nightly.time_zone.as_str(), nightly.queue.as_str()),
        ("Europe/London", "reports")
    );
    assert_eq!(
        (
            nightly.priority,
            nightly.max_attempts,
            nightly.missed,
            nightly.overlap
        ),
        (3, 7, Missed::CatchUp(5), Overlap::Skip)
    );
    // The next release declares another set: nothing of the first is deleted, and the one it
    // declares again keeps its next fire.
    let next = ScheduleSet::new()
        .schedule(
            "hourly",
            "@hourly",
            &report("h2"),
            ScheduleOptions::default(),
        )
        .schedule(
            "weekly",
            "@weekly",
            &report("w"),
            ScheduleOptions::default(),
        )
        .declare(&mut client, &schedules)
        .await
        .unwrap();
    assert_eq!(next[0].next_fire_at, stored[1].next_fire_at);
    assert_eq!(count(&client, "etl_schedules WHERE declared").await, 3);
    assert!(ScheduleSet::new().is_empty());
}

#[tokio::test]
async fn an_invalid_definition_is_refused_with_its_pointer_and_writes_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    let refused = |e: Error| match e {
        Error::Rejected(r) => (r.code, r.pointer),
        other => panic!("unexpected {other:?}"),
    };
    let cases: [(&str, &str, ScheduleOptions<'_>, &str); 7] = [
        ("Bad Name", "* * * * *", ScheduleOptions::default(), "/name"),
        ("ok", "not cron", ScheduleOptions::default(), "/cron"),
        ("ok", "0 0 30 2 *", ScheduleOptions::default(), "/cron"),
        (
            "ok",
            "* * * * *",
            ScheduleOptions {
                time_zone: Some("Nowhere/Special"),
                ..ScheduleOptions::default()
            },
            "/time_zone",
        ),
        (
            "ok",
            "* * * * *",
            ScheduleOptions {
                queue: Some("Bad Queue"),
                ..ScheduleOptions::default()
            },
            "/queue",
        ),
        (
            "ok",
            "* * * * *",
            ScheduleOptions {
                priority: Some(10),
                max_attempts: Some(0),
                ..ScheduleOptions::default()
            },
            "/priority",
        ),
        (
            "ok",
            "* * * * *",
            ScheduleOptions {
                missed: Missed::CatchUp(0),
                ..ScheduleOptions::default()
            },
            "/missed",
        ),
    ];
    for (name, cron, options, pointer) in cases {
        let e = schedules
            .put(&client, name, cron, &report("r"), options)
            .await
            .unwrap_err();
        assert_eq!(refused(e), (Code::ScheduleInvalid, pointer.to_owned()));
    }
    let e = schedules
        .put(
            &client,
            "ok",
            "* * * * *",
            &report("r"),
            ScheduleOptions {
                max_attempts: Some(0),
                ..ScheduleOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(refused(e).1, "/max_attempts");
    assert_eq!(count(&client, "etl_schedules").await, 0);
}

/// A replica whose poll is a minute runs each fire's job within moments: the fire's insert wakes
/// it, and the scheduler sleeps until the next fire, not a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_fires_and_runs_its_schedules_jobs_without_waiting_for_its_poll() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    jobs("alice")
        .schedules()
        .put(
            &client,
            "tick",
            "* * * * * *",
            &report("t"),
            ScheduleOptions::default(),
        )
        .await
        .unwrap();
    let config = WorkerConfig {
        owner_id: "scheduling".into(),
        poll_interval: Duration::from_secs(60),
        ..WorkerConfig::default()
    };
    let worker = Worker::start(
        pool(&db).await,
        &db.config,
        config,
        Registry::new().perform(Reporter),
    )
    .await
    .unwrap();
    let stats = worker.stats_handle();
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(worker.run(until));
    eventually("four fires run", || async {
        count(
            &client,
            "etl_jobs WHERE kind = 'test.report' AND status = 'succeeded'",
        )
        .await
            >= 4
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
    let counted = stats.snapshot();
    assert!(counted.schedule_jobs >= 3, "{counted:?}");
    assert_eq!(counted.schedule_overlapped, 0);
    let text = durable_etl::service::metrics::render_worker(&stats);
    assert!(
        text.contains("durable_etl_schedule_lateness_seconds_count"),
        "{text}"
    );
    for policy in ["coalesce", "catch_up", "skip"] {
        let series = format!("durable_etl_schedule_fires_missed_total{{policy=\"{policy}\"}} ");
        assert!(text.contains(&series), "{series}: {text}");
    }
    // Each ran within a second of its fire: neither the fire nor its job waited for a poll. (The
    // first may not: the replica first looks at the schedules only once it has started.)
    let late = count(
        &client,
        "etl_jobs j JOIN etl_schedule_fires f ON f.job_id = j.id
          WHERE j.status = 'succeeded' AND j.finished_at - f.fire_at > interval '1 second'
            AND f.fire_at > (SELECT min(fire_at) FROM etl_schedule_fires)",
    )
    .await;
    assert_eq!(late, 0);
    assert_eq!(
        count(&client, "etl_schedule_fires WHERE outcome <> 'enqueued'").await,
        0
    );
}

/// A replica's look at 10,000 schedules none of which is due costs one probe of the due index:
/// the due read and the next-due read each read at most one index entry and no table page of
/// a schedule that is not due, analyzed or not.
#[tokio::test]
async fn a_look_at_ten_thousand_schedules_none_due_reads_one_index_entry() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let schedules = jobs("alice").schedules();
    schedules
        .put(
            &client,
            "template",
            "0 6 * * *",
            &report("t"),
            ScheduleOptions::default(),
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO etl_schedules (owner_key, name, cron, time_zone, kind, args, queue,
                    priority, max_attempts, missed, catch_up_limit, overlap, declared,
                    next_fire_at)
             SELECT owner_key, 's' || i, cron, time_zone, kind, args, queue, priority,
                    max_attempts, missed, catch_up_limit, overlap, declared,
                    now() + make_interval(hours => 1 + i % 24)
               FROM etl_schedules, generate_series(1, 9999) AS i",
            &[],
        )
        .await
        .unwrap();
    for analyzed in [false, true] {
        if analyzed {
            client.batch_execute("ANALYZE etl_schedules").await.unwrap();
        }
        for (what, sql, params) in [
            ("due", scheduler::DUE_SQL, "(64)"),
            ("next due", scheduler::NEXT_DUE_SQL, ""),
        ] {
            let name = format!("probe_{}", what.replace(' ', "_"));
            client
                .batch_execute(&format!("PREPARE {name} AS {sql}"))
                .await
                .unwrap();
            let plan: serde_json::Value = client
                .query_one(
                    &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}{params}"),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            client
                .batch_execute(&format!("DEALLOCATE {name}"))
                .await
                .unwrap();
            let text = plan.to_string();
            assert!(
                text.contains("etl_schedules_due_idx"),
                "{what}, analyzed {analyzed}: {text}"
            );
            // The schedules are reached by the index, bounded by the clock, not filtered.
            let scan = node_of(&plan[0]["Plan"], "etl_schedules").expect("a scan of the schedules");
            let kind = scan["Node Type"].as_str().unwrap_or_default();
            assert!(kind.starts_with("Index"), "{what}: {text}");
            assert_eq!(
                scan["Rows Removed by Filter"].as_f64().unwrap_or_default(),
                0.0,
                "{what}: {text}"
            );
            let top = &plan[0]["Plan"];
            let rows = top["Actual Rows"].as_f64().unwrap_or_default();
            assert!(rows <= 1.0, "{what}: {rows} rows");
            let pages = top["Shared Hit Blocks"].as_i64().unwrap_or_default()
                + top["Shared Read Blocks"].as_i64().unwrap_or_default();
            assert!(
                pages <= 4,
                "{what}, analyzed {analyzed}: {pages} pages: {text}"
            );
        }
    }
}

/// The node of `plan` (or of a plan under it) that scans `relation`.
fn node_of<'p>(plan: &'p serde_json::Value, relation: &str) -> Option<&'p serde_json::Value> {
    if plan["Relation Name"] == relation {
        return Some(plan);
    }
    plan["Plans"]
        .as_array()?
        .iter()
        .find_map(|child| node_of(child, relation))
}

/// The pruner deletes fire records older than their time to keep, through the primary key, a
/// bounded batch per statement, skipping a record another transaction holds; it keeps younger
/// ones and never fires a pruned instant again.
#[tokio::test]
async fn fire_records_past_their_time_to_keep_are_pruned_in_bounded_batches() {
    use durable_etl::worker::maintain::prune::{prune_fires, FIRES_BATCH, FIRES_KEPT};
    let db = TestDb::migrated().await;
    let client = db.client().await;
    for (owner, name) in [("alice", "hourly"), ("bob", "minutely")] {
        jobs(owner)
            .schedules()
            .put(
                &client,
                name,
                "0 * * * *",
                &report(name),
                ScheduleOptions::default(),
            )
            .await
            .unwrap();
    }
    // Alice's schedule: a full batch and five more records older than 7 days, and three
    // younger. Bob's: two old records and one young.
    let kept_s = i64::try_from(FIRES_KEPT.as_secs()).unwrap();
    let seed = |name: &str, ages: std::ops::Range<i64>, offset_s: i64| {
        format!(
            "INSERT INTO etl_schedule_fires (owner_key, name, fire_at, outcome)
             SELECT s.owner_key, s.name, now() - make_interval(secs => {offset_s} + g), 'missed'
               FROM etl_schedules s, generate_series({}, {}) g WHERE s.name = '{name}'",
            ages.start,
            ages.end - 1
        )
    };
    let old = FIRES_BATCH + 5;
    for statement in [
        seed("hourly", 1..old + 1, kept_s + 60),
        seed("hourly", 1..4, 0),
        seed("minutely", 1..3, kept_s + 60),
        seed("minutely", 1..2, 0),
    ] {
        client.batch_execute(&statement).await.unwrap();
    }
    let next_before: Vec<String> = crate::support::first_column(
        &client,
        "SELECT next_fire_at::text FROM etl_schedules ORDER BY name",
    )
    .await;
    // Another transaction holds one of bob's old records: it is skipped, not waited for.
    let mut holder = db.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute(
        "SELECT FROM etl_schedule_fires WHERE name = 'minutely' AND fire_at < now() - interval '7 days'
          ORDER BY fire_at LIMIT 1 FOR UPDATE",
        &[],
    )
    .await
    .unwrap();

    let first = prune_fires(&client, FIRES_KEPT).await.unwrap();
    assert_eq!(first, u64::try_from(FIRES_BATCH).unwrap(), "one full batch");
    let second = prune_fires(&client, FIRES_KEPT).await.unwrap();
    assert_eq!(second, u64::try_from(old + 2 - 1 - FIRES_BATCH).unwrap());
    assert_eq!(prune_fires(&client, FIRES_KEPT).await.unwrap(), 0);
    held.rollback().await.unwrap();
    assert_eq!(prune_fires(&client, FIRES_KEPT).await.unwrap(), 1);
    assert_eq!(
        count(&client, "etl_schedule_fires").await,
        4,
        "the young ones stay"
    );
    let old_left: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_schedule_fires WHERE fire_at < now() - interval '7 days'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(old_left, 0);
    // The schedules are untouched: no next fire moved back, nothing fired.
    let next_after: Vec<String> = crate::support::first_column(
        &client,
        "SELECT next_fire_at::text FROM etl_schedules ORDER BY name",
    )
    .await;
    assert_eq!(next_before, next_after);
    assert_eq!(count(&client, "etl_job_records").await, 0);
}

#[tokio::test]
async fn an_owner_the_cell_lists_as_moved_can_add_no_schedule_and_the_others_fire() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    // Alice moved to another cell: `directory::moving` listed her so here, and took her
    // schedules with her.
    let alice = jobs("alice").owner_key();
    client
        .execute(
            "INSERT INTO etl_moved_owners (owner_key, moved_to) VALUES ($1::bytea, 'elsewhere')",
            &[&&alice[..]],
        )
        .await
        .unwrap();
    let put = |owner: &'static str| {
        let client = &client;
        async move {
            jobs(owner)
                .schedules()
                .put(
                    client,
                    "report",
                    "* * * * * *",
                    &report(owner),
                    ScheduleOptions::default(),
                )
                .await
        }
    };
    let refused = put("alice").await;
    assert!(matches!(refused, Err(Error::OwnerMoved)), "{refused:?}");
    put("bob").await.unwrap();
    due_since(&client, "report", 2).await;
    let fired = fire(&db).await;
    assert_eq!((fired.schedules, fired.jobs), (1, 1));
    let of = |key: &[u8; 32]| {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("etl_job_records WHERE owner_key = '\\x{hex}'")
    };
    assert_eq!(count(&client, &of(&jobs("bob").owner_key())).await, 1);
    // Her enqueues are refused here too, and nothing of hers is written.
    let refused = jobs("alice")
        .enqueue(&client, &report("late"), Default::default())
        .await;
    assert!(matches!(refused, Err(Error::OwnerMoved)), "{refused:?}");
    assert_eq!(count(&client, &of(&alice)).await, 0);
    assert_eq!(count(&client, "etl_schedules").await, 1);
}
