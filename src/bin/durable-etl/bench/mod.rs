//! `durable-etl bench`: end-to-end figures of real replicas (child processes of this binary)
//! against a throw-away database, in seven modes.
//!
//! - **Burn-down**: `jobs` due jobs are inserted before any replica starts; the replicas then
//!   drain them. Throughput = jobs / (last `finished_at` − first `started_at`), database clock, so
//!   process start-up and the inserts are not timed (the peers' harness times the same span).
//! - **Offered load**: idle replicas first; then `producers` tasks on their own connections
//!   offer `rate` jobs/s open-loop by the clock for `duration`, `batch` jobs per autocommit
//!   statement (`producers`), and the figures describe pickup latency, among them
//!   acknowledgement → handler start as the replicas record it (`starts`), beside the rate the
//!   producers achieved and how late they sent (a missed rate is flagged, never hidden).
//! - **Depth target**: idle replicas first; then the same producers keep `depth` due jobs queued
//!   for `duration`, topping the backlog up by bulk enqueues (`depth`), and the figures are the
//!   offered load's beside the depth held and the throughput within the window (a depth not held
//!   is flagged like a missed rate).
//! - **Saturated**: every queue that takes jobs keeps a backlog of due jobs for `duration`
//!   (`saturate`); the queue figures count completions within that window.
//! - **Recovery**: SIGKILLs of the replica running a job, timed until a live one runs it again.
//! - **Schedules**: recurring schedules firing every second on otherwise idle replicas: fire
//!   lateness, misses, transactions and rows per fire, and what an idle tick costs beside many
//!   schedules never due (`schedules`, whose figures replace the job figures).
//! - **Dead letters**: bulk replays of dead letters, from their retained payloads and with their
//!   bodies sent again, the jobs they made then run to success; and pages of the letters' listing
//!   over a large history (`dead_letters`, `letter_pages`, whose figures replace the job figures).
//!
//! Server CPU per job is the CPU of the server's processes over the measured window, sampled every
//! 100 ms from `/proc` and split into the replicas' backends, the producers' backends and the
//! server's own processes (`server_cpu`): from just before the replicas start draining (after the
//! fill) or the producers' schedule starts, until the jobs are done. It and every other per-job
//! figure are per job ended: succeeded, or failed in a burn-down of failing jobs (`--fail`).
//!
//! Every mode spreads its `noop` jobs over the queues and priorities of its [`shape::Shape`]
//! (`--queues`, `--hot-queue`, `--weights`, `--priority-mix`, `--cap`, `--job-ms`), and
//! burn-down and saturated runs report the queue figures of #25's targets (`figures`).
//!
//! Invariants this module keeps:
//! - It only ever touches the database it creates (`--bench-database`), which it drops at the
//!   end unless told to keep it; it refuses to run against a name that is not its own prefix,
//!   and never drops a database of that name that it did not create or that is in use, such as
//!   another bench's (`durable_etl::db::recreate_database`).
//! - Every figure comes from the database (timestamps, WAL position), from the replicas' own
//!   metrics endpoints or from the handler starts they recorded, never from the bench's guess
//!   about what the replicas did; the offered rate and lag come from the producers' own clock.
//! - Every wait is bounded; replicas are killed when the bench ends, whatever happened.

mod citus;
pub(crate) mod config;
mod dead_letters;
mod depth;
mod figures;
pub(crate) mod html;
mod keys;
mod letter_pages;
mod load;
mod percentiles;
mod producers;
mod replicas;
mod report;
mod saturate;
mod schedules;
mod server_cpu;
pub(crate) mod shape;
pub(crate) mod starts;
pub(crate) mod sweep;
mod text;
mod tuples;

use config::WAIT_LIMIT;
pub(crate) use config::{database_name, BenchConfig, BenchHandler, Mode, DATABASE_PREFIX};
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::db;
use durable_etl::error::Error;
use load::{fill, recoveries};
pub(crate) use percentiles::Percentiles;
use replicas::Replicas;
pub(crate) use report::Report;
use saturate::{saturate, until_done, AgingWatch};
use server_cpu::{Sampler, ServerCpu};
use starts::per_job;
use std::time::Duration;

/// Runs one bench on the server of `base`.
///
/// # Errors
/// [`Error::Config`] for a database name without the bench prefix or a bad URL;
/// [`Error::DatabaseTaken`] for the name of a database the bench did not create or one in use;
/// [`Error::Io`] when a replica cannot be started, or does not answer or finish its jobs in time;
/// [`Error::Unavailable`] when the server does not answer; database errors.
pub(crate) async fn run(base: &DatabaseConfig, config: BenchConfig) -> Result<Report, Error> {
    if !config.database.starts_with(DATABASE_PREFIX) {
        return Err(ConfigError::BenchDatabase.into());
    }
    if config.citus {
        citus::check(base, &config.mode)?;
    }
    let created = db::recreate_database(base, &config.database, "bench", "bench").await?;
    let cluster = match config.citus {
        true => Some(citus::join(base, &created, &config.database).await?),
        false => None,
    };
    let outcome = match config.mode {
        _ if cluster.is_some() => on_citus(created.config.clone(), &config).await,
        Mode::Schedules { .. } => schedules::measure(&created.config, created.session, &config)
            .await
            .map(|figures| Report::of_schedules(&config, figures)),
        Mode::DeadLetters { .. } => {
            dead_letters::measure(&created.config, created.session, &config)
                .await
                .map(|figures| Report::of_dead_letters(&config, figures))
        }
        _ => measure(&created.config, created.session, &config).await,
    };
    if config.keep {
        eprintln!("kept the bench database {}", config.database);
    } else {
        db::drop_created(base, &config.database, created.oid).await?;
        if let Some(cluster) = &cluster {
            cluster.drop_all(&config.database).await?;
        }
    }
    outcome
}

/// The bench on Citus (`citus`): migrates the cell of `coordinator` (the bench database on the
/// coordinator) through it, then measures on the worker that holds the cell.
async fn on_citus(coordinator: DatabaseConfig, config: &BenchConfig) -> Result<Report, Error> {
    durable_etl::schema::migrate(&coordinator).await?;
    if let Some(worker) = config.citus_worker {
        citus::place(&coordinator, worker).await?;
    }
    let node = db::citus::find_node(&coordinator).await?;
    let session = db::connect(&node, "bench").await?;
    db::check_cell(&session, &node).await?;
    let address: (String, i32) = session
        .query_one(
            "SELECT coalesce(host(inet_server_addr()), ''), inet_server_port()",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))?;
    eprintln!(
        "the cell runs on the Citus node {}:{}",
        address.0, address.1
    );
    measure(&node, session, config).await
}

/// Fills the queue (burn-down), starts the replicas, offers the load, waits for every job, and
/// reads the figures; `client` is the bench's session on the database of `db_config`.
async fn measure(
    db_config: &DatabaseConfig,
    mut client: tokio_postgres::Client,
    config: &BenchConfig,
) -> Result<Report, Error> {
    // On Citus the cell was migrated through the coordinator (`on_citus`).
    if !config.citus {
        durable_etl::schema::migrate_session(&mut client, db_config).await?;
    }
    let jobs = match config.mode {
        Mode::BurnDown { jobs } => jobs,
        Mode::OfferedLoad {
            rate, duration_s, ..
        } => (rate * duration_s).round() as usize,
        Mode::Recovery { trials } => 2 * trials,
        Mode::DepthTarget { .. } | Mode::Schedules { .. } | Mode::DeadLetters { .. } => 0,
        Mode::Saturated { backlog, .. } => {
            backlog
                * if config.shape.hot_queue {
                    1
                } else {
                    config.shape.queues
                }
        }
    };
    let writers = if matches!(config.mode, Mode::BurnDown { .. } | Mode::Saturated { .. }) {
        let writers = fill(&client, config.handler, (0, jobs), &config.shape).await?;
        client.batch_execute("ANALYZE etl_job_records").await?;
        writers
    } else {
        load::Writers::new()
    };
    if let Some(cap) = config.shape.cap {
        for name in config.shape.names() {
            durable_etl::queue::set_cap(&client, &name, Some(cap)).await?;
        }
    }
    if let Some(cap) = config.shape.key_cap {
        for name in config.shape.names() {
            durable_etl::queue::set_key_cap(&client, &name, Some(cap)).await?;
        }
    }
    let mut aging = (!config.shape.priority_mix.is_empty()).then(|| AgingWatch::new(writers));
    let updates_start = tuples::live_row_updates(&client).await?;
    let wal_start: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    // The server CPU window begins just before the replicas start draining a filled queue, or,
    // for the modes with producers, once they are connected and before their schedule starts.
    let own_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let producing = matches!(
        config.mode,
        Mode::OfferedLoad { .. } | Mode::DepthTarget { .. }
    );
    let mut sampler = None;
    if !producing {
        let tops_up = matches!(config.mode, Mode::Saturated { .. });
        sampler = Some(Sampler::start(db_config, own_pid, tops_up).await?);
    }
    let mut replicas = Replicas::start(db_config, config).await?;
    let started = tokio::time::Instant::now();
    let (mut window, mut offered, mut held) = (None, None, None);
    let mut numbers = std::collections::HashMap::new();
    let (acks, recovery) = match config.mode {
        Mode::BurnDown { .. } | Mode::Schedules { .. } | Mode::DeadLetters { .. } => (None, None),
        Mode::Saturated {
            backlog,
            duration_s,
        } => {
            let load = (backlog, Duration::from_secs_f64(duration_s));
            let shape = &config.shape;
            window = Some(saturate(&client, shape, load, jobs, aging.as_mut()).await?);
            (None, None)
        }
        Mode::OfferedLoad {
            rate,
            duration_s,
            producers,
            batch,
        } => {
            let duration = Duration::from_secs_f64(duration_s);
            let plan = producers::Plan {
                pace: producers::Pace::Clock { jobs, rate },
                duration,
                producers,
                batch,
            };
            let clients = producers::connect(db_config, producers).await?;
            sampler = Some(Sampler::start(db_config, own_pid, false).await?);
            let offer = producers::offer(clients, config.handler, plan, &config.shape).await?;
            (offered, numbers) = (offer.rate, offer.numbers);
            (Some(offer.acks), None)
        }
        Mode::DepthTarget {
            depth,
            duration_s,
            producers,
            batch,
        } => {
            let plan = producers::Plan {
                pace: producers::Pace::Depth { depth },
                duration: Duration::from_secs_f64(duration_s),
                producers,
                batch,
            };
            let from: f64 = client
                .query_one("SELECT extract(epoch FROM now())::float8", &[])
                .await?
                .get(0);
            let clients = producers::connect(db_config, producers).await?;
            sampler = Some(Sampler::start(db_config, own_pid, false).await?);
            let offer = producers::offer(clients, config.handler, plan, &config.shape).await?;
            held = offer.depth.map(|d| (d, (from, from + duration_s)));
            numbers = offer.numbers;
            (Some(offer.acks), None)
        }
        Mode::Recovery { trials } => {
            let times = recoveries(db_config, &client, &mut replicas, trials).await?;
            (
                None,
                Some((
                    Percentiles::of(times.effects),
                    Percentiles::of(times.compute),
                )),
            )
        }
    };
    let waited = until_done(&client, aging.as_mut(), WAIT_LIMIT).await;
    let server_cpu = match sampler {
        Some(sampler) => sampler.stop().await?,
        None => server_cpu::Split::default(),
    };
    let scraped = replicas.scrape().await;
    let lifetime_s = started.elapsed().as_secs_f64();
    replicas.stop().await;
    let handler_starts = replicas.handler_starts();
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
                    coalesce(extract(epoch FROM max(finished_at) - min(started_at))::float8, 0),
                    count(*) FILTER (WHERE status = 'failed')
               FROM etl_jobs",
            &[],
        )
        .await?;
    let (succeeded, not_succeeded, elapsed_s, failed): (i64, i64, f64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let succeeded = u64::try_from(succeeded).unwrap_or(0);
    // The per-job figures are per job ended: succeeded, or failed (a burn-down of `--fail` jobs).
    let ended = succeeded + u64::try_from(failed).unwrap_or(0);
    let latencies = client
        .query(
            "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000,
                    extract(epoch FROM finished_at)::float8, id::text,
                    extract(epoch FROM created_at)::float8
               FROM etl_jobs WHERE status = 'succeeded'",
            &[],
        )
        .await?;
    let enqueue_to_start: Vec<f64> = latencies.iter().map(|r| r.get::<_, f64>(0)).collect();
    let done: Vec<(String, f64)> = latencies.iter().map(|r| (r.get(2), r.get(1))).collect();
    // The producers' succeeded jobs by number, with their enqueue -> start, for `keys`.
    let numbered: Vec<(usize, f64)> = latencies
        .iter()
        .filter_map(|r| Some((*numbers.get(r.get::<_, &str>(2))?, r.get(0))))
        .collect();
    let all_starts: std::collections::HashMap<String, f64> = handler_starts
        .iter()
        .flat_map(|starts| starts.iter().map(|(id, at)| (id.clone(), *at)))
        .collect();
    let queues = match config.mode {
        Mode::BurnDown { .. } | Mode::Saturated { .. } => {
            let ended = figures::ended(&client, &config.shape).await?;
            let first = ended
                .iter()
                .map(|j| j.started_at)
                .fold(f64::INFINITY, f64::min);
            let last = figures::while_all_busy(&ended, &config.shape);
            let inputs = figures::Inputs {
                shape: &config.shape,
                window: window.as_ref().map_or((first, last), |w| w.0),
                fewest_due: window.as_ref().map(|w| w.1.as_slice()),
                replicas: config.replicas,
                lifetime_s,
                claims: (scraped.claims, scraped.drain_claims),
                aging_writes: aging.as_ref().map(AgingWatch::count),
                live_row_updates: tuples::live_row_updates(&client).await? - updates_start,
                starts: &all_starts,
            };
            Some(figures::figures(&ended, &inputs))
        }
        _ => None,
    };
    let depth = held.map(|(figures, (from, to))| {
        let completed = done
            .iter()
            .filter(|(_, at)| (from..to).contains(at))
            .count();
        figures.with_completed(completed as u64)
    });
    let jobs = acks.map(|acks| per_job(&done, &acks, &all_starts));
    let ack_to_done = jobs
        .as_ref()
        .map(|jobs| Percentiles::of(jobs.iter().map(|j| j.ack_to_done).collect()));
    let ack_to_start = jobs.as_ref().and_then(|jobs| {
        let sample: Vec<f64> = jobs.iter().filter_map(|j| j.ack_to_start).collect();
        (!sample.is_empty()).then(|| Percentiles::of(sample))
    });
    let ack_to_start_ms: Vec<f64> = jobs
        .iter()
        .flatten()
        .filter_map(|j| j.ack_to_start)
        .collect();
    let timeline = report::Timeline {
        latency_label: if ack_to_start_ms.is_empty() {
            "enqueue->start"
        } else {
            "ack->start"
        },
        latencies_ms: if ack_to_start_ms.is_empty() {
            enqueue_to_start.clone()
        } else {
            ack_to_start_ms
        },
        created: latencies.iter().map(|r| r.get(3)).collect(),
        finished: done.iter().map(|d| d.1).collect(),
        starts_by_replica: handler_starts
            .iter()
            .map(|starts| starts.values().copied().collect())
            .collect(),
    };
    let per_job = |v: f64| {
        if ended == 0 {
            0.0
        } else {
            v / ended as f64
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
        ack_to_start_ms: ack_to_start,
        offered,
        depth,
        per_job_ms: jobs,
        recovery_effects_ms: recovery.map(|r| r.0),
        recovery_compute_ms: recovery.map(|r| r.1),
        round_trips_per_job: per_job(scraped.round_trips as f64),
        claims: scraped.claims,
        empty_claims: scraped.empty_claims,
        commit_batches: scraped.commit_batches,
        claims_per_job: per_job(scraped.claims as f64),
        empty_claims_per_job: per_job(scraped.empty_claims as f64),
        commits_per_job: per_job(scraped.commit_batches as f64),
        wal_bytes_per_job: per_job(wal_bytes),
        replica_peak_rss_mib: scraped.peak_rss_kib as f64 / 1024.0,
        replica_cpu_us_per_job: per_job(scraped.cpu_seconds * 1e6),
        server_cpu: ServerCpu::per_job(server_cpu, ended),
        queues,
        keys: keys::figures(&client, &config.shape, &numbered).await?,
        schedules: None,
        dead_letters: None,
        timeline,
    })
}
