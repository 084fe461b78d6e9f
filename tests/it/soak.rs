//! A bounded chaos soak with real processes: three replicas of the binary work through 5,000 ETL
//! jobs of a queue capped below their slots ([`CAP`]), spread over [`KEYS`] concurrency keys
//! capped at [`KEY_CAP`] each, while they are repeatedly SIGKILLed (and restarted with their
//! owner id), frozen with SIGSTOP/SIGCONT, and have their backends terminated; a sampler counts
//! the queue's running jobs, and each key's, every few milliseconds throughout. Once the faults stop, every invariant is
//! checked from the database, and the replicas' logs are searched for privacy canaries. The
//! figures are printed and written to `soak-figures.txt` in Cargo's target temporary directory.

use crate::privacy::leak;
use crate::support::{
    assert_settled_once, count, enqueue_loads, signal, spawn_replica_logged, Processes, TestDb,
    LEDGERS,
};
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Jobs enqueued, in batches of [`BATCH`].
const JOBS: usize = 5_000;
/// Jobs per enqueue batch.
const BATCH: usize = 100;
/// The cap of the jobs' queue: below the replicas' 24 slots, so it binds.
const CAP: i32 = 8;
/// The concurrency keys the jobs are spread over (each job's key set in its enqueue's
/// transaction).
const KEYS: i32 = 6;
/// The cap of each key's running jobs: [`KEYS`] × [`KEY_CAP`] is above [`CAP`], so both bind.
const KEY_CAP: i32 = 2;
/// How often the sampler counts the capped queue's running jobs.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Target rows each job upserts (distinct keys).
const RECORDS: usize = 3;
/// Attempts allowed per job: high enough that faults alone never exhaust one.
const MAX_ATTEMPTS: i32 = 20;
/// How long faults are injected (at least; until every batch is enqueued).
const CHAOS: Duration = Duration::from_secs(45);
/// Time between two faults.
const FAULT_EVERY: Duration = Duration::from_millis(300);
/// How long every job gets to end once the faults stop.
const SETTLE_BOUND: Duration = Duration::from_secs(120);
/// The replicas' flags: short leases and transaction timeouts, so faults heal quickly.
const ARGS: &[&str] = &[
    "--lease",
    "2s",
    "--heartbeat-interval",
    "500ms",
    "--idle-in-transaction-timeout",
    "2s",
    "--retry-min-delay",
    "50ms",
    "--retry-max-delay",
    "500ms",
    "--shutdown-grace",
    "5s",
];

/// One replica slot: its owner id, log file and current process.
struct Slot {
    /// Stable owner id, reused by every incarnation.
    owner: String,
    /// Standard error of every incarnation, appended.
    log: PathBuf,
    /// When a frozen incarnation is to be resumed.
    thaw_at: Option<Instant>,
}

/// The soak's counters.
#[derive(Debug, Default)]
struct Figures {
    /// SIGKILLs sent.
    kills: u32,
    /// SIGSTOPs sent (each followed by a SIGCONT).
    freezes: u32,
    /// Backends terminated.
    backend_kills: i64,
    /// Replica processes started after the first three (after kills, or after an exit).
    restarts: u32,
    /// Incarnations that exited without being killed by the soak.
    self_exits: u32,
    /// Jobs a kill or freeze caught running.
    caught: usize,
    /// Longest time from a kill or freeze until every job the faulted replica was running then
    /// had moved on (finished, or taken over under another claim).
    max_stuck: Duration,
}

impl Slot {
    /// Starts an incarnation of this replica, appending its standard error to the log.
    fn start(&self, db: &TestDb) -> std::process::Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // Debug level: the more the replicas say, the more the leak search covers.
        spawn_replica_logged(&db.config.url, &self.owner, ARGS, Stdio::from(log), "debug")
    }
}

/// The claims `owner` holds now.
async fn claims_of(client: &tokio_postgres::Client, owner: &str) -> Vec<uuid::Uuid> {
    client
        .query(
            "SELECT lease_claim_id FROM etl_job_records WHERE status = 'running' AND lease_owner_id = $1",
            &[&owner],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Whether any of `claims` is still running.
async fn still_running(client: &tokio_postgres::Client, claims: &[uuid::Uuid]) -> bool {
    client
        .query_one(
            "SELECT count(*) FROM etl_job_records WHERE status = 'running' AND lease_claim_id = ANY($1)",
            &[&claims],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
}

/// The soak: see the module documentation. Passes only with every job succeeded once, the
/// target rows exactly the expected set, no payload left, attempts within bounds, every
/// faulted replica's jobs moved on, and no canary, SQL or database message in any log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_keeps_every_invariant() {
    let started = Instant::now();
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut slots: Vec<Slot> = (0..3)
        .map(|i| Slot {
            owner: format!("soak-{i}"),
            log: dir.join(format!("soak-{}-{i}.log", db.name)),
            thaw_at: None,
        })
        .collect();
    durable_etl::queue::set_cap(&client, "default", Some(CAP))
        .await
        .unwrap();
    durable_etl::queue::set_key_cap(&client, "default", Some(KEY_CAP))
        .await
        .unwrap();
    let sampler = Sampler::start(&db).await;
    let mut replicas = Processes(slots.iter().map(|s| s.start(&db)).collect());
    let mut figures = Figures::default();
    let mut watched: Vec<(Instant, Vec<uuid::Uuid>)> = Vec::new();
    let mut enqueued = 0;
    let chaos_ends = Instant::now() + CHAOS;
    while Instant::now() < chaos_ends || enqueued < JOBS {
        // Batches are spread over the chaos, so jobs flow while the faults happen.
        let due = (chaos_ends - CHAOS).elapsed().as_secs_f64() / CHAOS.as_secs_f64();
        if enqueued < JOBS && (enqueued as f64) / (JOBS as f64) <= due {
            // The ETL kind's enqueue names no key: the batch gets its keys in the enqueue's own
            // transaction, so no replica ever sees one of its jobs without a key.
            let tx = client.transaction().await.unwrap();
            let prefix = format!("b{enqueued}");
            let ids = enqueue_loads(&tx, &prefix, BATCH, RECORDS, MAX_ATTEMPTS).await;
            tx.execute(
                "UPDATE etl_job_records
                    SET concurrency_key = 'tenant-' || abs(hashtext(id::text)) % $2
                  WHERE id = ANY($1)",
                &[&ids, &KEYS],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            enqueued += BATCH;
        }
        for (slot, child) in slots.iter_mut().zip(replicas.0.iter_mut()) {
            if slot.thaw_at.is_some_and(|t| t <= Instant::now()) {
                signal(child, "CONT");
                slot.thaw_at = None;
            }
            if child.try_wait().unwrap().is_some() {
                figures.self_exits += 1;
                figures.restarts += 1;
                *child = slot.start(&db);
            }
        }
        let i = rng.usize(..slots.len());
        match rng.u8(..3) {
            0 if slots[i].thaw_at.is_none() => {
                signal(&replicas.0[i], "KILL");
                replicas.0[i].wait().unwrap();
                figures.kills += 1;
                let claims = claims_of(&client, &slots[i].owner).await;
                figures.caught += claims.len();
                watched.push((Instant::now(), claims));
                replicas.0[i] = slots[i].start(&db);
                figures.restarts += 1;
            }
            1 if slots[i].thaw_at.is_none() => {
                signal(&replicas.0[i], "STOP");
                figures.freezes += 1;
                let claims = claims_of(&client, &slots[i].owner).await;
                figures.caught += claims.len();
                watched.push((Instant::now(), claims));
                slots[i].thaw_at = Some(Instant::now() + Duration::from_millis(rng.u64(500..3000)));
            }
            _ => {
                figures.backend_kills += client
                    .query_one(
                        "SELECT count(pg_terminate_backend(pid)) FROM (
                             SELECT pid FROM pg_stat_activity
                              WHERE datname = current_database() AND application_name LIKE 'durable-etl/%'
                              ORDER BY random() LIMIT 2) b",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0);
            }
        }
        watch(&client, &mut watched, &mut figures).await;
        tokio::time::sleep(FAULT_EVERY).await;
    }
    // The faults stop: resume the frozen, restart the dead.
    for (slot, child) in slots.iter_mut().zip(replicas.0.iter_mut()) {
        signal(child, "CONT");
        slot.thaw_at = None;
        if child.try_wait().unwrap().is_some() {
            figures.self_exits += 1;
            figures.restarts += 1;
            *child = slot.start(&db);
        }
    }
    let faults_stopped = Instant::now();
    while count(
        &client,
        "etl_job_records WHERE status IN ('pending', 'running')",
    )
    .await
        > 0
    {
        assert!(
            faults_stopped.elapsed() < SETTLE_BOUND,
            "jobs still unfinished {SETTLE_BOUND:?} after the faults stopped"
        );
        watch(&client, &mut watched, &mut figures).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled_in = faults_stopped.elapsed();
    watch(&client, &mut watched, &mut figures).await;
    let Sampled {
        samples,
        most_running,
        most_of_a_key,
        unpermitted,
    } = sampler.stop().await;
    let permits_held = count(&client, "etl_queue_permits WHERE claim_id IS NOT NULL").await
        + count(&client, "etl_key_permits").await;
    for child in &mut replicas.0 {
        signal(child, "TERM");
        child.wait().unwrap();
    }

    let succeeded = count(&client, "etl_jobs WHERE status = 'succeeded'").await;
    let lost = JOBS as i64 - succeeded;
    let duplicated = count(&client, LEDGERS).await - succeeded
        + count(
            &client,
            &format!("{LEDGERS} AND (rows_updated <> 0 OR rows_unchanged <> 0)"),
        )
        .await;
    let max_attempts_seen: i32 = client
        .query_one("SELECT max(attempts) FROM etl_jobs", &[])
        .await
        .unwrap()
        .get(0);
    let (mut leaks, mut lines) = (Vec::new(), 0);
    for slot in &slots {
        let log = std::fs::read_to_string(&slot.log).unwrap_or_default();
        lines += log.lines().count();
        leaks.extend(log.lines().filter(|l| leak(l).is_some()).map(str::to_owned));
        let _ = std::fs::remove_file(&slot.log);
    }
    let report = format!(
        "chaos soak (seed {seed}): {JOBS} jobs, 3 replicas, {:?} of faults\n\
         kills {}, freezes {}, jobs they caught running {}, backend kills {}, restarts {}, self-exits {}\n\
         lost {lost}, duplicated {duplicated}, highest attempts {max_attempts_seen} (max {MAX_ATTEMPTS})\n\
         max stuck after a kill or freeze {:?}, all terminal {:?} after the faults stopped\n\
         cap {CAP}, key cap {KEY_CAP} over {KEYS} keys: most running at once {most_running} and of one key {most_of_a_key} in {samples} samples, running without a permit {unpermitted}, permits held once drained {permits_held}\n\
         log lines {lines}, of which with a canary, SQL or database message: {}\n\
         wall time {:?}\n",
        faults_stopped - (chaos_ends - CHAOS),
        figures.kills,
        figures.freezes,
        figures.caught,
        figures.backend_kills,
        figures.restarts,
        figures.self_exits,
        figures.max_stuck,
        settled_in,
        leaks.len(),
        started.elapsed(),
    );
    println!("{report}");
    std::fs::write(dir.join("soak-figures.txt"), &report).unwrap();

    assert_eq!((lost, duplicated), (0, 0), "{report}");
    assert!(most_running <= i64::from(CAP), "{report}");
    assert!(most_of_a_key <= i64::from(KEY_CAP), "{report}");
    assert!(
        most_running > 1 && most_of_a_key >= 1 && samples > 100,
        "the sampler saw the caps work: {report}"
    );
    assert_eq!((unpermitted, permits_held), (0, 0), "{report}");
    assert!(lines > 0, "the replicas logged something to search");
    assert!(leaks.is_empty(), "{:?}", &leaks[..leaks.len().min(5)]);
    assert!(
        watched.is_empty(),
        "claims of faulted replicas still running"
    );
    assert_settled_once(&client, (JOBS * RECORDS) as i64).await;
    let expected: BTreeSet<String> = (0..JOBS / BATCH)
        .flat_map(|b| {
            (0..BATCH)
                .flat_map(move |i| (0..RECORDS).map(move |r| format!("b{}-{i}-{r}", b * BATCH)))
        })
        .collect();
    let loaded: BTreeSet<String> = client
        .query("SELECT record_key FROM etl_target_rows", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        loaded == expected,
        "the target rows are exactly the expected set"
    );
}

/// What the [`Sampler`] saw.
#[derive(Debug, Default)]
struct Sampled {
    /// Samples taken.
    samples: u64,
    /// The most running jobs of the queue at once.
    most_running: i64,
    /// The most running jobs of one key at once.
    most_of_a_key: i64,
    /// Samples with a running job that held no queue permit or no key permit.
    unpermitted: i64,
}

/// Counts the capped queue's running jobs, in all and per key, every [`SAMPLE_EVERY`] on a
/// connection of its own, until stopped: the database's own count, whoever holds the jobs (a
/// frozen replica's count too), each sample one snapshot.
struct Sampler {
    /// Asks it to stop.
    stop: tokio::sync::watch::Sender<bool>,
    /// What it saw.
    task: tokio::task::JoinHandle<Sampled>,
}

impl Sampler {
    /// Starts sampling `db`.
    async fn start(db: &TestDb) -> Sampler {
        let client = db.client().await;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut seen = Sampled::default();
            while !*stopped.borrow() {
                // The faults terminate only durable-etl's own sessions, never this one; an error
                // ends the sampling, and the sample-count assertion catches that.
                let Ok(row) = client
                    .query_one(
                        "WITH r AS MATERIALIZED (
                             SELECT permit_slot, concurrency_key, lease_claim_id
                               FROM etl_job_records WHERE queue = 'default' AND status = 'running'
                         )
                         SELECT (SELECT count(*) FROM r),
                                (SELECT coalesce(max(n), 0)
                                   FROM (SELECT count(*) AS n FROM r GROUP BY concurrency_key) k),
                                (SELECT count(*) FROM r
                                  WHERE r.permit_slot IS NULL
                                     OR NOT EXISTS (SELECT FROM etl_key_permits p
                                                     WHERE p.claim_id = r.lease_claim_id))",
                        &[],
                    )
                    .await
                else {
                    break;
                };
                seen.samples += 1;
                seen.most_running = seen.most_running.max(row.get::<_, i64>(0));
                seen.most_of_a_key = seen.most_of_a_key.max(row.get::<_, i64>(1));
                seen.unpermitted += i64::from(row.get::<_, i64>(2) > 0);
                tokio::select! {
                    () = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = stopped.changed() => {}
                }
            }
            seen
        });
        Sampler { stop, task }
    }

    /// Stops it, and says what it saw.
    async fn stop(self) -> Sampled {
        let _ = self.stop.send(true);
        self.task.await.unwrap()
    }
}

/// Records, for every watched fault whose claims have all moved on, how long that took.
async fn watch(
    client: &tokio_postgres::Client,
    watched: &mut Vec<(Instant, Vec<uuid::Uuid>)>,
    figures: &mut Figures,
) {
    let mut still = Vec::new();
    for (at, claims) in watched.drain(..) {
        if still_running(client, &claims).await {
            still.push((at, claims));
        } else {
            figures.max_stuck = figures.max_stuck.max(at.elapsed());
        }
    }
    *watched = still;
}
