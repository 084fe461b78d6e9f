//! A lost-wake soak with real processes: [`REPLICAS`] replicas of the binary, each polling only
//! once a minute ([`POLL`]), so that a job no wake reaches waits for a poll far beyond the test's
//! bound, serve three overlapping queues ([`SERVING`]: every queue has three replicas, each with
//! [`SLOTS`] slots, far more than the load ever runs). Producers enqueue in bursts separated by
//! lulls ([`Bursts`]): through the library, on transactions of their own (single and bulk
//! enqueues of `noop` jobs, some held open up to [`HOLD_MAX`], about a fifth rolled back, replays
//! of earlier keys, and reused keys answered `idempotency_key_reused` and rolled back), and
//! through the HTTP API of a `serve` process (ETL jobs, replays and reused keys too). Meanwhile one
//! fault at a time strikes ([`chaos`]): a replica SIGKILLed and restarted with its owner id after
//! a moment, frozen with SIGSTOP for under a second, or every backend of its own connections
//! terminated; a queue paused and resumed; a queue's cap or key cap lowered, raised or lifted.
//!
//! A **lost wake** is a job that stayed claimable, without being claimed, for more than
//! [`LOST_AFTER`]. Claimable is replayed from the database's history once the queues drain
//! ([`Simulation::run`]): the job's enqueue had committed (the time taken right after the commit,
//! or the API's answer, returned), its queue was not paused, and an ideal claimer taking the
//! queue's pending jobs in claim order would have had a permit for it under the queue's cap and
//! its key's cap, counting every claim still running (a killed replica's too, until it was
//! recovered or released). So a job that waited in a paused or capped queue counts from its
//! resume, or from the cap raise or freed permit that let it run. A job is measured by its first
//! claim (the first attempt's `started_at`, which `etl_job_attempts` keeps when that attempt did
//! not end the job): the claim is what a wake causes, whatever befell the attempt after it, and
//! what follows a kill is recovery, not a wake (jobs whose first attempt was cut short are counted
//! in the report). The fault schedule never leaves a queue without a live replica with room: one
//! replica is faulted at a time (the next fault waits until it serves again) and every queue has
//! three, and the most claims running at once (printed) stays far below one replica's slots.
//!
//! The test fails if any wake was lost, and lists the worst (with the faults and settings around
//! each); it also checks that every committed job ended succeeded exactly once, that no
//! rolled-back job exists, that the ETL jobs loaded their rows once, and that replays and reused
//! keys were answered as documented. It prints the replicas' claim counters from `/metrics`
//! (empty claims per job) and the most connections the round's database had at once.
//! `LOST_WAKES_ROUNDS` (default 1) rounds of `LOST_WAKES_SECONDS` (default [`SECONDS`]) of load
//! and faults each, every round on a database and processes of its own; `LOST_WAKES_SEED` fixes
//! the seed (printed either way; the timing still varies). The figures also go to
//! `lost-wakes-figures.txt` in Cargo's target temporary directory, and each round's timeline
//! (bursts, faults, setting changes, and every job's commit, first claim and longest claimable
//! stretch) to `lost-wakes-timeline.txt`. `LOST_WAKES_LOG` sets the replicas' `RUST_LOG`
//! (default `warn`); their logs are kept when a wake was lost.

use crate::support::{
    admin_config, api_key, binary, connect, free_port, post_load, signal, spawn_replica_logged,
    until_serving, Processes, TestDb,
};
use durable_etl::{Code, EnqueueOptions, Jobs, Secret};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// The queues: `default` (where the API's ETL jobs go) and two more.
const QUEUES: [&str; 3] = ["default", "b", "c"];
/// The replicas' `--queues`, one per replica: each queue is served by three of them.
const SERVING: [&str; 4] = ["default,b", "b,c", "default,c", "default,b,c"];
/// Replica processes.
const REPLICAS: usize = SERVING.len();
/// Slots of each replica: far above what the load runs at once (the report prints the most
/// running at once), so a claimable job never waits for room.
const SLOTS: &str = "16";
/// Every replica's poll interval: a lost wake is not hidden by the poll. `LOST_WAKES_POLL`
/// overrides it, to check the measurement itself: with a poll of `100ms` the poll alone claims
/// every job well within [`LOST_AFTER`], so a lost wake reported then is the model's error.
const POLL: &str = "60s";

/// The replicas' poll interval: [`POLL`] unless `LOST_WAKES_POLL` says otherwise.
fn poll() -> String {
    std::env::var("LOST_WAKES_POLL").unwrap_or_else(|_| POLL.to_owned())
}
/// Each replica's and the API's pool: with the replica's fixed sessions (2 claim, 3 commit, 1
/// LISTEN) a replica opens at most 8 connections (`worker::budget`).
const POOL_SIZE: &str = "2";
/// Library producers, each on a connection of its own.
const PRODUCERS: usize = 3;
/// The concurrency keys of the keyed jobs (all of queue `c`'s, half of `b`'s).
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// The queues whose key caps change.
const KEYED_QUEUES: [&str; 2] = ["b", "c"];
/// Longest a producer's transaction stays open before it commits or rolls back.
const HOLD_MAX: Duration = Duration::from_secs(5);
/// Longest pause of a library job's handler.
const NAP_MAX_MS: u64 = 150;
/// The attempt bound of the library's jobs: faults alone never exhaust it.
const MAX_ATTEMPTS: i32 = 20;
/// How long a job may stay claimable without being claimed before its wake counts as lost.
const LOST_AFTER: f64 = 1.0;
/// Default seconds of load and faults per round.
const SECONDS: u64 = 60;
/// How long the queues get to drain by wakes alone once the load stops (and every setting is
/// lifted); then the test notifies every replica itself, so that the round ends without waiting
/// for the poll (a job still pending then has long been counted lost).
const GRACE: Duration = Duration::from_secs(5);
/// How long the queues get to drain after that.
const SETTLE_BOUND: Duration = Duration::from_secs(90);
/// Worst lost wakes listed per round.
const WORST: usize = 10;
/// The library producers' digest key.
const LIBRARY_SECRET: &str = "lost-wakes-secret-0123456789";

/// Seconds since the Unix epoch, now (the clock PostgreSQL's timestamps use: same host).
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// When the producers begin transactions: bursts of 1 to 4 s separated by lulls of 1 to 4 s,
/// the same for every producer. Enqueues that follow each other closely wake replicas that then
/// claim whatever is due, and so hide a lost wake; in a lull nothing does, and the faults and
/// setting changes that fall in one (about half of them) leave a lost wake lost until the next
/// burst (or the poll).
#[derive(Debug, Clone)]
struct Bursts(Arc<Vec<(f64, f64)>>);

impl Bursts {
    /// Random bursts from `from` until `until`.
    fn new(rng: &mut fastrand::Rng, from: f64, until: f64) -> Bursts {
        let mut bursts = Vec::new();
        let mut t = from;
        while t < until {
            let end = (t + 1.0 + 3.0 * rng.f64()).min(until);
            bursts.push((t, end));
            t = end + 1.0 + 3.0 * rng.f64();
        }
        Bursts(Arc::new(bursts))
    }

    /// Waits until a burst is on; false once none is left.
    async fn on(&self) -> bool {
        loop {
            let t = now();
            match self.0.iter().find(|(_, end)| *end > t) {
                None => return false,
                Some(&(start, _)) if start <= t => return true,
                Some(&(start, _)) => tokio::time::sleep(Duration::from_secs_f64(start - t)).await,
            }
        }
    }
}

/// Sleeps `ms` milliseconds.
async fn nap(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The payload of the library's jobs: the binary's `noop` kind, which pauses `pause_ms`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Nap {
    /// How long its handler pauses.
    pause_ms: u64,
    /// Makes each payload unique, so a reused key with another payload is refused.
    tag: String,
}

impl durable_etl::Job for Nap {
    const KIND: &'static str = durable_etl::job::handler::NOOP_KIND;
    const MAX_ATTEMPTS: i32 = MAX_ATTEMPTS;
}

/// Where a committed job came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A library transaction that enqueued one job.
    Single,
    /// A library transaction that enqueued several at once.
    Bulk,
    /// A submission to the HTTP API.
    Api,
}

/// A job whose enqueue committed, as its producer saw it.
#[derive(Debug, Clone)]
struct Committed {
    /// Its id.
    id: Uuid,
    /// Its queue.
    queue: &'static str,
    /// Its concurrency key.
    key: Option<&'static str>,
    /// When its commit (or the API's answer) had returned.
    visible: f64,
    /// Its producer.
    source: Source,
    /// The target rows it loads (an API job's records; 0 for a library job).
    records: usize,
}

/// What one producer did.
#[derive(Debug, Default)]
struct Produced {
    /// The jobs it committed.
    committed: Vec<Committed>,
    /// The jobs its rolled-back transactions had enqueued.
    rolled_back: Vec<Uuid>,
    /// Transactions (or submissions) it began.
    transactions: u32,
    /// Transactions it held open before ending them.
    held: u32,
    /// Transactions it rolled back (conflicts included).
    rollbacks: u32,
    /// Reused keys refused with `idempotency_key_reused`.
    conflicts: u32,
    /// Replays answered with the original job.
    replays: u32,
    /// Answers that were not what the contract says.
    problems: Vec<String>,
}

/// One library job about to be enqueued.
struct Planned {
    /// Its payload.
    nap: Nap,
    /// Its queue.
    queue: &'static str,
    /// Its concurrency key.
    key: Option<&'static str>,
    /// Its idempotency key (half of the jobs have one: keyed and unkeyed enqueues differ).
    idempotency_key: Option<String>,
}

impl Planned {
    /// A random job, `n`th of producer `producer` in round `round`.
    fn random(rng: &mut fastrand::Rng, round: usize, producer: usize, n: u64) -> Planned {
        let queue = QUEUES[rng.usize(..QUEUES.len())];
        let keyed = queue == "c" || (queue == "b" && rng.bool());
        let tag = format!("r{round}-p{producer}-{n}");
        Planned {
            nap: Nap {
                pause_ms: rng.u64(0..=NAP_MAX_MS),
                tag: tag.clone(),
            },
            queue,
            key: keyed.then(|| KEYS[rng.usize(..KEYS.len())]),
            idempotency_key: rng.bool().then_some(tag),
        }
    }

    /// Its enqueue options.
    fn options(&self) -> EnqueueOptions<'_> {
        EnqueueOptions {
            queue: Some(self.queue),
            concurrency_key: self.key,
            idempotency_key: self.idempotency_key.as_deref(),
            ..EnqueueOptions::default()
        }
    }
}

/// What a producer task is given.
struct Producer {
    /// The round.
    round: usize,
    /// Its number.
    index: usize,
    /// Its random seed.
    seed: u64,
    /// When it begins transactions.
    bursts: Bursts,
}

/// A library producer: on a connection of its own, during the [`Bursts`], transactions 50 to 500
/// ms apart that enqueue
/// one job or 2 to 6 at once, some also replaying an earlier keyed job (which must answer that
/// job), some held open up to [`HOLD_MAX`]; 15 % rolled back, 5 % more reuse an earlier key with
/// another payload (answered `idempotency_key_reused`) and are rolled back as the docs say.
async fn library_producer(url: String, jobs: Jobs, p: Producer) -> Produced {
    let mut client = connect(&url.parse().unwrap()).await;
    let mut rng = fastrand::Rng::with_seed(p.seed);
    let mut done = Produced::default();
    let mut keyed: Vec<(Planned, Uuid)> = Vec::new();
    let mut n = 0;
    loop {
        nap(rng.u64(50..=500)).await;
        if !p.bursts.on().await {
            break;
        }
        let size = if rng.u8(..100) < 40 {
            rng.usize(2..=6)
        } else {
            1
        };
        let batch: Vec<Planned> = (0..size)
            .map(|_| {
                n += 1;
                Planned::random(&mut rng, p.round, p.index, n)
            })
            .collect();
        let tx = client.transaction().await.unwrap();
        done.transactions += 1;
        let enqueued = if size == 1 {
            vec![jobs
                .enqueue(&tx, &batch[0].nap, batch[0].options())
                .await
                .unwrap()]
        } else {
            jobs.enqueue_many_with(&tx, batch.iter().map(|b| (&b.nap, b.options())))
                .await
                .unwrap()
        };
        if enqueued.iter().any(|e| e.replayed) {
            done.problems
                .push("a fresh key was answered as a replay".into());
        }
        let ids: Vec<Uuid> = enqueued.iter().map(|e| e.id).collect();
        if !keyed.is_empty() && rng.u8(..100) < 10 {
            let (old, id) = &keyed[rng.usize(..keyed.len())];
            match jobs.enqueue(&tx, &old.nap, old.options()).await {
                Ok(e) if e.replayed && e.id == *id => done.replays += 1,
                other => done.problems.push(format!("a replay answered {other:?}")),
            }
        }
        let roll = rng.u8(..100);
        if !keyed.is_empty() && roll < 5 {
            let (old, _) = &keyed[rng.usize(..keyed.len())];
            let changed = Nap {
                tag: format!("{}-changed", old.nap.tag),
                ..old.nap.clone()
            };
            match jobs.enqueue(&tx, &changed, old.options()).await {
                Err(e) if e.code() == Code::IdempotencyKeyReused => done.conflicts += 1,
                other => done
                    .problems
                    .push(format!("a reused key answered {other:?}")),
            }
            tx.rollback().await.unwrap();
            done.rollbacks += 1;
            done.rolled_back.extend(ids);
            continue;
        }
        if rng.u8(..100) < 25 {
            done.held += 1;
            nap(rng.u64(500..=HOLD_MAX.as_millis() as u64)).await;
        }
        if roll < 20 {
            tx.rollback().await.unwrap();
            done.rollbacks += 1;
            done.rolled_back.extend(ids);
            continue;
        }
        tx.commit().await.unwrap();
        let visible = now();
        let source = if size == 1 {
            Source::Single
        } else {
            Source::Bulk
        };
        for (planned, id) in batch.into_iter().zip(ids) {
            done.committed.push(Committed {
                id,
                queue: planned.queue,
                key: planned.key,
                visible,
                source,
                records: 0,
            });
            if planned.idempotency_key.is_some() {
                keyed.push((planned, id));
            }
        }
    }
    done
}

/// The API producer: during the [`Bursts`], one ETL submission (1 to 3 records, a key of its
/// own) every 200 to 800 ms to the `serve` process at `api`; 10 % replay an earlier submission (which
/// must answer its job) and 5 % reuse an earlier key with other records (which must be refused
/// `idempotency_key_reused`).
async fn api_producer(api: String, key: String, p: Producer) -> Produced {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(p.seed);
    let mut done = Produced::default();
    let mut sent: Vec<(String, Vec<serde_json::Value>, Uuid)> = Vec::new();
    let mut n = 0;
    loop {
        nap(rng.u64(200..=800)).await;
        if !p.bursts.on().await {
            break;
        }
        done.transactions += 1;
        let roll = rng.u8(..100);
        if !sent.is_empty() && roll < 15 {
            let (idempotency_key, records, id) = &sent[rng.usize(..sent.len())];
            if roll < 10 {
                let answer = post_load(&http, &api, &key, idempotency_key, records.clone()).await;
                let replayed = match answer {
                    Ok(r) if r.status() == 202 => r.json::<serde_json::Value>().await.ok(),
                    _ => None,
                };
                match replayed {
                    Some(body) if body["id"].as_str() == Some(&id.to_string()) => {
                        done.replays += 1;
                    }
                    other => done
                        .problems
                        .push(format!("an API replay answered {other:?}")),
                }
            } else {
                let other = vec![serde_json::json!({"id": format!("conflict-r{}-{n}", p.round)})];
                let answer = post_load(&http, &api, &key, idempotency_key, other).await;
                let refused = match answer {
                    Ok(r) if r.status() == 422 => r.text().await.unwrap_or_default(),
                    Ok(r) => format!("status {}", r.status()),
                    Err(e) => e.to_string(),
                };
                if refused.contains("idempotency_key_reused") {
                    done.conflicts += 1;
                } else {
                    done.problems
                        .push(format!("an API reused key answered {refused}"));
                }
            }
            continue;
        }
        n += 1;
        let records: Vec<serde_json::Value> = (0..rng.usize(1..=3))
            .map(|r| serde_json::json!({"id": format!("r{}-{n}-{r}", p.round)}))
            .collect();
        let idempotency_key = format!("api-r{}-{n}", p.round);
        let answer = post_load(&http, &api, &key, &idempotency_key, records.clone()).await;
        let visible = now();
        let body = match answer {
            Ok(r) if r.status() == 202 => r.json::<serde_json::Value>().await.ok(),
            Ok(r) => {
                done.problems
                    .push(format!("an API submission answered {}", r.status()));
                None
            }
            Err(e) => {
                done.problems.push(format!("an API submission failed: {e}"));
                None
            }
        };
        let Some(id) = body.and_then(|b| b["id"].as_str().and_then(|s| s.parse().ok())) else {
            continue;
        };
        done.committed.push(Committed {
            id,
            queue: "default",
            key: None,
            visible,
            source: Source::Api,
            records: records.len(),
        });
        sent.push((idempotency_key, records, id));
    }
    done
}

/// A replica's counters, as its `/metrics` shows them (0 for a name it does not expose).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    /// Claim statements, every trigger.
    claims: u64,
    /// Claims that found no job.
    empty: u64,
    /// Jobs claimed.
    claimed: u64,
    /// Notifications that woke the replica.
    notifications: u64,
    /// Polls that found work no notification announced.
    poll_found_work: u64,
}

impl Counters {
    /// The counters of a `/metrics` text.
    fn parse(text: &str) -> Counters {
        let sum = |name: &str| -> u64 {
            text.lines()
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        Counters {
            claims: sum("durable_etl_claims_total"),
            empty: sum("durable_etl_claims_empty_total"),
            claimed: sum("durable_etl_jobs_claimed_total"),
            notifications: sum("durable_etl_notifications_total"),
            poll_found_work: sum("durable_etl_poll_found_work_total"),
        }
    }

    /// These counters plus `other`.
    fn plus(self, other: Counters) -> Counters {
        Counters {
            claims: self.claims + other.claims,
            empty: self.empty + other.empty,
            claimed: self.claimed + other.claimed,
            notifications: self.notifications + other.notifications,
            poll_found_work: self.poll_found_work + other.poll_found_work,
        }
    }
}

/// One replica: its owner id and queues, and what its incarnations counted.
struct Replica {
    /// Stable owner id, reused by every incarnation.
    owner: String,
    /// Its `--queues`.
    queues: &'static str,
    /// Where the current incarnation serves `/metrics`.
    metrics: String,
    /// Standard error of every incarnation, appended.
    log: PathBuf,
    /// The counters of the incarnations killed so far (each as last scraped before its kill).
    dead: Counters,
    /// The current incarnation's counters, as last scraped.
    last: Counters,
}

/// The processes of one round: the replicas (the first [`REPLICAS`] of `processes`) and `serve`
/// (the last).
struct Fleet {
    /// Killed on drop.
    processes: Processes,
    /// The replicas, in the order of `processes`.
    replicas: Vec<Replica>,
    /// The round's database.
    url: String,
    /// For `/metrics`.
    http: reqwest::Client,
    /// Where `serve` listens.
    api: String,
    /// An API key of the API's owner.
    api_key: String,
    /// Standard error of `serve`.
    api_log: PathBuf,
}

impl Fleet {
    /// Starts `serve` and every replica on `db`, and waits until they all serve.
    async fn start(db: &TestDb) -> Fleet {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let api = format!("127.0.0.1:{}", free_port());
        let api_log = dir.join(format!("lost-wakes-{}-serve.log", db.name));
        let serve = binary(
            &db.config.url,
            &["serve", "--listen", &api, "--pool-size", POOL_SIZE],
        )
        .stderr(Stdio::from(File::create(&api_log).unwrap()))
        .spawn()
        .unwrap();
        let mut fleet = Fleet {
            processes: Processes(Vec::new()),
            replicas: SERVING
                .into_iter()
                .enumerate()
                .map(|(i, queues)| Replica {
                    owner: format!("lost-wakes-{i}"),
                    queues,
                    metrics: String::new(),
                    log: dir.join(format!("lost-wakes-{}-r{i}.log", db.name)),
                    dead: Counters::default(),
                    last: Counters::default(),
                })
                .collect(),
            url: db.config.url.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
            api,
            api_key: api_key(&db.config.url),
            api_log,
        };
        for i in 0..REPLICAS {
            let child = fleet.spawn(i);
            fleet.processes.0.push(child);
        }
        fleet.processes.0.push(serve);
        let metrics: Vec<String> = fleet.replicas.iter().map(|r| r.metrics.clone()).collect();
        until_serving(&fleet.http, &fleet.api, &metrics).await;
        fleet
    }

    /// Scrapes every replica's counters a last time, stops every process (SIGTERM) and returns
    /// the counters of every incarnation.
    async fn stop(&mut self) -> Counters {
        for i in 0..REPLICAS {
            self.scrape(i).await;
        }
        for child in &mut self.processes.0 {
            signal(child, "TERM");
            child.wait().unwrap();
        }
        self.replicas
            .iter()
            .fold(Counters::default(), |sum, r| sum.plus(r.dead).plus(r.last))
    }

    /// Removes the processes' logs, or names them in `text` when `keep`.
    fn logs(&self, keep: bool, text: &mut String) {
        if keep {
            let logs = self
                .api_log
                .display()
                .to_string()
                .replace("-serve.log", "-*.log");
            let _ = writeln!(text, "the processes' logs are kept: {logs}");
            return;
        }
        for replica in &self.replicas {
            let _ = std::fs::remove_file(&replica.log);
        }
        let _ = std::fs::remove_file(&self.api_log);
    }

    /// Starts an incarnation of replica `i` (a fresh metrics port; the rest as always).
    fn spawn(&mut self, i: usize) -> Child {
        let replica = &mut self.replicas[i];
        replica.metrics = format!("127.0.0.1:{}", free_port());
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&replica.log)
            .unwrap();
        let poll = poll();
        let args = [
            "--poll-interval",
            &poll,
            "--slots",
            SLOTS,
            "--pool-size",
            POOL_SIZE,
            "--queues",
            replica.queues,
            "--metrics-listen",
            &replica.metrics,
            "--shutdown-grace",
            "2s",
        ];
        let level = std::env::var("LOST_WAKES_LOG").unwrap_or_else(|_| "warn".to_owned());
        spawn_replica_logged(&self.url, &replica.owner, &args, Stdio::from(log), &level)
    }

    /// Scrapes replica `i`'s counters into its `last` (left as it was if the scrape fails).
    async fn scrape(&mut self, i: usize) {
        let url = format!("http://{}/metrics", self.replicas[i].metrics);
        let text = match self.http.get(&url).send().await {
            Ok(r) => r.text().await.ok(),
            Err(_) => None,
        };
        if let Some(text) = text {
            self.replicas[i].last = Counters::parse(&text);
        }
    }

    /// Waits (at most 30 s) until replica `i`'s current incarnation serves `/metrics`: its worker
    /// has started.
    async fn until_ready(&self, i: usize) {
        let url = format!("http://{}/metrics", self.replicas[i].metrics);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .http
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            assert!(Instant::now() < deadline, "replica {i} did not restart");
            nap(20).await;
        }
    }
}

/// The local ports of `pid`'s TCP connections to port `server_port`, read from `/proc` (the
/// process's socket inodes, found in its network namespace's TCP tables).
fn ports_of(pid: u32, server_port: u16) -> Vec<i32> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 9
                && inodes.contains(fields[9])
                && port(fields[2]) == Some(server_port)
            {
                ports.extend(port(fields[1]).map(i32::from));
            }
        }
    }
    ports
}

/// Terminates every backend of this test's database that a durable-etl process opened from one
/// of `ports`; returns how many.
async fn terminate(client: &tokio_postgres::Client, ports: &[i32]) -> i64 {
    client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'durable-etl/%'
                AND client_port = ANY($1::int4[])",
            &[&ports],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits (at most 30 s) until process `pid` has a LISTEN session again on a connection other
/// than those of `old` ports: a replica whose backends were terminated serves again.
async fn until_session(client: &tokio_postgres::Client, pid: u32, server_port: u16, old: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ports: Vec<i32> = ports_of(pid, server_port)
            .into_iter()
            .filter(|p| !old.contains(p))
            .collect();
        let sessions: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'durable-etl/session'
                    AND client_port = ANY($1::int4[])",
                &[&ports],
            )
            .await
            .unwrap()
            .get(0);
        if sessions > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no new session after a cut");
        nap(20).await;
    }
}

/// A change to a queue's settings.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Paused (true) or resumed.
    Paused(bool),
    /// Its cap set (or lifted).
    Cap(Option<i32>),
    /// Its key cap set (or lifted).
    KeyCap(Option<i32>),
}

/// A change made to a queue, between two instants: sent, and its commit returned.
#[derive(Debug, Clone, Copy)]
struct Setting {
    /// The queue.
    queue: &'static str,
    /// When the statement was sent.
    sent: f64,
    /// When its commit returned.
    done: f64,
    /// What changed.
    change: Change,
}

/// Makes `change` to `queue`; says when.
async fn set(client: &tokio_postgres::Client, queue: &'static str, change: Change) -> Setting {
    let sent = now();
    match change {
        Change::Paused(paused) => durable_etl::queue::set_paused(client, queue, paused).await,
        Change::Cap(cap) => durable_etl::queue::set_cap(client, queue, cap).await,
        Change::KeyCap(cap) => durable_etl::queue::set_key_cap(client, queue, cap).await,
    }
    .unwrap();
    Setting {
        queue,
        sent,
        done: now(),
        change,
    }
}

/// A queue's settings at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct QueueState {
    /// Paused.
    paused: bool,
    /// Its cap.
    cap: Option<i32>,
    /// Its key cap.
    key_cap: Option<i32>,
}

impl QueueState {
    /// This state after `change`.
    fn after(self, change: Change) -> QueueState {
        match change {
            Change::Paused(paused) => QueueState { paused, ..self },
            Change::Cap(cap) => QueueState { cap, ..self },
            Change::KeyCap(key_cap) => QueueState { key_cap, ..self },
        }
    }

    /// What both `self` and `other` allow: the state a change is taken to be in while its
    /// statement is in flight, so that neither side of it counts a job claimable too soon.
    fn strictest(self, other: QueueState) -> QueueState {
        let least = |a: Option<i32>, b: Option<i32>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        QueueState {
            paused: self.paused || other.paused,
            cap: least(self.cap, other.cap),
            key_cap: least(self.key_cap, other.key_cap),
        }
    }

    /// The state at `t` of a queue changed by `settings` (its own, in order).
    fn at(settings: &[Setting], t: f64) -> QueueState {
        let mut state = QueueState::default();
        for s in settings {
            if t >= s.done {
                state = state.after(s.change);
            } else if t >= s.sent {
                return state.strictest(state.after(s.change));
            } else {
                break;
            }
        }
        state
    }
}

/// What a fault did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    /// SIGKILL, then a restart.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Freeze,
    /// Every backend of the replica's connections terminated (found by their client ports).
    Cut,
}

/// One fault, from its first signal until the replica served again (a killed one's restart serves
/// `/metrics`, a frozen one is resumed, a cut one has its LISTEN session back).
#[derive(Debug, Clone, Copy)]
struct Fault {
    /// The replica.
    replica: usize,
    /// What.
    kind: FaultKind,
    /// When it began.
    from: f64,
    /// When it was over (a restarted replica serving again, a frozen one resumed).
    to: f64,
    /// Backends terminated (a cut).
    backends: i64,
}

/// The faults and settings of a round.
#[derive(Debug, Default)]
struct Chaos {
    /// Replica faults, in order.
    faults: Vec<Fault>,
    /// Queue settings changes, in order.
    settings: Vec<Setting>,
}

/// Until `deadline`, one fault or setting change at a time, 300 to 1,200 ms apart: a replica
/// killed and restarted 1 to 3 s later, frozen for 200 to 700 ms, or its backends terminated
/// (each time the next fault waits until the replica serves again: [`Fault`]); a queue paused
/// for 0.5 to 3 s; a queue's cap lowered (1 or 2), raised (3 to 6) or lifted; a key cap of `b` or
/// `c` lowered (1), raised (2 or 3) or lifted.
async fn chaos(
    fleet: &mut Fleet,
    client: &tokio_postgres::Client,
    rng: &mut fastrand::Rng,
    deadline: f64,
) -> Chaos {
    let server_port = admin_config().get_ports().first().copied().unwrap_or(5432);
    let mut done = Chaos::default();
    while now() < deadline {
        nap(rng.u64(300..=1200)).await;
        let i = rng.usize(..REPLICAS);
        let from = now();
        match rng.u8(..100) {
            0..22 => {
                fleet.scrape(i).await;
                signal(&fleet.processes.0[i], "KILL");
                fleet.processes.0[i].wait().unwrap();
                let replica = &mut fleet.replicas[i];
                replica.dead = replica.dead.plus(replica.last);
                replica.last = Counters::default();
                nap(rng.u64(1000..=3000)).await;
                fleet.processes.0[i] = fleet.spawn(i);
                fleet.until_ready(i).await;
                done.faults.push(Fault {
                    replica: i,
                    kind: FaultKind::Kill,
                    from,
                    to: now(),
                    backends: 0,
                });
            }
            22..40 => {
                signal(&fleet.processes.0[i], "STOP");
                nap(rng.u64(200..=700)).await;
                signal(&fleet.processes.0[i], "CONT");
                done.faults.push(Fault {
                    replica: i,
                    kind: FaultKind::Freeze,
                    from,
                    to: now(),
                    backends: 0,
                });
            }
            40..58 => {
                let pid = fleet.processes.0[i].id();
                let ports = ports_of(pid, server_port);
                let backends = terminate(client, &ports).await;
                until_session(client, pid, server_port, &ports).await;
                done.faults.push(Fault {
                    replica: i,
                    kind: FaultKind::Cut,
                    from,
                    to: now(),
                    backends,
                });
            }
            58..68 => {
                let queue = QUEUES[rng.usize(..QUEUES.len())];
                done.settings
                    .push(set(client, queue, Change::Paused(true)).await);
                nap(rng.u64(500..=3000)).await;
                done.settings
                    .push(set(client, queue, Change::Paused(false)).await);
            }
            68..86 => {
                let queue = QUEUES[rng.usize(..QUEUES.len())];
                let cap = match rng.u8(..3) {
                    0 => Some(rng.i32(1..=2)),
                    1 => Some(rng.i32(3..=6)),
                    _ => None,
                };
                done.settings
                    .push(set(client, queue, Change::Cap(cap)).await);
            }
            _ => {
                let queue = KEYED_QUEUES[rng.usize(..KEYED_QUEUES.len())];
                let cap = match rng.u8(..3) {
                    0 => Some(1),
                    1 => Some(rng.i32(2..=3)),
                    _ => None,
                };
                done.settings
                    .push(set(client, queue, Change::KeyCap(cap)).await);
            }
        }
    }
    done
}

/// Samples the most backends the round's database has at once, every 100 ms until stopped.
struct Sampler {
    /// Asks it to stop.
    stop: Arc<AtomicBool>,
    /// Returns the most seen.
    task: tokio::task::JoinHandle<i64>,
}

impl Sampler {
    /// Starts sampling on `client`.
    fn start(client: Arc<tokio_postgres::Client>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut most = 0;
            while !stopped.load(Ordering::Relaxed) {
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
                        &[],
                    )
                    .await;
                if let Ok(row) = row {
                    most = most.max(row.get::<_, i64>(0));
                }
                nap(100).await;
            }
            most
        });
        Sampler { stop, task }
    }

    /// Stops it; the most backends seen.
    async fn stop(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// A job's claims, from the database: its claim order and each attempt's span.
#[derive(Debug, Default, Clone)]
struct History {
    /// Its `run_at` at enqueue (its `sort_at`, at priority 0), in microseconds.
    sort: i64,
    /// Each attempt's claim (`started_at`) and end (`ended_at` of its history row, or
    /// `finished_at` of the outcome), by claim.
    spans: Vec<(f64, f64)>,
}

/// Every job's history, by id.
async fn histories(client: &tokio_postgres::Client) -> HashMap<Uuid, History> {
    let mut jobs: HashMap<Uuid, History> = HashMap::new();
    for row in client
        .query(
            "SELECT id, (extract(epoch FROM run_at) * 1e6)::int8 FROM etl_job_intake",
            &[],
        )
        .await
        .unwrap()
    {
        jobs.entry(row.get(0)).or_default().sort = row.get(1);
    }
    for row in client
        .query(
            "SELECT job_id, extract(epoch FROM started_at)::float8,
                    extract(epoch FROM ended_at)::float8
               FROM etl_job_attempts
             UNION ALL
             SELECT job_id, extract(epoch FROM started_at)::float8,
                    extract(epoch FROM finished_at)::float8
               FROM etl_job_outcomes WHERE started_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
    {
        jobs.entry(row.get(0))
            .or_default()
            .spans
            .push((row.get(1), row.get(2)));
    }
    for job in jobs.values_mut() {
        job.spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    jobs
}

/// How long one job waited.
#[derive(Debug, Clone, Copy)]
struct Wait {
    /// Index of the job in the round's committed jobs.
    job: usize,
    /// Its longest stretch claimable and not claimed before its first claim.
    longest: f64,
    /// When that stretch began.
    from: f64,
    /// When it ended.
    to: f64,
    /// Whether its first claim ended it (else the job stopped being claimable).
    by_claim: bool,
    /// From its commit to its first claim.
    to_claim: f64,
}

/// Which jobs of one queue were claimable when, replayed from the database's history: see
/// [`Simulation::run`].
struct Simulation<'a> {
    /// The round's committed jobs.
    committed: &'a [Committed],
    /// Every job's history.
    histories: &'a HashMap<Uuid, History>,
}

/// One moment of a queue's history, applied in order of time, then of this order at equal times
/// (a claim's end frees its permit before a claim at the same instant takes one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Moment {
    /// Attempt `.1` of job `.0` ended.
    End(usize, usize),
    /// Job `.0`'s commit returned.
    Visible(usize),
    /// Attempt `.1` of job `.0` was claimed.
    Claim(usize, usize),
    /// A setting of the queue changed (nothing to apply: its state is read at each moment).
    Setting,
}

impl Simulation<'_> {
    /// The waits of the committed jobs of `queue` under its `settings` (in order).
    ///
    /// The queue's history is replayed moment by moment (commits, claims, ends, setting changes).
    /// After each, the pending jobs (committed and not yet claimed; and jobs whose attempt ended
    /// and that wait for their next claim, put first, ahead of every job, which can only make
    /// fewer jobs claimable) are walked in claim order (`sort_at`, `id`), as an ideal claimer
    /// would take them: none while the queue is paused; under a cap, only as many as the cap
    /// leaves beside the claims running; under a key cap, of each key only as many as the key cap
    /// leaves beside that key's running claims. A running claim counts from its `started_at` to
    /// its end, whatever permit it holds (a claim made before a cap held none): that too can only
    /// make fewer jobs claimable. A setting is taken as its strictest side while its statement is
    /// in flight.
    fn run(&self, queue: &str, settings: &[Setting]) -> Vec<Wait> {
        let jobs: Vec<usize> = (0..self.committed.len())
            .filter(|&j| self.committed[j].queue == queue)
            .collect();
        let empty = History::default();
        let history = |j: usize| self.histories.get(&self.committed[j].id).unwrap_or(&empty);
        let mut moments: Vec<(f64, Moment)> = Vec::new();
        for &j in &jobs {
            moments.push((self.committed[j].visible, Moment::Visible(j)));
            for (k, &(start, end)) in history(j).spans.iter().enumerate() {
                moments.push((start, Moment::Claim(j, k)));
                moments.push((end, Moment::End(j, k)));
            }
        }
        for s in settings {
            moments.push((s.sent, Moment::Setting));
            moments.push((s.done, Moment::Setting));
        }
        moments.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let n = self.committed.len();
        let (mut claims_seen, mut first_pending) = (vec![0; n], vec![false; n]);
        let mut stretch: Vec<Option<f64>> = vec![None; n];
        let mut waits: HashMap<usize, Wait> = jobs
            .iter()
            .map(|&j| {
                let to_claim = history(j)
                    .spans
                    .first()
                    .map_or(f64::INFINITY, |s| s.0 - self.committed[j].visible);
                let wait = Wait {
                    job: j,
                    longest: 0.0,
                    from: 0.0,
                    to: 0.0,
                    by_claim: false,
                    to_claim,
                };
                (j, wait)
            })
            .collect();
        let close = |waits: &mut HashMap<usize, Wait>, j: usize, from: f64, to: f64, by_claim| {
            let wait = waits.get_mut(&j).unwrap();
            if to - from > wait.longest {
                *wait = Wait {
                    longest: to - from,
                    from,
                    to,
                    by_claim,
                    ..*wait
                };
            }
        };
        // Pending jobs in the order an ideal claimer walks them: (0 for a job waiting for its
        // next attempt, 1 for a first one; sort_at; id; job).
        let mut pending: BTreeSet<(u8, i64, Uuid, usize)> = BTreeSet::new();
        let entry = |class: u8, j: usize| (class, history(j).sort, self.committed[j].id, j);
        let (mut running, mut running_of_key) = (0i64, HashMap::<&str, i64>::new());
        for (m, &(t, moment)) in moments.iter().enumerate() {
            match moment {
                Moment::Visible(j) => {
                    if claims_seen[j] == 0 {
                        first_pending[j] = true;
                        pending.insert(entry(1, j));
                    }
                }
                Moment::Claim(j, _) => {
                    if claims_seen[j] == 0 {
                        if first_pending[j] {
                            pending.remove(&entry(1, j));
                            first_pending[j] = false;
                        }
                        if let Some(from) = stretch[j].take() {
                            close(&mut waits, j, from, t, true);
                        }
                    } else {
                        pending.remove(&entry(0, j));
                    }
                    claims_seen[j] += 1;
                    running += 1;
                    if let Some(key) = self.committed[j].key {
                        *running_of_key.entry(key).or_default() += 1;
                    }
                }
                Moment::End(j, k) => {
                    running -= 1;
                    if let Some(key) = self.committed[j].key {
                        *running_of_key.entry(key).or_default() -= 1;
                    }
                    if k + 1 < history(j).spans.len() && claims_seen[j] == k + 1 {
                        pending.insert(entry(0, j));
                    }
                }
                Moment::Setting => {}
            }
            if moments.get(m + 1).is_some_and(|next| next.0 == t) {
                continue;
            }
            let state = QueueState::at(settings, t);
            let room = state.cap.map_or(i64::MAX, |c| i64::from(c) - running);
            let (mut taken, mut taken_of_key) = (0i64, HashMap::<&str, i64>::new());
            for &(class, _, _, j) in &pending {
                let key = self.committed[j].key;
                let key_room = match (key, state.key_cap) {
                    (Some(key), Some(cap)) => {
                        i64::from(cap)
                            - running_of_key.get(key).copied().unwrap_or(0)
                            - taken_of_key.get(key).copied().unwrap_or(0)
                            > 0
                    }
                    _ => true,
                };
                let claimable = !state.paused && taken < room && key_room;
                if claimable {
                    taken += 1;
                    if let Some(key) = key {
                        *taken_of_key.entry(key).or_default() += 1;
                    }
                }
                if class == 1 {
                    if claimable {
                        if stretch[j].is_none() {
                            stretch[j] = Some(t);
                        }
                    } else if let Some(from) = stretch[j].take() {
                        close(&mut waits, j, from, t, false);
                    }
                }
            }
        }
        let end = moments.last().map_or(0.0, |m| m.0);
        for &j in &jobs {
            if let Some(from) = stretch[j].take() {
                close(&mut waits, j, from, end, false);
            }
        }
        waits.into_values().collect()
    }
}

/// The most claims running at once, in all and per queue (in the order of [`QUEUES`]).
fn most_running(committed: &[Committed], histories: &HashMap<Uuid, History>) -> (i64, Vec<i64>) {
    let mut steps: Vec<(f64, i64, usize)> = Vec::new();
    for job in committed {
        let q = QUEUES.iter().position(|q| *q == job.queue).unwrap();
        for &(start, end) in histories.get(&job.id).map_or(&[][..], |h| &h.spans[..]) {
            steps.push((start, 1, q));
            steps.push((end, -1, q));
        }
    }
    steps.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut all, mut per) = (0, vec![0; QUEUES.len()]);
    let (mut most, mut most_per) = (0, vec![0; QUEUES.len()]);
    for (_, step, q) in steps {
        all += step;
        per[q] += step;
        most = most.max(all);
        most_per[q] = most_per[q].max(per[q]);
    }
    (most, most_per)
}

/// What happened around `[from, to]`: the faults and `queue`'s setting changes within a second
/// of it, relative to the round's start `t0`.
fn around(chaos: &Chaos, queue: &str, (from, to): (f64, f64), t0: f64) -> String {
    let mut seen = Vec::new();
    for f in &chaos.faults {
        if f.from <= to && f.to + 1.0 >= from {
            let what = match f.kind {
                FaultKind::Kill => "kill",
                FaultKind::Freeze => "freeze",
                FaultKind::Cut => "cut",
            };
            seen.push(format!("{what} r{} @{:.1}", f.replica, f.from - t0));
        }
    }
    for s in &chaos.settings {
        if s.queue == queue && s.done >= from - 1.0 && s.sent <= to {
            let what = match s.change {
                Change::Paused(true) => "pause".to_owned(),
                Change::Paused(false) => "resume".to_owned(),
                Change::Cap(c) => format!("cap {c:?}"),
                Change::KeyCap(c) => format!("key cap {c:?}"),
            };
            seen.push(format!("{what} @{:.1}", s.done - t0));
        }
    }
    if seen.is_empty() {
        "no fault or setting nearby".to_owned()
    } else {
        seen.join(", ")
    }
}

/// The round's timeline, one line per event in order of time (seconds from the round's start
/// `t0`): bursts, faults, setting changes (when sent; the time their commit returned in the line)
/// and each job at its commit (with its first claim and its longest claimable stretch).
fn timeline(
    t0: f64,
    bursts: &Bursts,
    chaos: &Chaos,
    committed: &[Committed],
    waits: &[Wait],
) -> String {
    let mut lines: Vec<(f64, String)> = Vec::new();
    for &(start, end) in bursts.0.iter() {
        lines.push((start, format!("burst until {:.3}", end - t0)));
    }
    for f in &chaos.faults {
        let what = match f.kind {
            FaultKind::Kill => "kill (restarted, serving again)",
            FaultKind::Freeze => "freeze (resumed)",
            FaultKind::Cut => "cut",
        };
        lines.push((
            f.from,
            format!(
                "{what} r{} until {:.3}, {} backends",
                f.replica,
                f.to - t0,
                f.backends
            ),
        ));
    }
    for s in &chaos.settings {
        lines.push((
            s.sent,
            format!(
                "queue {} {:?}, committed by {:.3}",
                s.queue,
                s.change,
                s.done - t0
            ),
        ));
    }
    for w in waits {
        let job = &committed[w.job];
        lines.push((
            job.visible,
            format!(
                "job {} queue {} key {} {:?}: first claim +{:.3}, longest claimable {:.3} from {}{}",
                job.id,
                job.queue,
                job.key.unwrap_or("-"),
                job.source,
                w.to_claim,
                w.longest,
                if w.longest > 0.0 {
                    format!("{:.3}", w.from - t0)
                } else {
                    "-".to_owned()
                },
                if w.longest > LOST_AFTER { " LOST" } else { "" },
            ),
        ));
    }
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    lines.iter().fold(String::new(), |mut out, (t, line)| {
        let _ = writeln!(out, "{:9.3} {line}", t - t0);
        out
    })
}

/// The `p` quantile (0 to 1) of sorted `values`.
fn quantile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values[((values.len() - 1) as f64 * p).round() as usize]
}

/// What a round found.
struct Round {
    /// Its report.
    text: String,
    /// Its timeline ([`timeline`]).
    timeline: String,
    /// Lost wakes.
    lost: usize,
    /// The jobs measured.
    measured: usize,
    /// The worst wait (seconds), if any job was measured.
    worst: f64,
    /// Broken invariants and unexpected answers.
    problems: Vec<String>,
}

/// One round: a fresh database, [`REPLICAS`] replicas and `serve`, `seconds` of load and faults,
/// the drain, the invariants and the waits.
async fn round(r: usize, seed: u64, seconds: u64) -> Round {
    let wall = Instant::now();
    let db = TestDb::migrated().await;
    let control = Arc::new(db.client().await);
    let sampler = Sampler::start(Arc::clone(&control));
    let mut fleet = Fleet::start(&db).await;
    nap(500).await;

    let mut rng = fastrand::Rng::with_seed(seed);
    let t0 = now();
    let deadline = t0 + seconds as f64;
    let bursts = Bursts::new(&mut rng, t0, deadline);
    let jobs = Jobs::new(Secret::new(LIBRARY_SECRET).unwrap(), "lost-wakes");
    let mut producers = Vec::new();
    for index in 0..=PRODUCERS {
        let p = Producer {
            round: r,
            index,
            seed: rng.u64(..),
            bursts: bursts.clone(),
        };
        producers.push(if index < PRODUCERS {
            tokio::spawn(library_producer(db.config.url.clone(), jobs.clone(), p))
        } else {
            tokio::spawn(api_producer(fleet.api.clone(), fleet.api_key.clone(), p))
        });
    }
    let mut chaos = chaos(&mut fleet, &control, &mut rng, deadline).await;
    let mut produced = Produced::default();
    for producer in producers {
        produced.add(producer.await.unwrap());
    }
    // Every setting lifted (a lift must wake too), then the drain.
    for queue in QUEUES {
        for change in [
            Change::Cap(None),
            Change::KeyCap(None),
            Change::Paused(false),
        ] {
            chaos.settings.push(set(&control, queue, change).await);
        }
    }
    chaos.settings.sort_by(|a, b| a.sent.total_cmp(&b.sent));
    let drained = drain(&control).await;
    let counters = fleet.stop().await;

    let histories = histories(&control).await;
    let mut problems = std::mem::take(&mut produced.problems);
    problems.extend(invariants(&control, &produced).await);
    let committed = &produced.committed;
    let simulation = Simulation {
        committed,
        histories: &histories,
    };
    let mut waits: Vec<Wait> = Vec::new();
    for queue in QUEUES {
        let settings: Vec<Setting> = chaos
            .settings
            .iter()
            .filter(|s| s.queue == queue)
            .copied()
            .collect();
        waits.extend(simulation.run(queue, &settings));
    }
    waits.sort_by(|a, b| b.longest.total_cmp(&a.longest));
    let findings = Findings {
        round: r,
        seed,
        seconds,
        t0,
        produced: &produced,
        chaos: &chaos,
        histories: &histories,
        waits: &waits,
        drained,
        counters,
        peak: sampler.stop().await,
    };
    let mut text = findings.report();
    let lost = waits.iter().filter(|w| w.longest > LOST_AFTER).count();
    if !problems.is_empty() {
        let _ = writeln!(text, "PROBLEMS: {problems:?}");
    }
    let _ = writeln!(text, "round wall time {:.1?}", wall.elapsed());
    fleet.logs(lost > 0 || !problems.is_empty(), &mut text);
    Round {
        timeline: format!(
            "round {r} (seed {seed})\n{}",
            timeline(t0, &bursts, &chaos, committed, &waits)
        ),
        text,
        lost,
        measured: waits.len(),
        worst: waits.first().map_or(0.0, |w| w.longest),
        problems,
    }
}

/// The live jobs of the database `client` is on.
async fn live(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM etl_job_records", &[])
        .await
        .unwrap()
        .get(0)
}

/// How the queues drained once the load stopped: how long it took, and how many jobs were still
/// live when the test notified the replicas itself after [`GRACE`] (none if it did not need to).
#[derive(Debug, Clone, Copy)]
struct Drained {
    /// From the end of the load (the settings lifted) until no job was live.
    took: Duration,
    /// Live jobs when the test notified the replicas, if it did.
    nudged: Option<i64>,
}

/// Waits until no job is live: by wakes alone for [`GRACE`], then after a NOTIFY of the test's
/// own (an empty payload: every replica claims), for at most [`SETTLE_BOUND`] more.
async fn drain(client: &tokio_postgres::Client) -> Drained {
    let from = Instant::now();
    let mut nudged = None;
    loop {
        let left = live(client).await;
        if left == 0 {
            return Drained {
                took: from.elapsed(),
                nudged,
            };
        }
        if nudged.is_none() && from.elapsed() >= GRACE {
            client
                .execute(
                    "SELECT pg_notify($1, '')",
                    &[&durable_etl::jobs::notifier::CHANNEL],
                )
                .await
                .unwrap();
            nudged = Some(left);
        }
        assert!(
            from.elapsed() < GRACE + SETTLE_BOUND,
            "{left} jobs still live {:?} after the load stopped",
            GRACE + SETTLE_BOUND
        );
        nap(50).await;
    }
}

impl Produced {
    /// Adds what another producer did.
    fn add(&mut self, other: Produced) {
        self.committed.extend(other.committed);
        self.rolled_back.extend(other.rolled_back);
        self.transactions += other.transactions;
        self.held += other.held;
        self.rollbacks += other.rollbacks;
        self.conflicts += other.conflicts;
        self.replays += other.replays;
        self.problems.extend(other.problems);
    }
}

/// The invariants, once the queues drained: exactly the committed jobs were accepted (no
/// rolled-back one), each ended succeeded exactly once and no live row is left, and the API's ETL
/// jobs loaded exactly their records, each once. Returns what broke.
async fn invariants(client: &tokio_postgres::Client, produced: &Produced) -> Vec<String> {
    let mut problems = Vec::new();
    let committed = &produced.committed;
    let accepted: HashSet<Uuid> = client
        .query("SELECT id FROM etl_job_intake", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let ids: HashSet<Uuid> = committed.iter().map(|c| c.id).collect();
    if ids.len() != committed.len() {
        problems.push("a committed job was counted twice".into());
    }
    let unknown = accepted.difference(&ids).count();
    let missing = ids.difference(&accepted).count();
    let resurrected = produced
        .rolled_back
        .iter()
        .filter(|id| accepted.contains(id))
        .count();
    if (unknown, missing, resurrected) != (0, 0, 0) {
        problems.push(format!(
            "jobs accepted but never committed: {unknown}; committed but not accepted: \
             {missing}; rolled back but accepted: {resurrected}"
        ));
    }
    let ended: HashMap<Uuid, (String, i64)> = client
        .query(
            "SELECT o.job_id, o.status::text, count(*) OVER (PARTITION BY o.job_id)
               FROM etl_job_outcomes o",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    let not_once = committed
        .iter()
        .filter(|c| {
            ended
                .get(&c.id)
                .is_none_or(|(s, n)| s != "succeeded" || *n != 1)
        })
        .count();
    let live_rows = live(client).await;
    if not_once != 0 || live_rows != 0 || ended.len() != accepted.len() {
        problems.push(format!(
            "jobs not succeeded exactly once: {not_once}; live rows left: {live_rows}; \
             outcomes {} of {} accepted jobs",
            ended.len(),
            accepted.len()
        ));
    }
    let expected_rows: usize = committed.iter().map(|c| c.records).sum();
    let loads = client
        .query_one(
            "SELECT (SELECT count(*) FROM etl_target_rows),
                    (SELECT count(*) FROM etl_target_rows t LEFT JOIN etl_job_outcomes o
                        ON o.job_id = t.written_by_job
                      WHERE o.status IS DISTINCT FROM 'succeeded'),
                    (SELECT count(*) FROM etl_job_outcomes
                      WHERE (output ->> 'rows_updated')::int <> 0
                         OR (output ->> 'rows_unchanged')::int <> 0)",
            &[],
        )
        .await
        .unwrap();
    let (rows, orphans, repeated): (i64, i64, i64) = (loads.get(0), loads.get(1), loads.get(2));
    if (rows, orphans, repeated) != (expected_rows as i64, 0, 0) {
        problems.push(format!(
            "target rows {rows} (expected {expected_rows}), not written by a succeeded job \
             {orphans}, ledgers of a repeated load {repeated}"
        ));
    }
    problems
}

/// Everything a round's report says.
struct Findings<'a> {
    /// The round.
    round: usize,
    /// Its seed.
    seed: u64,
    /// Its seconds of load and faults.
    seconds: u64,
    /// Its start.
    t0: f64,
    /// What the producers did.
    produced: &'a Produced,
    /// The faults and settings.
    chaos: &'a Chaos,
    /// Every job's history.
    histories: &'a HashMap<Uuid, History>,
    /// Every committed job's wait, the longest first.
    waits: &'a [Wait],
    /// How the queues drained.
    drained: Drained,
    /// The replicas' counters.
    counters: Counters,
    /// The most backends of the round's database at once.
    peak: i64,
}

impl Findings<'_> {
    /// The round's report.
    fn report(&self) -> String {
        let (committed, chaos, waits, t0) =
            (&self.produced.committed, self.chaos, self.waits, self.t0);
        let lost: Vec<&Wait> = waits.iter().filter(|w| w.longest > LOST_AFTER).collect();
        let cut_short = committed
            .iter()
            .filter(|c| self.histories.get(&c.id).is_some_and(|h| h.spans.len() > 1))
            .count();
        let mut longest: Vec<f64> = waits.iter().map(|w| w.longest).collect();
        longest.sort_by(f64::total_cmp);
        let mut to_claim: Vec<f64> = waits.iter().map(|w| w.to_claim).collect();
        to_claim.sort_by(f64::total_cmp);
        let (most, most_per) = most_running(committed, self.histories);
        let by = |s: Source| committed.iter().filter(|c| c.source == s).count();
        let faults = |k: FaultKind| chaos.faults.iter().filter(|f| f.kind == k).count();
        let changes =
            |f: fn(&Change) -> bool| chaos.settings.iter().filter(|s| f(&s.change)).count();
        let p = self.produced;
        let mut text = String::new();
        let _ = writeln!(
            text,
            "lost-wakes round {} (seed {}): {} s of load and faults, {REPLICAS} replicas ({}) × \
             {SLOTS} slots, poll {}\n\
             jobs committed {} (library single {}, library bulk {}, API {}); {} transactions, \
             {} held open, {} rolled back ({} jobs), {} reused keys refused, {} replays\n\
             faults: kills {}, freezes {}, cuts {} ({} backends terminated); pauses {}, cap \
             changes {}, key-cap changes {} (with the final lifts)\n\
             most claims running at once {most} (per queue {most_per:?}); first attempts cut \
             short {cut_short}; drained {:.1?} after the load stopped{}",
            self.round,
            self.seed,
            self.seconds,
            SERVING.join(" / "),
            poll(),
            committed.len(),
            by(Source::Single),
            by(Source::Bulk),
            by(Source::Api),
            p.transactions,
            p.held,
            p.rollbacks,
            p.rolled_back.len(),
            p.conflicts,
            p.replays,
            faults(FaultKind::Kill),
            faults(FaultKind::Freeze),
            faults(FaultKind::Cut),
            chaos.faults.iter().map(|f| f.backends).sum::<i64>(),
            changes(|c| matches!(c, Change::Paused(true))),
            changes(|c| matches!(c, Change::Cap(_))),
            changes(|c| matches!(c, Change::KeyCap(_))),
            self.drained.took,
            self.drained.nudged.map_or(String::new(), |left| format!(
                " ({left} jobs were still live after {GRACE:?}: the test notified the replicas)"
            )),
        );
        let _ = writeln!(
            text,
            "commit to first claim: p50 {:.3} s, p99 {:.3} s, max {:.3} s; longest claimable and \
             unclaimed: p50 {:.3} s, p99 {:.3} s, max {:.3} s\n\
             LOST WAKES (claimable > {LOST_AFTER} s before the first claim): {} of {} jobs",
            quantile(&to_claim, 0.5),
            quantile(&to_claim, 0.99),
            quantile(&to_claim, 1.0),
            quantile(&longest, 0.5),
            quantile(&longest, 0.99),
            quantile(&longest, 1.0),
            lost.len(),
            waits.len(),
        );
        for queue in QUEUES {
            let of_queue: Vec<&&Wait> = lost
                .iter()
                .filter(|w| committed[w.job].queue == queue)
                .collect();
            let _ = writeln!(
                text,
                "  queue {queue}: {} lost of {} jobs, worst {:.3} s",
                of_queue.len(),
                committed.iter().filter(|c| c.queue == queue).count(),
                of_queue.first().map_or(0.0, |w| w.longest),
            );
        }
        for w in lost.iter().take(WORST) {
            let job = &committed[w.job];
            let _ = writeln!(
                text,
                "  job {} queue {} key {} ({:?}): claimable {:.3} s from {:.2} s {} (commit to \
                 first claim {:.3} s); around it: {}",
                job.id,
                job.queue,
                job.key.unwrap_or("-"),
                job.source,
                w.longest,
                w.from - t0,
                if w.by_claim {
                    "until its first claim"
                } else {
                    "until it stopped being claimable"
                },
                w.to_claim,
                around(chaos, job.queue, (w.from, w.to), t0),
            );
        }
        let c = self.counters;
        let per_job = |n: u64| n as f64 / committed.len().max(1) as f64;
        let _ = writeln!(
            text,
            "claims {} ({:.2} per job), empty claims {} ({:.2} per job), jobs claimed {}, \
             notifications {}, polls that found work {} (every incarnation, from /metrics)\n\
             most backends of the round's database at once: {}",
            c.claims,
            per_job(c.claims),
            c.empty,
            per_job(c.empty),
            c.claimed,
            c.notifications,
            c.poll_found_work,
            self.peak,
        );
        text
    }
}

/// A whole number from environment variable `name`, else `default`.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The soak: see the module documentation. Fails on any lost wake, any committed job that did
/// not succeed exactly once, any rolled-back job that exists, and any unexpected answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wake_is_lost_under_faults_and_queue_settings() {
    let rounds = env_number("LOST_WAKES_ROUNDS", 1).max(1);
    let seconds = env_number("LOST_WAKES_SECONDS", SECONDS).max(1);
    let seed = env_number("LOST_WAKES_SEED", fastrand::u64(..));
    println!("lost-wakes: {rounds} round(s) of {seconds} s, seed {seed}");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let figures = dir.join("lost-wakes-figures.txt");
    let timelines = dir.join("lost-wakes-timeline.txt");
    let (mut all, mut timeline) = (String::new(), String::new());
    let (mut lost, mut measured, mut worst, mut problems) = (0, 0, 0.0f64, Vec::new());
    for r in 0..rounds as usize {
        let found = round(r, seed.wrapping_add(r as u64), seconds).await;
        println!("{}", found.text);
        all.push_str(&found.text);
        std::fs::write(&figures, &all).unwrap();
        timeline.push_str(&found.timeline);
        std::fs::write(&timelines, &timeline).unwrap();
        lost += found.lost;
        measured += found.measured;
        worst = worst.max(found.worst);
        problems.extend(found.problems);
    }
    let summary = format!(
        "lost-wakes: {rounds} round(s), seed {seed}: {lost} lost wakes of {measured} jobs, \
         longest claimable and unclaimed {worst:.3} s"
    );
    println!("{summary}");
    all.push_str(&summary);
    std::fs::write(&figures, &all).unwrap();
    assert!(problems.is_empty(), "{problems:?}\n{all}");
    assert_eq!(lost, 0, "wakes were lost:\n{all}");
}
