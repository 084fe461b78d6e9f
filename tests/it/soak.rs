//! A bounded chaos soak with real processes: [`REPLICAS`] replicas of the binary, [`SLOTS`] slots
//! each (every other one with a claim cooldown), work through 5,000 ETL jobs spread over three
//! queues capped at 1, 8 and 64 ([`QUEUES`]), every cap below the replicas' slots, the cap-8
//! queue's jobs spread over [`KEYS`] concurrency keys capped at [`KEY_CAP`] each, while the
//! replicas are repeatedly SIGKILLed (and restarted with their owner id), frozen with
//! SIGSTOP/SIGCONT, have their backends terminated, and, each behind a TCP proxy of its own, have
//! every connection cut at once, for 1 s and for 10 s ([`CUTS`]). Each queue's running jobs are
//! counted twice. The database's count: a sampler counts each queue's running jobs, each key's,
//! and those running without their permits, every few milliseconds throughout. The handler's
//! side: a trigger on the target table records, as the handler loads a job's rows, the window of
//! its effects transaction ([`EFFECTS_RECORD`]), and once the queues drain the most windows of one
//! queue that overlapped are counted ([`EFFECTS_OVERLAP`]). Once the faults stop, every invariant
//! is checked from the database, and the replicas' logs are searched for privacy canaries. No job
//! may end `failed` and no attempt may be charged by its own replica (`retried`): every fault here
//! is the infrastructure's, and the jobs never fail on their own. A cut falls on the busiest
//! live replica, not one just resumed or restarted ([`QUIET_AFTER_RESUME`]), and counts only the
//! attempts its current incarnation runs. No attempt a cut of at most 1 s caught running may
//! move: once such a cut ends, its replica is left alone for [`QUIET_AFTER_CUT`], and then none
//! of those attempts may have ended `retried`, `recovered` or `released` ([`ShortCutAttempts`]).
//! Every attempt a 10 s cut caught that another replica recovered must have been abandoned by
//! the cut replica first: its `lease_lost` line for the job is older than the recovery
//! ([`LongCutAttempts`]: no overlap), and, the replica left alone for the same quiet once back,
//! refunded by it (recorded `released`): only a replica that dies is charged by recovery. The figures are printed
//! and written to `soak-figures.txt` in Cargo's target temporary directory, beside the replicas'
//! logs when `SOAK_KEEP_LOGS` is set (else they are removed).

use crate::privacy::leak;
use crate::proxy::{Mode, Proxy};
use crate::support::{
    assert_settled_once, count, enqueue_placed_loads, signal, spawn_replica_logged, Processes,
    TestDb, LEDGERS,
};
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Jobs enqueued, in batches of [`BATCH`].
const JOBS: usize = 5_000;
/// Jobs per enqueue batch, split over [`QUEUES`].
const BATCH: usize = 100;
/// Replica processes, each with [`SLOTS`] slots.
const REPLICAS: usize = 4;
/// Slots of each replica: [`REPLICAS`] × [`SLOTS`] (128) is above every queue's cap, so no cap
/// is hidden behind the replicas' slots.
const SLOTS: usize = 32;

/// One of the soak's capped queues, and its share of each batch.
struct Capped {
    /// The queue's name.
    name: &'static str,
    /// Its cap.
    cap: i32,
    /// Jobs of each batch of [`BATCH`] that are enqueued into it.
    per_batch: usize,
    /// The cap of its running jobs of one key, its jobs spread over [`KEYS`] keys; `None`: its
    /// jobs carry no key.
    key_cap: Option<i32>,
}

/// The queues, capped at 1, 8 and 64. Each batch brings every queue more jobs than its cap, all
/// at once, so every cap binds. The cap-1 queue runs one job at a time, so it gets only a small
/// share (200 jobs), enough to keep pace with the batches under the faults; the cap-64 queue
/// gets the most. The keys cap the cap-8 queue: [`KEYS`] × [`KEY_CAP`] is above 8, so both caps
/// bind there.
const QUEUES: [Capped; 3] = [
    Capped {
        name: "cap1",
        cap: 1,
        per_batch: 4,
        key_cap: None,
    },
    Capped {
        name: "cap8",
        cap: 8,
        per_batch: 24,
        key_cap: Some(KEY_CAP),
    },
    Capped {
        name: "cap64",
        cap: 64,
        per_batch: 72,
        key_cap: None,
    },
];

// The shape the soak relies on, checked as it compiles: the queues' shares make up a whole batch;
// every queue gets more jobs per batch, and the replicas more slots, than its cap; and a key cap
// lets more of the queue's jobs run than its cap.
const _: () = {
    let (mut i, mut jobs) = (0, 0);
    while i < QUEUES.len() {
        let cap = QUEUES[i].cap as usize;
        assert!(QUEUES[i].per_batch > cap && REPLICAS * SLOTS > cap);
        if let Some(key_cap) = QUEUES[i].key_cap {
            assert!(KEYS * key_cap as usize > cap);
        }
        jobs += QUEUES[i].per_batch;
        i += 1;
    }
    assert!(jobs == BATCH);
};

/// The concurrency keys a key-capped queue's jobs are spread over, evenly by their place in the
/// batch (each job's key set at its insert).
const KEYS: usize = 6;
/// The cap of each key's running jobs in the cap-8 queue.
const KEY_CAP: i32 = 2;
/// How often the sampler counts the queues' running jobs.
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
/// The whole-replica cuts, as (seconds into the chaos, length): every connection of one replica
/// (the one not faulted then that runs the most jobs, once one runs any) closed and new ones
/// held for the length.
/// A cut of 1 s is within what a live replica rides out; one of 10 s is not (its jobs move).
const CUTS: [(u64, Duration); 6] = [
    (4, Duration::from_secs(1)),
    (8, Duration::from_secs(10)),
    (14, Duration::from_secs(1)),
    (24, Duration::from_secs(1)),
    (30, Duration::from_secs(10)),
    (36, Duration::from_secs(1)),
];
/// How long a replica is left alone once a cut of it ends (no kill, freeze or cut), so that
/// whatever the cut alone did to its jobs has happened: after a short cut, past another
/// replica's silence (1.75 s after the last beat before the cut: nothing moved, by the rule);
/// after a long one, past the refund the replica makes once back and its second look a silence
/// later (every attempt recovery took from it refunded).
const QUIET_AFTER_CUT: Duration = Duration::from_secs(3);
/// How long the faults may go on past [`CHAOS`] for a cut that found no live replica running
/// jobs in time.
const CUT_GRACE: Duration = Duration::from_secs(15);
/// How long a due cut looks for a live replica running jobs, each time round the loop: the
/// looks start right after a batch is enqueued, and a batch's jobs run for a fraction of the
/// time between batches, so a single look phase-locked to the loop could miss them every time.
const CUT_LOOK: Duration = Duration::from_millis(500);
/// The pause between two looks of a due cut.
const CUT_LOOK_EVERY: Duration = Duration::from_millis(10);
/// How long a resumed or restarted replica is left alone (no kill, freeze or cut): a freeze
/// longer than its trust window costs it its leases, which it gives back once it runs again, and
/// a restarted one first releases what its killed incarnation left running; a cut in that moment
/// would find jobs that were moving already, the replica not live by its own rules.
const QUIET_AFTER_RESUME: Duration = Duration::from_secs(2);

/// The replicas' flags besides their slots and queues: short leases and transaction timeouts, so
/// faults heal quickly; a lease (4 s, renewed every second) long enough that a cut of 1 s cannot
/// let it expire (with 2 s, a renewal sent half a second before such a cut left the lease half
/// a second to be renewed once the cut ended, and it often expired and was recovered, charged).
/// Freezes of up to 5 s still outlast it.
const ARGS: &[&str] = &[
    "--lease",
    "4s",
    "--heartbeat-interval",
    "1s",
    "--idle-in-transaction-timeout",
    "2s",
    "--retry-min-delay",
    "50ms",
    "--retry-max-delay",
    "500ms",
    "--shutdown-grace",
    "5s",
];

/// The handler-side record, set up before the replicas start. The ETL handler's one write, its
/// load, runs in the fenced transaction that also ends its job; a trigger on the target table
/// keeps, per job, that transaction's start (after the job's claim committed: the job was
/// claimed, then computed, then batched) and the moment of the load (before the commit that
/// frees its permits). A rolled-back attempt (a stale claim, a terminated backend) keeps
/// nothing, and a job whose load inserted no row (a second load of the same rows) adds none. So
/// every window lies within the time its job held its permits, and no more windows of a queue
/// overlap than its jobs held permits at once.
const EFFECTS_RECORD: &str = "
    CREATE TABLE soak_effects (
        job_id uuid        PRIMARY KEY,
        began  timestamptz NOT NULL,
        loaded timestamptz NOT NULL
    );
    CREATE FUNCTION soak_record_effects() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO soak_effects
        SELECT DISTINCT written_by_job, now(), clock_timestamp() FROM loaded_rows
            ON CONFLICT (job_id) DO NOTHING;
        RETURN NULL;
    END;
    $$;
    CREATE TRIGGER soak_record_effects AFTER INSERT ON etl_target_rows
        REFERENCING NEW TABLE AS loaded_rows
        FOR EACH STATEMENT EXECUTE FUNCTION soak_record_effects();";

/// For each queue of `$1`, in order: the most of its recorded effects windows that overlapped at
/// once (a window that ends at the instant another begins does not overlap it), and the windows.
const EFFECTS_OVERLAP: &str = "
    WITH w AS (SELECT i.queue, e.began, e.loaded
                 FROM soak_effects e JOIN etl_job_intake i ON i.id = e.job_id),
         edges AS (SELECT queue, began AS at, 1 AS step FROM w
                   UNION ALL SELECT queue, loaded, -1 FROM w),
         open AS (SELECT queue, sum(step) OVER (PARTITION BY queue ORDER BY at, step
                                                ROWS UNBOUNDED PRECEDING) AS n
                    FROM edges)
    SELECT coalesce((SELECT max(n) FROM open WHERE open.queue = q.name), 0)::bigint,
           (SELECT count(*) FROM w WHERE w.queue = q.name)
      FROM unnest($1::text[]) WITH ORDINALITY AS q(name, ord) ORDER BY q.ord";

/// One replica slot: its owner id, log file and current process.
struct Slot {
    /// Stable owner id, reused by every incarnation.
    owner: String,
    /// Its claim cooldown: every other replica holds its wakes' claims 20 ms after each claim,
    /// so held claims meet the faults too.
    cooldown: &'static str,
    /// Standard error of every incarnation, appended.
    log: PathBuf,
    /// When a frozen incarnation is to be resumed.
    thaw_at: Option<Instant>,
    /// Until when a resumed or restarted incarnation is left alone ([`QUIET_AFTER_RESUME`]).
    quiet_until: Option<Instant>,
    /// The database's time just before the current incarnation started: a running row of this
    /// owner that started before it is its killed predecessor's, left for recovery.
    born: std::time::SystemTime,
    /// The proxy every incarnation connects through.
    proxy: Arc<Proxy>,
    /// When a cut of every connection ends, and the attempts it caught running if it is a short
    /// one (checked once the quiet after it is over).
    cut: Option<Cut>,
}

/// An attempt a short cut caught running: its job, its number, and when it started (an attempt
/// given back uncharged and claimed again takes the same number, with a later start).
type Caught = (uuid::Uuid, i32, Option<std::time::SystemTime>);

/// What the database said of a short cut's replica as the cut began: the oldest renewal of the
/// leases it caught, in ms, and its last beat's age, in ms.
type AtCut = (i64, i64);

/// A cut of every connection of one replica, under way or in the quiet after it.
struct Cut {
    /// When the proxy lets traffic through again (a task of its own does it then, whatever
    /// the fault loop is doing).
    ends: Instant,
    /// Whether it lasts at most 1 s: its replica rides it out, and nothing it caught may move.
    short: bool,
    /// The database's time as the cut began.
    began: std::time::SystemTime,
    /// The `(job id, attempt, its start)` the replica was running when the cut began.
    caught: Vec<Caught>,
    /// The leases' expiry of the caught attempts, as the cut began, in their order.
    expiries: Vec<std::time::SystemTime>,
}

impl Slot {
    /// Whether a fault of this replica is under way (frozen, cut, or in the quiet after a short
    /// cut): it gets no other until then.
    fn faulted(&self) -> bool {
        self.thaw_at.is_some()
            || self.cut.is_some()
            || self.quiet_until.is_some_and(|t| t > Instant::now())
    }
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
    /// Replica processes started after the first [`REPLICAS`] (after kills, or after an exit).
    restarts: u32,
    /// Incarnations that exited without being killed by the soak.
    self_exits: u32,
    /// Jobs a kill or freeze caught running.
    caught: usize,
    /// Longest time from a kill or freeze until every job the faulted replica was running then
    /// had moved on (finished, or taken over under another claim).
    max_stuck: Duration,
    /// Cuts of 1 s, and of 10 s.
    cuts: (u32, u32),
    /// What became of the attempts the short cuts caught running.
    short_cut_attempts: ShortCutAttempts,
    /// What became of the attempts the long cuts caught running.
    long_cut_attempts: LongCutAttempts,
}

/// The attempts the cuts of 10 s caught running: those another replica's recovery took, and of
/// those, the ones their cut replica had stopped trusting (logged `lease_lost` for the job,
/// which is when its handler is told) before the recovery, and the ones claimed as the cut began
/// (within [`AT_CUT`] before it) with no such line: a claim whose reply the cut lost, which the
/// replica never ran (it adopts such a claim's jobs only once it reaches the database again). No
/// overlap: those two make up all of them.
#[derive(Debug, Default)]
struct LongCutAttempts {
    /// Caught running.
    caught: usize,
    /// Taken by another replica's recovery.
    recovered: i64,
    /// Of those, abandoned by the cut replica first.
    abandoned_first: i64,
    /// Of those, claimed as the cut began and never abandoned: their claim's reply was lost.
    claimed_at_cut: i64,
    /// Of those, refunded by the cut replica once it was back (recorded `released`, the owner
    /// they were taken from kept): an infrastructure fault charged nothing.
    refunded: i64,
}

/// How long before a cut began a claim whose reply the cut lost may have started.
const AT_CUT: &str = "100 milliseconds";

/// The attempts the cuts of 1 s caught running, and how many of them ended, by the end their
/// attempt history records, before the quiet after their cut was over.
#[derive(Debug, Default)]
struct ShortCutAttempts {
    /// Caught running.
    caught: usize,
    /// Charged by their own replica (`retried`): an infrastructure fault taken for the job's.
    retried: i64,
    /// Taken by another replica's recovery (`recovered`, charged): the cut replica was judged
    /// dead, or let a lease expire.
    recovered: i64,
    /// Given back uncharged by their replica (`released`): it stopped trusting the lease.
    released: i64,
    /// Of `recovered`, those taken before their lease expired: the cut replica was judged dead.
    recovered_alive: i64,
    /// The oldest renewal of a caught lease, and the oldest last beat, as any short cut began.
    oldest_at_cut: AtCut,
}

impl Slot {
    /// Starts an incarnation of this replica, appending its standard error to the log.
    fn start(&self, db: &TestDb) -> std::process::Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let slots = SLOTS.to_string();
        let queues = QUEUES.map(|q| q.name).join(",");
        let shape = [
            "--slots",
            &slots,
            "--queues",
            &queues,
            "--claim-cooldown",
            self.cooldown,
        ];
        let args: Vec<&str> = ARGS.iter().copied().chain(shape).collect();
        // Debug level: the more the replicas say, the more the leak search covers.
        spawn_replica_logged(
            &self.proxy.url_for(&db.config.url),
            &self.owner,
            &args,
            Stdio::from(log),
            "debug",
        )
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
    let client = db.client().await;
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut slots: Vec<Slot> = Vec::new();
    for i in 0..REPLICAS {
        slots.push(Slot {
            owner: format!("soak-{i}"),
            cooldown: if i % 2 == 1 { "20ms" } else { "0ms" },
            log: dir.join(format!("soak-{}-{i}.log", db.name)),
            thaw_at: None,
            quiet_until: None,
            born: std::time::SystemTime::UNIX_EPOCH,
            proxy: Arc::new(Proxy::in_front_of_test_server().await),
            cut: None,
        });
    }
    let mut cuts = CUTS.iter().peekable();
    let faults = dir.join(format!("soak-{}-faults.log", db.name));
    for q in &QUEUES {
        durable_etl::queue::set_cap(&client, q.name, Some(q.cap))
            .await
            .unwrap();
        durable_etl::queue::set_key_cap(&client, q.name, q.key_cap)
            .await
            .unwrap();
    }
    client.batch_execute(EFFECTS_RECORD).await.unwrap();
    let sampler = Sampler::start(&db).await;
    let mut replicas = Processes(slots.iter().map(|s| s.start(&db)).collect());
    let mut figures = Figures::default();
    let mut watched: Vec<(Instant, Vec<uuid::Uuid>)> = Vec::new();
    let mut enqueued = 0;
    let chaos_ends = Instant::now() + CHAOS;
    while Instant::now() < chaos_ends || enqueued < JOBS || waiting_cut(&mut cuts, chaos_ends) {
        // Batches are spread over the chaos, so jobs flow while the faults happen.
        let due = (chaos_ends - CHAOS).elapsed().as_secs_f64() / CHAOS.as_secs_f64();
        if enqueued < JOBS && (enqueued as f64) / (JOBS as f64) <= due {
            // One statement: every job of the batch is inserted in its queue, with its key.
            let prefix = format!("b{enqueued}");
            let shape = (BATCH, RECORDS, MAX_ATTEMPTS);
            let ids = enqueue_placed_loads(&client, &prefix, shape, place).await;
            assert_eq!(ids.len(), BATCH);
            enqueued += BATCH;
        }
        for (slot, child) in slots.iter_mut().zip(replicas.0.iter_mut()) {
            if slot.thaw_at.is_some_and(|t| t <= Instant::now()) {
                signal(child, "CONT");
                note(&faults, &format!("thaw {}", slot.owner));
                slot.thaw_at = None;
                slot.quiet_until = Some(Instant::now() + QUIET_AFTER_RESUME);
            }
            if child.try_wait().unwrap().is_some() {
                figures.self_exits += 1;
                figures.restarts += 1;
                slot.born = db_now(&client).await;
                *child = slot.start(&db);
                slot.quiet_until = Some(Instant::now() + QUIET_AFTER_RESUME);
            }
            heal_cut(&client, slot, &mut figures).await;
        }
        let i = rng.usize(..slots.len());
        let chaos_at = (chaos_ends - CHAOS).elapsed();
        if let Some(&&(at, length)) = cuts.peek() {
            if chaos_at >= Duration::from_secs(at) {
                if let Some(j) = busiest_unfaulted_within(&client, &slots, CUT_LOOK).await {
                    note(&faults, &format!("cut {} {length:?}", slots[j].owner));
                    cut(&client, &mut slots[j], length, &mut figures).await;
                    cuts.next();
                }
            }
        }
        // While a cut waits for a live replica that runs jobs, no other fault is made, so the
        // frozen thaw and the restarted settle, and one becomes free.
        let cut_waits = cuts
            .peek()
            .is_some_and(|&&(at, _)| chaos_at >= Duration::from_secs(at));
        match rng.u8(..3) {
            _ if cut_waits => {}
            0 if !slots[i].faulted() => {
                signal(&replicas.0[i], "KILL");
                note(&faults, &format!("kill {}", slots[i].owner));
                replicas.0[i].wait().unwrap();
                figures.kills += 1;
                let claims = claims_of(&client, &slots[i].owner).await;
                figures.caught += claims.len();
                watched.push((Instant::now(), claims));
                slots[i].born = db_now(&client).await;
                replicas.0[i] = slots[i].start(&db);
                slots[i].quiet_until = Some(Instant::now() + QUIET_AFTER_RESUME);
                figures.restarts += 1;
            }
            1 if !slots[i].faulted() => {
                signal(&replicas.0[i], "STOP");
                note(&faults, &format!("freeze {}", slots[i].owner));
                figures.freezes += 1;
                let claims = claims_of(&client, &slots[i].owner).await;
                figures.caught += claims.len();
                watched.push((Instant::now(), claims));
                slots[i].thaw_at = Some(Instant::now() + Duration::from_millis(rng.u64(500..5000)));
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
    // The faults stop: resume the frozen, restore the cut, restart the dead.
    assert!(cuts.next().is_none(), "every cut was made");
    for (slot, child) in slots.iter_mut().zip(replicas.0.iter_mut()) {
        signal(child, "CONT");
        slot.thaw_at = None;
        while slot.cut.is_some() {
            heal_cut(&client, slot, &mut figures).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
        mut queues,
    } = sampler.stop().await;
    count_drained(&client, &mut queues).await;
    for child in &mut replicas.0 {
        signal(child, "TERM");
        child.wait().unwrap();
    }

    let succeeded = count(&client, "etl_jobs WHERE status = 'succeeded'").await;
    let lost = JOBS as i64 - succeeded;
    let duplicated = count(&client, LEDGERS).await - succeeded
        + count(
            &client,
            &format!("{LEDGERS} AND ((output ->> 'rows_updated')::int <> 0 OR (output ->> 'rows_unchanged')::int <> 0)"),
        )
        .await;
    let failed = count(&client, "etl_jobs WHERE status = 'failed'").await;
    let retried = count(&client, "etl_job_attempts WHERE ending = 'retried'").await;
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
        if std::env::var_os("SOAK_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_file(&slot.log);
        }
    }
    if std::env::var_os("SOAK_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_file(&faults);
    }
    let report = format!(
        "chaos soak (seed {seed}): {JOBS} jobs, {REPLICAS} replicas × {SLOTS} slots, {:?} of faults\n\
         kills {}, freezes {}, jobs they caught running {}, backend kills {}, restarts {}, self-exits {}\n\
         lost {lost}, duplicated {duplicated}, highest attempts {max_attempts_seen} (max {MAX_ATTEMPTS})\n\
         max stuck after a kill or freeze {:?}, all terminal {:?} after the faults stopped\n\
         cuts of every connection of a replica: {} of 1 s, {} of 10 s; attempts the 1 s cuts caught \
         running {}, of which retried {}, recovered {} ({} before their lease expired), given back {}; \
         as a short cut began, oldest renewal of a lease it caught {} ms, its replica's last beat {} ms \
         ago; attempts the 10 s cuts caught running {}, of which another replica recovered {}, \
         {} of them after their replica logged `lease_lost` for them and {} claimed as the cut began \
         (reply lost, never run), {} refunded by their replica once back; jobs failed {failed}, \
         attempts retried {retried}\n\
         {samples} samples of the running jobs; per queue:\n{}\
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
        figures.cuts.0,
        figures.cuts.1,
        figures.short_cut_attempts.caught,
        figures.short_cut_attempts.retried,
        figures.short_cut_attempts.recovered,
        figures.short_cut_attempts.recovered_alive,
        figures.short_cut_attempts.released,
        figures.short_cut_attempts.oldest_at_cut.0,
        figures.short_cut_attempts.oldest_at_cut.1,
        figures.long_cut_attempts.caught,
        figures.long_cut_attempts.recovered,
        figures.long_cut_attempts.abandoned_first,
        figures.long_cut_attempts.claimed_at_cut,
        figures.long_cut_attempts.refunded,
        QUEUES.iter().zip(&queues).map(QueueSeen::line).collect::<String>(),
        leaks.len(),
        started.elapsed(),
    );
    println!("{report}");
    std::fs::write(dir.join("soak-figures.txt"), &report).unwrap();

    assert_eq!((lost, duplicated), (0, 0), "{report}");
    assert_eq!(
        (failed, retried),
        (0, 0),
        "no job failed, and no attempt was charged, for the infrastructure's sake: {report}"
    );
    assert_eq!(
        figures.cuts,
        (4, 2),
        "every cut of 1 s and of 10 s was made: {report}"
    );
    assert!(
        figures.short_cut_attempts.caught > 0,
        "the short cuts caught attempts running: {report}"
    );
    let short = &figures.short_cut_attempts;
    assert_eq!(
        (short.retried, short.recovered, short.released),
        (0, 0, 0),
        "a cut of at most 1 s of a live replica moved no job and charged no attempt: {report}"
    );
    let long = &figures.long_cut_attempts;
    assert!(long.recovered > 0, "the long cuts moved jobs: {report}");
    assert_eq!(
        long.abandoned_first + long.claimed_at_cut,
        long.recovered,
        "no job moved before its cut replica stopped trusting its lease: {report}"
    );
    assert_eq!(
        long.refunded, long.recovered,
        "every attempt recovery took from a replica that was only cut off was refunded: {report}"
    );
    assert!(samples > 100, "the sampler sampled throughout: {report}");
    for (q, seen) in QUEUES.iter().zip(&queues) {
        seen.assert_held(q, &report);
    }
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

/// One queue's figures: what the [`Sampler`] saw of it, and what [`count_drained`] counted once
/// every job ended.
#[derive(Debug, Default, Clone, Copy)]
struct QueueSeen {
    /// The most running jobs at once, by the database's count.
    most_running: i64,
    /// Samples in which it ran at its cap.
    at_cap: u64,
    /// The most running jobs of one key at once.
    most_of_a_key: i64,
    /// Samples with a running job that did not hold its queue permit or, keyed, its key permit.
    unpermitted: i64,
    /// The most effects windows that overlapped at once ([`EFFECTS_OVERLAP`]): the handler-side
    /// count.
    most_loading: i64,
    /// Effects windows recorded: the jobs whose load inserted their rows.
    loads: i64,
    /// Permits (the queue's and its keys') still held once every job ended.
    permits_held: i64,
}

impl QueueSeen {
    /// The report's line of queue `q`.
    fn line((q, seen): (&Capped, &QueueSeen)) -> String {
        let (keys, of_a_key) = match q.key_cap {
            Some(key_cap) => (
                format!(", key cap {key_cap} over {KEYS} keys"),
                format!(" and of one key {}", seen.most_of_a_key),
            ),
            None => (String::new(), String::new()),
        };
        format!(
            "  {} (cap {}{keys}, {} jobs): most running at once {} (at the cap in {} samples){of_a_key}, \
             running without its permits {}, handler-side most loading at once {} of {} loads, \
             permits held once drained {}\n",
            q.name,
            q.cap,
            JOBS / BATCH * q.per_batch,
            seen.most_running,
            seen.at_cap,
            seen.unpermitted,
            seen.most_loading,
            seen.loads,
            seen.permits_held,
        )
    }

    /// Asserts what queue `q` must have shown: never more running than its cap by either count,
    /// and its cap reached by the database's; no more of one key than the key cap, and some;
    /// no job running without its permits, and none held once drained; every job's load
    /// recorded once.
    fn assert_held(&self, q: &Capped, report: &str) {
        let cap = i64::from(q.cap);
        assert!(
            self.most_running <= cap && self.most_loading <= cap,
            "{} ran more than its cap: {report}",
            q.name
        );
        assert_eq!(
            self.most_running, cap,
            "{} reached its cap: {report}",
            q.name
        );
        assert!(
            self.most_loading >= 1,
            "{}'s loads were counted: {report}",
            q.name
        );
        if let Some(key_cap) = q.key_cap {
            assert!(
                (1..=i64::from(key_cap)).contains(&self.most_of_a_key),
                "{}'s keys ran within their cap: {report}",
                q.name
            );
        }
        assert_eq!(
            (self.unpermitted, self.permits_held),
            (0, 0),
            "{} ran every job with its permits and freed them all: {report}",
            q.name
        );
        assert_eq!(
            self.loads,
            (JOBS / BATCH * q.per_batch) as i64,
            "{} recorded each job's load once: {report}",
            q.name
        );
    }
}

/// What the [`Sampler`] saw.
#[derive(Debug, Default)]
struct Sampled {
    /// Samples taken.
    samples: u64,
    /// Each queue's figures, in the order of [`QUEUES`].
    queues: [QueueSeen; QUEUES.len()],
}

/// The names of [`QUEUES`], in order: the `$1` of the statements that answer per queue.
fn queue_names() -> Vec<&'static str> {
    QUEUES.iter().map(|q| q.name).collect()
}

/// The job of each place `i` of a batch: its queue, and its key if that queue is key-capped.
/// The first [`Capped::per_batch`] places go to the first queue, the next to the second, and so
/// on; a key-capped queue's jobs take the [`KEYS`] keys in turn.
fn place(i: usize) -> (&'static str, Option<String>) {
    let mut first = 0;
    for q in &QUEUES {
        if i < first + q.per_batch {
            let key = q.key_cap.map(|_| format!("tenant-{}", (i - first) % KEYS));
            return (q.name, key);
        }
        first += q.per_batch;
    }
    unreachable!("a batch has {BATCH} places, all of them in a queue")
}

/// Each queue of `$1`, in order, in one snapshot: its running jobs, the most of them of one key,
/// and whether any of them runs without its permits (the queue's permit of its slot naming its
/// claim; a keyed job's key permit, named by its claim, of its queue and key).
const SAMPLE: &str = "
    WITH r AS MATERIALIZED (
        SELECT j.queue, j.concurrency_key,
               NOT EXISTS (SELECT FROM etl_queue_permits p
                            WHERE p.queue = j.queue AND p.slot = j.permit_slot
                              AND p.claim_id = j.lease_claim_id)
               OR (j.concurrency_key IS NOT NULL
                   AND NOT EXISTS (SELECT FROM etl_key_permits k
                                    WHERE k.claim_id = j.lease_claim_id AND k.queue = j.queue
                                      AND k.concurrency_key = j.concurrency_key)) AS unpermitted
          FROM etl_job_records j WHERE j.status = 'running'
    )
    SELECT (SELECT count(*) FROM r WHERE r.queue = q.name),
           (SELECT coalesce(max(n), 0)
              FROM (SELECT count(*) AS n FROM r
                     WHERE r.queue = q.name AND r.concurrency_key IS NOT NULL
                     GROUP BY r.concurrency_key) k),
           EXISTS (SELECT FROM r WHERE r.queue = q.name AND r.unpermitted)
      FROM unnest($1::text[]) WITH ORDINALITY AS q(name, ord) ORDER BY q.ord";

/// Counts each capped queue's running jobs, in all, per key and without their permits, every
/// [`SAMPLE_EVERY`] on a connection of its own, until stopped: the database's own count, whoever
/// holds the jobs (a frozen replica's count too), each sample one snapshot.
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
            let names = queue_names();
            let mut seen = Sampled::default();
            while !*stopped.borrow() {
                // The faults terminate only durable-etl's own sessions, never this one; an error
                // ends the sampling, and the sample-count assertion catches that.
                let Ok(rows) = client.query(SAMPLE, &[&names]).await else {
                    break;
                };
                seen.samples += 1;
                for ((q, queue), row) in QUEUES.iter().zip(&mut seen.queues).zip(&rows) {
                    let running: i64 = row.get(0);
                    queue.most_running = queue.most_running.max(running);
                    queue.at_cap += u64::from(running == i64::from(q.cap));
                    queue.most_of_a_key = queue.most_of_a_key.max(row.get::<_, i64>(1));
                    queue.unpermitted += i64::from(row.get::<_, bool>(2));
                }
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

/// Fills in each queue's figures of `queues` that are counted once every job ended: the permits
/// still held, and the handler-side count from the recorded effects windows.
async fn count_drained(client: &tokio_postgres::Client, queues: &mut [QueueSeen]) {
    let names = queue_names();
    let held = client
        .query(
            "SELECT (SELECT count(*) FROM etl_queue_permits p
                      WHERE p.queue = q.name AND p.claim_id IS NOT NULL)
                    + (SELECT count(*) FROM etl_key_permits k WHERE k.queue = q.name)
               FROM unnest($1::text[]) WITH ORDINALITY AS q(name, ord) ORDER BY q.ord",
            &[&names],
        )
        .await
        .unwrap();
    let loads = client.query(EFFECTS_OVERLAP, &[&names]).await.unwrap();
    for ((queue, held), loads) in queues.iter_mut().zip(&held).zip(&loads) {
        queue.permits_held = held.get(0);
        queue.most_loading = loads.get(0);
        queue.loads = loads.get(1);
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

/// Cuts every connection of `slot`'s replica for `length` (closed, new ones held), noting the
/// attempts it is running if the cut is short.
async fn cut(
    client: &tokio_postgres::Client,
    slot: &mut Slot,
    length: Duration,
    figures: &mut Figures,
) {
    slot.proxy.set_mode(Mode::Blackhole);
    slot.proxy.drop_all();
    let short = length <= Duration::from_secs(1);
    let began = db_now(client).await;
    // The attempts of this incarnation only: a killed predecessor's rows are recovery's.
    let rows = client
        .query(
            "SELECT id, attempts, started_at, lease_expires_at,
                    (extract(epoch FROM now() - lease_renewed_at) * 1000)::int8,
                    (SELECT (extract(epoch FROM now() - b.beat_at) * 1000)::int8
                       FROM etl_owner_beats b WHERE b.owner_id = $1)
               FROM etl_job_records
              WHERE status = 'running' AND lease_owner_id = $1 AND started_at >= $2",
            &[&slot.owner, &slot.born],
        )
        .await
        .unwrap();
    if short {
        figures.cuts.0 += 1;
        let oldest = &mut figures.short_cut_attempts.oldest_at_cut;
        for r in &rows {
            oldest.0 = oldest.0.max(r.get::<_, Option<i64>>(4).unwrap_or(0));
            oldest.1 = oldest.1.max(r.get::<_, Option<i64>>(5).unwrap_or(0));
        }
    } else {
        figures.cuts.1 += 1;
    }
    let expiries = rows.iter().map(|r| r.get(3)).collect();
    let caught = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let proxy = Arc::clone(&slot.proxy);
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        proxy.set_mode(Mode::Pass);
    });
    slot.cut = Some(Cut {
        ends: Instant::now() + length,
        short,
        began,
        caught,
        expiries,
    });
}

/// Once `slot`'s cut is over, and the quiet after it if it is a short one, counts what became
/// of the attempts it caught, and forgets the cut.
async fn heal_cut(client: &tokio_postgres::Client, slot: &mut Slot, figures: &mut Figures) {
    let Some(cut) = &slot.cut else {
        return;
    };
    if cut.ends + QUIET_AFTER_CUT > Instant::now() {
        return;
    }
    let ids: Vec<uuid::Uuid> = cut.caught.iter().map(|c| c.0).collect();
    let attempts: Vec<i32> = cut.caught.iter().map(|c| c.1).collect();
    let starts: Vec<Option<std::time::SystemTime>> = cut.caught.iter().map(|c| c.2).collect();
    // The cut replica's `lease_lost` lines since the cut began: (job id, when).
    let (lost_ids, lost_at) = lease_lost_lines(&slot.log);
    let ended = client
        .query_one(
            "WITH c AS (
                 SELECT * FROM unnest($1::uuid[], $2::int4[], $3::timestamptz[], $4::timestamptz[])
                        AS c(id, attempt, started, expires)),
             lost AS (
                 SELECT l.id, l.at::timestamptz AS at
                   FROM unnest($5::uuid[], $6::text[]) AS l(id, at)
                  WHERE l.at::timestamptz >= $7),
             a AS (
                 SELECT a.*, c.expires,
                        (a.ending = 'recovered' OR a.owner_id IS NOT NULL) AS taken
                   FROM etl_job_attempts a
                   JOIN c ON a.job_id = c.id AND a.attempt = c.attempt
                         AND (c.started IS NULL OR a.started_at = c.started))
             SELECT count(*) FILTER (WHERE ending = 'retried'),
                    count(*) FILTER (WHERE taken),
                    count(*) FILTER (WHERE ending = 'released'),
                    count(*) FILTER (WHERE taken AND ended_at < expires),
                    count(*) FILTER (WHERE taken AND EXISTS (
                        SELECT 1 FROM lost WHERE lost.id = a.job_id AND lost.at < a.ended_at)),
                    count(*) FILTER (WHERE taken AND NOT EXISTS (
                        SELECT 1 FROM lost WHERE lost.id = a.job_id AND lost.at < a.ended_at)
                        AND a.started_at >= $7 - $8::text::interval),
                    count(*) FILTER (WHERE taken AND ending = 'released')
               FROM a",
            &[
                &ids,
                &attempts,
                &starts,
                &cut.expiries,
                &lost_ids,
                &lost_at,
                &cut.began,
                &AT_CUT,
            ],
        )
        .await
        .unwrap();
    if cut.short {
        let seen = &mut figures.short_cut_attempts;
        seen.caught += cut.caught.len();
        seen.retried += ended.get::<_, i64>(0);
        seen.recovered += ended.get::<_, i64>(1);
        seen.released += ended.get::<_, i64>(2);
        seen.recovered_alive += ended.get::<_, i64>(3);
    } else {
        let seen = &mut figures.long_cut_attempts;
        seen.caught += cut.caught.len();
        seen.recovered += ended.get::<_, i64>(1);
        seen.abandoned_first += ended.get::<_, i64>(4);
        seen.claimed_at_cut += ended.get::<_, i64>(5);
        seen.refunded += ended.get::<_, i64>(6);
    }
    slot.cut = None;
}

/// The `lease_lost` lines of the log at `path`: each job's id and when its replica stopped
/// trusting the lease (the line's timestamp, as PostgreSQL reads it).
fn lease_lost_lines(path: &std::path::Path) -> (Vec<uuid::Uuid>, Vec<String>) {
    const MARK: &str = "abandoning the job job_id=";
    let log = std::fs::read_to_string(path).unwrap_or_default();
    log.lines()
        .filter_map(|line| {
            let at = line.split_whitespace().next()?;
            let rest = &line[line.find(MARK)? + MARK.len()..];
            let id = uuid::Uuid::parse_str(rest.get(..36)?).ok()?;
            Some((id, at.to_owned()))
        })
        .unzip()
}

/// Whether a cut is still to be made, for at most [`CUT_GRACE`] after the chaos (then the
/// assertion that every cut was made says so).
fn waiting_cut(
    cuts: &mut std::iter::Peekable<std::slice::Iter<'_, (u64, Duration)>>,
    chaos_ends: Instant,
) -> bool {
    cuts.peek().is_some() && Instant::now() < chaos_ends + CUT_GRACE
}

/// The database's time now.
async fn db_now(client: &tokio_postgres::Client) -> std::time::SystemTime {
    client.query_one("SELECT now()", &[]).await.unwrap().get(0)
}

/// Appends `what` to the fault log `log` (kept with the replicas' logs under `SOAK_KEEP_LOGS`),
/// stamped with the wall clock's seconds since the epoch.
fn note(log: &PathBuf, what: &str) {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    writeln!(file, "{:.3} {what}", now.as_secs_f64()).unwrap();
}

/// [`busiest_unfaulted`], asked every [`CUT_LOOK_EVERY`] until it finds one or `within` has passed.
async fn busiest_unfaulted_within(
    client: &tokio_postgres::Client,
    slots: &[Slot],
    within: Duration,
) -> Option<usize> {
    let until = Instant::now() + within;
    loop {
        let found = busiest_unfaulted(client, slots).await;
        if found.is_some() || Instant::now() >= until {
            return found;
        }
        tokio::time::sleep(CUT_LOOK_EVERY).await;
    }
}

/// The replica of `slots`, not faulted now, that runs the most jobs, if one runs any.
async fn busiest_unfaulted(client: &tokio_postgres::Client, slots: &[Slot]) -> Option<usize> {
    let owners: Vec<&str> = slots.iter().map(|s| s.owner.as_str()).collect();
    let running: Vec<i64> = client
        .query(
            "SELECT (SELECT count(*) FROM etl_job_records
                      WHERE status = 'running' AND lease_owner_id = o.owner)
               FROM unnest($1::text[]) WITH ORDINALITY AS o(owner, ord) ORDER BY o.ord",
            &[&owners],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (0..slots.len())
        .filter(|&j| !slots[j].faulted() && running[j] > 0)
        .max_by_key(|&j| running[j])
}
