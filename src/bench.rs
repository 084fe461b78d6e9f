//! `durable-etl bench`: end-to-end figures of real replicas (child processes of this binary)
//! against a throw-away database, in two modes.
//!
//! - **Burn-down**: `jobs` due jobs are inserted before any replica starts; the replicas then
//!   drain them. Throughput = jobs / (last `finished_at` − first `started_at`), database clock, so
//!   process start-up and the inserts are not timed (the peers' harness times the same span).
//! - **Offered load**: idle replicas first; then one producer inserts one job per autocommit
//!   statement at `rate` jobs/s for `duration`, and the figures describe pickup latency.
//!
//! Invariants this module keeps:
//! - It only ever touches the database it creates (`--bench-database`), which it drops at the
//!   end unless told to keep it; it refuses to run against a name that is not its own prefix.
//! - Every figure comes from the database (timestamps, WAL position) or from the replicas' own
//!   metrics endpoints, never from the bench's guess about what the replicas did.
//! - Every wait is bounded; replicas are killed when the bench ends, whatever happened.

use crate::config::{ConfigError, DatabaseConfig};
use crate::db;
use crate::digest::Secret;
use crate::error::Error;
use crate::etl::enqueue::{enqueue_many, NewJob};
use crate::etl::request::{self, IntakeLimits};
use serde::Serialize;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The database name every bench database starts with.
pub const DATABASE_PREFIX: &str = "durable_etl_bench";

/// Records per ETL job (each job loads this many distinct rows).
pub const RECORDS_PER_ETL_JOB: usize = 10;

/// The longest a bench waits for its jobs to end, or for a replica to come up.
const WAIT_LIMIT: Duration = Duration::from_secs(600);

/// How long a replica gets to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How often the bench looks whether the jobs have ended.
const DONE_POLL: Duration = Duration::from_millis(20);

/// Jobs inserted per statement when filling the queue.
const INSERT_CHUNK: usize = 2_000;

/// What the replicas run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BenchHandler {
    /// The built-in `noop` kind: no effects, completions only.
    Noop,
    /// ETL loads of [`RECORDS_PER_ETL_JOB`] rows each.
    Etl,
}

/// What load the bench offers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Mode {
    /// Drain `jobs` pre-inserted jobs.
    BurnDown {
        /// Jobs inserted before the replicas start.
        jobs: usize,
    },
    /// Insert jobs one by one at `rate` per second for `duration_s` seconds.
    OfferedLoad {
        /// Jobs per second.
        rate: f64,
        /// Seconds of load.
        duration_s: f64,
    },
    /// `trials` times: SIGKILL the replica running a (held) job and time until a live replica
    /// runs it again.
    Recovery {
        /// Kills to time.
        trials: usize,
    },
}

/// One bench run's settings.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    /// The load.
    #[serde(flatten)]
    pub mode: Mode,
    /// Replica processes.
    pub replicas: usize,
    /// Slots per replica.
    pub slots: usize,
    /// What the jobs do.
    pub handler: BenchHandler,
    /// The database the bench creates and drops.
    pub database: String,
    /// Keep the database afterwards.
    pub keep: bool,
}

/// Percentiles of a latency sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `sample` (empty: all zero).
    pub fn of(mut sample: Vec<f64>) -> Percentiles {
        if sample.is_empty() {
            return Percentiles::default();
        }
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * sample.len() as f64).ceil() as usize;
            sample[rank.clamp(1, sample.len()) - 1]
        };
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The settings.
    pub config: BenchConfig,
    /// Jobs that ended `succeeded`.
    pub succeeded: u64,
    /// Jobs that ended otherwise (should be 0).
    pub not_succeeded: u64,
    /// Seconds from the first claim to the last completion (database clock).
    pub elapsed_s: f64,
    /// `succeeded / elapsed_s`.
    pub jobs_per_s: f64,
    /// Enqueue → claim: the inserting transaction's start → the claiming transaction's start
    /// (database clock). In burn-down this is queueing time.
    pub enqueue_to_start_ms: Percentiles,
    /// Offered load only: the producer's commit acknowledgement → the start of the statement
    /// that completed the job (an upper bound on acknowledgement → handler start).
    pub ack_to_done_ms: Option<Percentiles>,
    /// Recovery only: SIGKILL of the replica running a job → a live replica's claim of that job
    /// (database clock).
    pub recovery_ms: Option<Percentiles>,
    /// Statements the replicas sent on pooled connections, per succeeded job.
    pub round_trips_per_job: f64,
    /// Claims the replicas made.
    pub claims: u64,
    /// Claims that found nothing.
    pub empty_claims: u64,
    /// Group commits the replicas made.
    pub commit_batches: u64,
    /// WAL the run wrote, per succeeded job (whole server: other databases' writes count too).
    pub wal_bytes_per_job: f64,
    /// The largest peak resident set size of a replica, in MiB.
    pub replica_peak_rss_mib: f64,
    /// CPU the replica processes used, in microseconds per succeeded job.
    pub replica_cpu_us_per_job: f64,
    /// CPU the server backends of the bench database used, in microseconds per succeeded job
    /// (read from `/proc`, so only when the server runs on this host; 0 otherwise).
    pub server_cpu_us_per_job: f64,
}

impl Report {
    /// The report as a few aligned lines.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mode = match c.mode {
            Mode::BurnDown { jobs } => format!("burn-down of {jobs} jobs"),
            Mode::OfferedLoad { rate, duration_s } => {
                format!("offered load of {rate} jobs/s for {duration_s} s")
            }
            Mode::Recovery { trials } => format!("recovery from {trials} SIGKILLs"),
        };
        let p = |p: &Percentiles| {
            format!(
                "p50 {:.3}  p95 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3} ms",
                p.p50, p.p95, p.p99, p.p999, p.max
            )
        };
        let mut out = format!(
            "{mode}, {} replica(s) x {} slots, handler {:?}\n\
             succeeded            {} (not succeeded: {})\n\
             throughput           {:.0} jobs/s over {:.3} s\n\
             enqueue->start       {}\n",
            c.replicas,
            c.slots,
            c.handler,
            self.succeeded,
            self.not_succeeded,
            self.jobs_per_s,
            self.elapsed_s,
            p(&self.enqueue_to_start_ms),
        );
        if let Some(ack) = &self.ack_to_done_ms {
            out.push_str(&format!("ack->done            {}\n", p(ack)));
        }
        if let Some(recovery) = &self.recovery_ms {
            out.push_str(&format!("kill->reclaimed      {}\n", p(recovery)));
        }
        out.push_str(&format!(
            "round trips per job  {:.3} ({} claims, {} empty, {} group commits)\n\
             WAL per job          {:.0} bytes\n\
             CPU per job          replicas {:.1} us, server backends {:.1} us\n\
             replica peak RSS     {:.1} MiB\n",
            self.round_trips_per_job,
            self.claims,
            self.empty_claims,
            self.commit_batches,
            self.wal_bytes_per_job,
            self.replica_cpu_us_per_job,
            self.server_cpu_us_per_job,
            self.replica_peak_rss_mib,
        ));
        out
    }
}

/// Runs one bench on the server of `base`.
///
/// # Errors
/// [`Error::Config`] for a database name without the bench prefix or a bad URL;
/// [`Error::Unavailable`] when the server or a replica does not answer in time; database errors.
pub async fn run(base: &DatabaseConfig, config: BenchConfig) -> Result<Report, Error> {
    if !config.database.starts_with(DATABASE_PREFIX) {
        return Err(ConfigError::BenchDatabase.into());
    }
    let db_config = db::recreate_database(base, &config.database).await?;
    let outcome = measure(&db_config, &config).await;
    if !config.keep {
        db::drop_database(base, &config.database).await?;
    }
    outcome
}

/// Fills the queue (burn-down), starts the replicas, offers the load, waits for every job, and
/// reads the figures.
async fn measure(db_config: &DatabaseConfig, config: &BenchConfig) -> Result<Report, Error> {
    let mut client = db::connect(db_config, "bench").await?;
    crate::schema::migrate_up(&mut client).await?;
    let jobs = match config.mode {
        Mode::BurnDown { jobs } => jobs,
        Mode::OfferedLoad { rate, duration_s } => (rate * duration_s).round() as usize,
        Mode::Recovery { trials } => trials,
    };
    if let Mode::BurnDown { jobs } = config.mode {
        fill(&client, config.handler, jobs).await?;
        client.batch_execute("ANALYZE etl_job_records").await?;
    }
    let wal_start: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    let mut replicas = Replicas::start(db_config, config).await?;
    let (acks, recovery) = match config.mode {
        Mode::BurnDown { .. } => (None, None),
        Mode::OfferedLoad { rate, .. } => (
            Some(offer(&client, config.handler, jobs, rate).await?),
            None,
        ),
        Mode::Recovery { trials } => (
            None,
            Some(Percentiles::of(
                recoveries(db_config, &client, &mut replicas, trials).await?,
            )),
        ),
    };
    let waited = wait_until_done(&client).await;
    let server_cpu = server_cpu_seconds(&client).await?;
    let scraped = replicas.scrape().await;
    replicas.stop().await;
    waited?;
    let scraped = scraped?;
    let wal_bytes: f64 = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&wal_start],
        )
        .await?
        .get(0);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),
                    count(*) FILTER (WHERE status <> 'succeeded'),
                    coalesce(extract(epoch FROM max(finished_at) - min(started_at))::float8, 0)
               FROM etl_job_records",
            &[],
        )
        .await?;
    let (succeeded, not_succeeded, elapsed_s): (i64, i64, f64) =
        (row.get(0), row.get(1), row.get(2));
    let succeeded = u64::try_from(succeeded).unwrap_or(0);
    let latencies = client
        .query(
            "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000,
                    extract(epoch FROM finished_at)::float8, id::text
               FROM etl_job_records WHERE status = 'succeeded'",
            &[],
        )
        .await?;
    let enqueue_to_start = latencies.iter().map(|r| r.get::<_, f64>(0)).collect();
    let ack_to_done = acks.map(|acks| {
        Percentiles::of(
            latencies
                .iter()
                .filter_map(|r| {
                    let done: f64 = r.get(1);
                    acks.get(r.get::<_, &str>(2))
                        .map(|ack| (done - ack) * 1000.0)
                })
                .collect(),
        )
    });
    let per_job = |v: f64| {
        if succeeded == 0 {
            0.0
        } else {
            v / succeeded as f64
        }
    };
    Ok(Report {
        config: config.clone(),
        succeeded,
        not_succeeded: u64::try_from(not_succeeded).unwrap_or(0),
        elapsed_s,
        jobs_per_s: if elapsed_s > 0.0 {
            succeeded as f64 / elapsed_s
        } else {
            0.0
        },
        enqueue_to_start_ms: Percentiles::of(enqueue_to_start),
        ack_to_done_ms: ack_to_done,
        recovery_ms: recovery,
        round_trips_per_job: per_job(scraped.round_trips as f64),
        claims: scraped.claims,
        empty_claims: scraped.empty_claims,
        commit_batches: scraped.commit_batches,
        wal_bytes_per_job: per_job(wal_bytes),
        replica_peak_rss_mib: scraped.peak_rss_kib as f64 / 1024.0,
        replica_cpu_us_per_job: per_job(scraped.cpu_seconds * 1e6),
        server_cpu_us_per_job: per_job(server_cpu * 1e6),
    })
}

/// A throw-away secret and owner for the bench's ETL jobs.
fn bench_owner() -> Result<(Secret, [u8; 32]), Error> {
    let secret = Secret::new(uuid::Uuid::new_v4().simple().to_string().into_bytes())
        .ok_or(ConfigError::Secret)?;
    let owner = secret.digest(crate::digest::DigestKind::Principal, b"bench");
    Ok((secret, owner))
}

/// Inserts `jobs` due jobs in chunks (one statement each), before any replica runs.
async fn fill(
    client: &tokio_postgres::Client,
    handler: BenchHandler,
    jobs: usize,
) -> Result<(), Error> {
    let (secret, owner) = bench_owner()?;
    let mut done = 0;
    while done < jobs {
        let n = INSERT_CHUNK.min(jobs - done);
        match handler {
            BenchHandler::Noop => insert_noops(client, done, n).await?,
            BenchHandler::Etl => insert_loads(client, &secret, &owner, done, n).await?,
        };
        done += n;
    }
    Ok(())
}

/// Inserts `n` due `noop` jobs numbered from `first`, in one statement; returns their ids.
async fn insert_noops(
    client: &tokio_postgres::Client,
    first: usize,
    n: usize,
) -> Result<Vec<uuid::Uuid>, Error> {
    let (first, n) = (
        i64::try_from(first).unwrap_or(i64::MAX),
        i64::try_from(n).unwrap_or(0),
    );
    let rows = client
        .query(
            "INSERT INTO etl_job_records
                    (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                     request_payload)
             SELECT gen_random_uuid(), sha256('bench'::bytea), sha256(g::text::bytea),
                    sha256(g::text::bytea), $3, '{}'::jsonb
               FROM generate_series($1::int8, $1::int8 + $2::int8 - 1) AS g
             RETURNING id",
            &[&first, &n, &crate::handler::NOOP_KIND],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Enqueues `n` ETL loads numbered from `first` through the library's enqueue, in one statement.
async fn insert_loads(
    client: &tokio_postgres::Client,
    secret: &Secret,
    owner: &[u8; 32],
    first: usize,
    n: usize,
) -> Result<Vec<uuid::Uuid>, Error> {
    let requests = (first..first + n)
        .map(|job| {
            let records: Vec<serde_json::Value> = (0..RECORDS_PER_ETL_JOB)
                .map(|k| serde_json::json!({"id": format!("{job}-{k}"), "value": k}))
                .collect();
            let body = serde_json::json!({"dataset": "bench", "key": "id", "records": records});
            request::parse(&body, IntakeLimits::default())
                .map(|r| (job.to_string(), r))
                .map_err(Error::from)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let jobs: Vec<NewJob<'_>> = requests
        .iter()
        .map(|(key, request)| NewJob {
            idempotency_key: key,
            request,
            max_attempts: crate::etl::enqueue::MAX_ATTEMPTS_DEFAULT,
        })
        .collect();
    let enqueued = enqueue_many(client, secret, owner, &jobs).await?;
    Ok(enqueued.iter().map(|e| e.id).collect())
}

/// Times `trials` recoveries: each time an ETL job is enqueued whose first row another session
/// holds, so its load waits inside its effects; the replica running it is SIGKILLed; and the
/// time until a live replica claims it again is read from the database clock. The killed replica
/// is restarted only after that (its own restart would release the job at once).
async fn recoveries(
    db_config: &DatabaseConfig,
    client: &tokio_postgres::Client,
    replicas: &mut Replicas,
    trials: usize,
) -> Result<Vec<f64>, Error> {
    let (secret, owner) = bench_owner()?;
    let mut times = Vec::with_capacity(trials);
    for trial in 0..trials {
        // The job and its first target row are committed with the job deferred; then another
        // session locks that row, and only then does the job become due: its load must wait.
        let holder = db::connect(db_config, "bench").await?;
        holder.batch_execute("BEGIN").await?;
        let job = insert_loads(&holder, &secret, &owner, trial, 1).await?;
        let key = format!("{trial}-0");
        holder
            .execute(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
                 VALUES ($1, 'bench', $2, '{}', $3)",
                &[&owner.as_slice(), &key, &job.first()],
            )
            .await?;
        holder
            .execute(
                "UPDATE etl_job_records SET run_at = now() + interval '1 hour' WHERE id = $1",
                &[&job.first()],
            )
            .await?;
        holder.batch_execute("COMMIT; BEGIN").await?;
        holder
            .execute(
                "SELECT 1 FROM etl_target_rows WHERE owner_key = $1 AND record_key = $2 FOR UPDATE",
                &[&owner.as_slice(), &key],
            )
            .await?;
        client
            .execute(
                "UPDATE etl_job_records SET run_at = now() WHERE id = $1",
                &[&job.first()],
            )
            .await?;
        client
            .batch_execute("SELECT pg_notify('durable_etl_jobs', '')")
            .await?;
        let running = until_running(client, job.first(), None).await?;
        let victim = running
            .strip_prefix("bench-")
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(0);
        let killed_at: f64 = client
            .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
            .await?
            .get(0);
        replicas.kill(victim).await;
        let reclaimed_at = until_running(client, job.first(), Some(&running)).await?;
        let reclaimed_at: f64 = reclaimed_at.parse().unwrap_or(killed_at);
        times.push((reclaimed_at - killed_at) * 1000.0);
        drop(holder);
        replicas.restart(victim).await?;
    }
    Ok(times)
}

/// Waits (bounded) until `job` is running under an owner other than `not_owner`; returns that
/// owner (when `not_owner` is `None`) or the claim's start as Unix seconds (otherwise).
async fn until_running(
    client: &tokio_postgres::Client,
    job: Option<&uuid::Uuid>,
    not_owner: Option<&str>,
) -> Result<String, Error> {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let row = client
            .query_opt(
                "SELECT lease_owner_id, extract(epoch FROM started_at)::float8::text
                   FROM etl_job_records
                  WHERE id = $1 AND status = 'running' AND lease_owner_id IS DISTINCT FROM $2",
                &[&job, &not_owner],
            )
            .await?;
        if let Some(row) = row {
            return Ok(row.get(if not_owner.is_some() { 1 } else { 0 }));
        }
        if Instant::now() > deadline {
            return Err(Error::Unavailable(None));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Offers `jobs` jobs at `rate` per second, one autocommit INSERT each; returns each job's
/// commit-acknowledgement time (Unix seconds) by id.
async fn offer(
    client: &tokio_postgres::Client,
    handler: BenchHandler,
    jobs: usize,
    rate: f64,
) -> Result<std::collections::HashMap<String, f64>, Error> {
    let (secret, owner) = bench_owner()?;
    let mut acks = std::collections::HashMap::with_capacity(jobs);
    let start = Instant::now();
    for i in 0..jobs {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let ids = match handler {
            BenchHandler::Noop => insert_noops(client, i, 1).await?,
            BenchHandler::Etl => insert_loads(client, &secret, &owner, i, 1).await?,
        };
        let ack = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for id in ids {
            acks.insert(id.to_string(), ack);
        }
    }
    Ok(acks)
}

/// Waits until no job is pending or running, looking every [`DONE_POLL`] through the partial
/// indexes (cheap), for at most [`WAIT_LIMIT`].
async fn wait_until_done(client: &tokio_postgres::Client) -> Result<(), Error> {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let busy: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM etl_job_records WHERE status = 'pending')
                     OR EXISTS (SELECT 1 FROM etl_job_records WHERE status = 'running')",
                &[],
            )
            .await?
            .get(0);
        if !busy {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Unavailable(None));
        }
        tokio::time::sleep(DONE_POLL).await;
    }
}

/// What the replicas' metrics endpoints and `/proc` said at the end.
#[derive(Debug, Default)]
struct Scraped {
    /// Sum of `durable_etl_db_round_trips_total`.
    round_trips: u64,
    /// Sum of `durable_etl_claims_total`.
    claims: u64,
    /// Sum of `durable_etl_claims_empty_total`.
    empty_claims: u64,
    /// Sum of `durable_etl_commit_batch_size_count`.
    commit_batches: u64,
    /// The largest `VmHWM` of a replica, in KiB.
    peak_rss_kib: u64,
    /// CPU seconds the replicas used.
    cpu_seconds: f64,
}

/// The replica processes of a run and their metrics addresses.
struct Replicas {
    /// `(process, metrics address)` per replica.
    children: Vec<(Child, String)>,
    /// The bench database's URL.
    url: String,
    /// Slots per replica.
    slots: usize,
}

impl Replicas {
    /// Starts `config.replicas` replicas of this binary on `db_config`, and waits until each one's
    /// session is up.
    async fn start(db_config: &DatabaseConfig, config: &BenchConfig) -> Result<Replicas, Error> {
        let mut replicas = Replicas {
            children: Vec::new(),
            url: db_config.url.clone(),
            slots: config.slots,
        };
        for i in 0..config.replicas {
            let replica = replicas.spawn(i)?;
            replicas.children.push(replica);
        }
        for i in 0..config.replicas {
            replicas.until_up(i).await?;
        }
        Ok(replicas)
    }

    /// Spawns replica `i` (owner id `bench-{i}`) on a fresh metrics address.
    fn spawn(&self, i: usize) -> Result<(Child, String), Error> {
        let exe = std::env::current_exe().map_err(|_| Error::Unavailable(None))?;
        let addr = free_local_addr()?;
        let child = Command::new(&exe)
            .env("DATABASE_URL", &self.url)
            .env("RUST_LOG", "warn")
            .args(["work", "--owner-id", &format!("bench-{i}")])
            .args(["--slots", &self.slots.to_string()])
            .args(["--metrics-listen", &addr])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|_| Error::Unavailable(None))?;
        Ok((child, addr))
    }

    /// Waits (bounded) until replica `i`'s session is up.
    async fn until_up(&self, i: usize) -> Result<(), Error> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + WAIT_LIMIT;
        let addr = self
            .children
            .get(i)
            .map(|c| c.1.as_str())
            .unwrap_or_default();
        loop {
            let up = metrics_of(&http, addr)
                .await
                .is_some_and(|m| value(&m, "durable_etl_session_up") == 1);
            if up {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Unavailable(None));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs replica `i` and reaps it.
    async fn kill(&mut self, i: usize) {
        if let Some((child, _)) = self.children.get_mut(i) {
            let _ = child.kill().await;
        }
    }

    /// Starts replica `i` again (same owner id) and waits until it is up.
    async fn restart(&mut self, i: usize) -> Result<(), Error> {
        let restarted = self.spawn(i)?;
        if let Some(slot) = self.children.get_mut(i) {
            *slot = restarted;
        }
        self.until_up(i).await
    }

    /// Reads every replica's counters and peak RSS.
    async fn scrape(&self) -> Result<Scraped, Error> {
        let http = reqwest::Client::new();
        let mut scraped = Scraped::default();
        for (child, addr) in &self.children {
            let metrics = metrics_of(&http, addr)
                .await
                .ok_or(Error::Unavailable(None))?;
            scraped.round_trips += value(&metrics, "durable_etl_db_round_trips_total");
            scraped.claims += value(&metrics, "durable_etl_claims_total");
            scraped.empty_claims += value(&metrics, "durable_etl_claims_empty_total");
            scraped.commit_batches += value(&metrics, "durable_etl_commit_batch_size_count");
            let hwm = child.id().map_or(0, peak_rss_kib);
            scraped.peak_rss_kib = scraped.peak_rss_kib.max(hwm);
            scraped.cpu_seconds += child.id().map_or(0.0, cpu_seconds);
        }
        Ok(scraped)
    }

    /// Stops every replica the way an orchestrator would: SIGTERM, then SIGKILL if it has not
    /// ended within [`STOP_GRACE`].
    async fn stop(&mut self) {
        for (child, _) in &mut self.children {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            if tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// A free loopback address to give a replica's metrics endpoint.
fn free_local_addr() -> Result<String, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|_| ConfigError::Listen)?;
    let addr = listener.local_addr().map_err(|_| ConfigError::Listen)?;
    Ok(addr.to_string())
}

/// The Prometheus text a replica serves, if it answers.
async fn metrics_of(http: &reqwest::Client, addr: &str) -> Option<String> {
    let response = http
        .get(format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.text().await.ok()
}

/// The sum of the samples of metric `name` (every label set) in Prometheus `text`.
fn value(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// CPU seconds (user + system) process `pid` has used so far (0 when unreadable). Assumes the
/// usual 100 clock ticks per second.
fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name (which may hold spaces) start at the state field.
            let after_name = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after_name.split_whitespace().collect();
            let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
            Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
        })
        .unwrap_or(0.0)
}

/// CPU seconds used by the server backends connected to the bench database, the bench's own
/// session excepted (0 each when
/// `/proc` cannot show them: a server on another host).
async fn server_cpu_seconds(client: &tokio_postgres::Client) -> Result<f64, Error> {
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| u32::try_from(r.get::<_, i32>(0)).ok())
        .map(cpu_seconds)
        .sum())
}

/// The peak resident set size (`VmHWM`) of process `pid`, in KiB (0 when unreadable).
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sample: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = Percentiles::of(sample);
        assert_eq!(
            (p.p50, p.p95, p.p99, p.p999, p.max),
            (500.0, 950.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }

    #[test]
    fn metric_values_sum_every_label_set_of_exactly_that_name() {
        let text =
            "# HELP x\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3\nfoo_total_x 9\nfoo_total 1\n";
        assert_eq!(value(text, "foo_total"), 6);
        assert_eq!(value(text, "bar"), 0);
    }
}
