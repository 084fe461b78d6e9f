//! The server's CPU over a bench's measured window, counted the way the peers' harness counts it
//! (`../shared/peers/lib/pgcpu.py`), so that our server CPU per job and theirs are like for like.
//!
//! A [`Sampler`] started just before the window (before the replicas start draining a filled
//! queue, or once the producers are connected and before their schedule starts) reads, every
//! [`INTERVAL`], `utime + stime` (`/proc/<pid>/stat`) of every child of the postmaster, and the
//! pids of the producers' sessions (`pg_stat_activity`, [`PRODUCER_ROLE`]); stopped when the jobs
//! are done, it takes one last sample. The postmaster is the parent of the sampler's own
//! backend (`pg_backend_pid()`); its children are listed by `/proc/<pm>/task/<pm>/children`, or by
//! a scan of `/proc` where the kernel lacks that file.
//!
//! Each process is keyed by (pid, start time), so a reused pid is a new process. One present at
//! the first sample (or started before it) counts its last reading − its first; one started in
//! the window counts its last reading − 0 (all of its CPU is the window's); so a backend that
//! exits within the window still counts up to its last sample (at most [`INTERVAL`] is lost).
//! The classes ([`Split`]), from the process title (`/proc/<pid>/cmdline`, re-read until known):
//!
//! - `replicas`: this database's backends that are not the producers' nor the bench's own (the
//!   replicas' pools, claim, commit and LISTEN sessions);
//! - `producers`: this database's backends of the bench's producers (offered load, depth target),
//!   or the bench's own session in a saturated run, whose top-ups it sends;
//! - `aux`: the server's own processes, attached to no client (checkpointer, background writer,
//!   walwriter, autovacuum launcher and workers, parallel and logical replication workers, …);
//! - `other`: other databases' backends, walsenders and titles never readable: reported, never
//!   counted;
//! - the bench's own sessions (its client, except in a saturated run, and the sampler's) and the
//!   postmaster: not counted.
//!
//! The figure comparable with the peers' "peer" server CPU is replicas + producers + aux. A
//! server on another host (no `/proc` entry for it here) gives zeros.

use durable_etl::config::DatabaseConfig;
use durable_etl::db;
use durable_etl::error::Error;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How often the sampler reads `/proc` (the peers' harness reads every 100 ms).
const INTERVAL: Duration = Duration::from_millis(100);

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's `USER_HZ`, 100 on every
/// mainstream architecture (the crate forbids the `unsafe` a `sysconf` call would need).
const TICKS_PER_S: f64 = 100.0;

/// The role (`application_name` `durable-etl/bench-producer`) of the producers' sessions.
pub(super) const PRODUCER_ROLE: &str = "bench-producer";

/// The role of the sampler's own session.
const SAMPLER_ROLE: &str = "bench-sampler";

/// The server's own processes, by the start of their title (after `postgres: ` and the cluster
/// name): the peers' list.
const AUX_PREFIXES: &[&str] = &[
    "autovacuum worker",
    "autovacuum launcher",
    "parallel worker",
    "logical replication worker",
    "logical replication launcher",
    "checkpointer",
    "background writer",
    "walwriter",
    "archiver",
    "startup",
    "stats collector",
    "walreceiver",
    "bgworker:",
];

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// The parent's pid.
    ppid: u32,
    /// When it started, in clock ticks since boot.
    start: u64,
    /// CPU used so far (user + system), in clock ticks.
    cpu: u64,
}

/// Parses the text of `/proc/<pid>/stat` (`None` if it is not one).
fn parse_stat(text: &str) -> Option<Stat> {
    // The fields after the command name (which may hold spaces and parentheses) start at the
    // state, the third field.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Stat {
        ppid: u32::try_from(field(1)?).ok()?,
        start: field(19)?,
        cpu: field(11)?.checked_add(field(12)?)?,
    })
}

/// What a process title (its `cmdline`, NULs as spaces) says the process is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Title {
    /// One of the server's own processes ([`AUX_PREFIXES`], or any title that is not a
    /// backend's).
    Aux,
    /// A client backend connected to this database.
    Backend(String),
    /// A walsender.
    Walsender,
}

/// What `title` says the process is; `None` while it is not a server process's title yet (a
/// fresh fork still shows the postmaster's command line).
fn parse_title(title: &str) -> Option<Title> {
    let rest = title.trim().strip_prefix("postgres: ")?;
    // Drop the cluster name, if the title has one (`postgres: 15/main: checkpointer`).
    let rest = rest.rsplit(": ").next().unwrap_or(rest).trim();
    if AUX_PREFIXES.iter().any(|p| rest.starts_with(p)) {
        return Some(Title::Aux);
    }
    let tokens: Vec<&str> = rest.split_whitespace().collect();
    if tokens.first() == Some(&"walsender") {
        return Some(Title::Walsender);
    }
    // A backend: `user database host(port) state` or `user database [local] state`.
    match tokens.as_slice() {
        [_, database, host, ..] if *host == "[local]" || host.ends_with(')') => {
            Some(Title::Backend((*database).to_owned()))
        }
        _ => Some(Title::Aux),
    }
}

/// CPU seconds over the window, per class (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Split {
    /// This database's backends other than the producers' and the bench's own.
    pub(super) replicas: f64,
    /// The producers' backends.
    pub(super) producers: f64,
    /// The server's own processes.
    pub(super) aux: f64,
    /// Other databases' backends, walsenders and unreadable titles (not counted).
    pub(super) other: f64,
}

/// One process seen in the window.
#[derive(Debug)]
struct Process {
    /// Its CPU when first seen (0 if it started in the window), in ticks.
    first: u64,
    /// Its CPU when last seen, in ticks.
    last: u64,
    /// What its title says, once readable.
    title: Option<Title>,
    /// Whether it is one of the bench's own sessions.
    own: bool,
    /// Whether `pg_stat_activity` showed it as a producer's session.
    producer: bool,
}

/// The processes of one window, as the samples found them.
#[derive(Debug)]
struct Window {
    /// The bench database's name.
    database: String,
    /// The bench's own sessions' pids (its client's and the sampler's).
    own: HashSet<u32>,
    /// When the window began, in ticks since boot.
    began: u64,
    /// Samples taken.
    samples: usize,
    /// Every process seen, by (pid, start time).
    processes: HashMap<(u32, u64), Process>,
}

impl Window {
    /// A window on `database`'s server beginning `began` ticks after boot, `own` the bench's own
    /// sessions.
    fn new(database: &str, own: HashSet<u32>, began: u64) -> Window {
        Window {
            database: database.to_owned(),
            own,
            began,
            samples: 0,
            processes: HashMap::new(),
        }
    }

    /// Records one sample: the postmaster's `children` read now, the producers' session pids
    /// read just before, and `title` to read a process's title while it is not known.
    fn record(
        &mut self,
        children: &[(u32, Stat)],
        producers: &HashSet<u32>,
        title: impl Fn(u32) -> Option<String>,
    ) {
        let initial = self.samples == 0;
        self.samples += 1;
        for &(pid, stat) in children {
            let began = self.began;
            let process = self
                .processes
                .entry((pid, stat.start))
                .or_insert_with(|| Process {
                    first: if initial || stat.start < began {
                        stat.cpu
                    } else {
                        0
                    },
                    last: stat.cpu,
                    title: None,
                    own: false,
                    producer: false,
                });
            process.last = process.last.max(stat.cpu);
            if process.title.is_none() {
                process.title = title(pid).as_deref().and_then(parse_title);
            }
            process.own |= self.own.contains(&pid);
            process.producer |= producers.contains(&pid);
        }
    }

    /// CPU seconds per class over the window.
    fn split(&self) -> Split {
        // Whole ticks per class (replicas, producers, aux, other), summed exactly in any order.
        let mut ticks = [0u64; 4];
        for process in self.processes.values() {
            let class = match &process.title {
                Some(Title::Aux) => 2,
                Some(Title::Backend(database)) if *database == self.database => {
                    if process.own {
                        continue;
                    } else if process.producer {
                        1
                    } else {
                        0
                    }
                }
                Some(Title::Backend(_) | Title::Walsender) | None => 3,
            };
            ticks[class] += process.last.saturating_sub(process.first);
        }
        let [replicas, producers, aux, other] = ticks.map(|t| t as f64 / TICKS_PER_S);
        Split {
            replicas,
            producers,
            aux,
            other,
        }
    }
}

/// The figures of a window's [`Split`], per succeeded job (the JSON's `server_cpu_*` fields).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct ServerCpu {
    /// Replicas + producers + aux, in microseconds per succeeded job: the peers' "peer" server
    /// CPU. Before #26 this counted only the replicas' backends still connected at the end.
    pub(crate) server_cpu_us_per_job: f64,
    /// The replicas' backends.
    pub(crate) server_cpu_replicas_us_per_job: f64,
    /// The producers' backends (their inserts, the enqueue trigger, their commits).
    pub(crate) server_cpu_producers_us_per_job: f64,
    /// The server's own processes (walwriter, checkpointer, autovacuum, …).
    pub(crate) server_cpu_aux_us_per_job: f64,
    /// Other databases' backends and walsenders: reported, not in `server_cpu_us_per_job`.
    pub(crate) server_cpu_other_us_per_job: f64,
}

impl ServerCpu {
    /// `split` per `jobs` succeeded jobs (all 0 for none).
    pub(super) fn per_job(split: Split, jobs: u64) -> ServerCpu {
        let per_job = |s: f64| {
            if jobs == 0 {
                0.0
            } else {
                s * 1e6 / jobs as f64
            }
        };
        ServerCpu {
            server_cpu_us_per_job: per_job(split.replicas + split.producers + split.aux),
            server_cpu_replicas_us_per_job: per_job(split.replicas),
            server_cpu_producers_us_per_job: per_job(split.producers),
            server_cpu_aux_us_per_job: per_job(split.aux),
            server_cpu_other_us_per_job: per_job(split.other),
        }
    }

    /// The split as one line of the text report.
    pub(super) fn to_text(self) -> String {
        format!(
            "server CPU per job   {:.1} us (replicas {:.1}, producers {:.1}, aux {:.1}; \
             other databases {:.1}, not counted)\n",
            self.server_cpu_us_per_job,
            self.server_cpu_replicas_us_per_job,
            self.server_cpu_producers_us_per_job,
            self.server_cpu_aux_us_per_job,
            self.server_cpu_other_us_per_job,
        )
    }
}

/// `/proc/<pid>/stat` of `pid`, parsed.
fn stat_of(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds (user + system) process `pid` has used so far (0 when unreadable): what the
/// replicas' processes cost (`replicas`).
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    stat_of(pid).map_or(0.0, |stat| stat.cpu as f64 / TICKS_PER_S)
}

/// `pid`'s title (`/proc/<pid>/cmdline`, NULs as spaces).
fn title_of(pid: u32) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&bytes).replace('\0', " "))
}

/// The children of postmaster `pm` and their stats, read now.
fn children_of(pm: u32) -> Vec<(u32, Stat)> {
    let listed = std::fs::read_to_string(format!("/proc/{pm}/task/{pm}/children"));
    let pids: Vec<u32> = match listed {
        Ok(text) => text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
        Err(_) => std::fs::read_dir("/proc")
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    pids.into_iter()
        .filter_map(|pid| Some((pid, stat_of(pid)?)))
        .filter(|(_, stat)| stat.ppid == pm)
        .collect()
}

/// Seconds since boot, in clock ticks (`/proc/uptime`).
fn uptime_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((seconds * TICKS_PER_S) as u64)
}

/// The pids of this database's producer sessions, read on `client`.
async fn producer_pids(client: &tokio_postgres::Client) -> Result<HashSet<u32>, Error> {
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = $1",
            &[&format!("durable-etl/{PRODUCER_ROLE}")],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| u32::try_from(r.get::<_, i32>(0)).ok())
        .collect())
}

/// Samples the server's CPU over a window, on a task of its own (see the module doc).
pub(super) struct Sampler {
    /// Ends the window; dropped, it ends it too.
    stop: oneshot::Sender<()>,
    /// The sampling task; `None` when `/proc` cannot show the server (its figures are zeros).
    task: Option<JoinHandle<Result<Split, Error>>>,
}

impl Sampler {
    /// Begins a window on `db_config`'s server, taking its first sample before it returns.
    /// `bench_pid` is the bench client's backend: not counted, unless `bench_enqueues` (the
    /// saturated run tops its queues up from it), when it counts as a producer's.
    ///
    /// # Errors
    /// Connection and statement errors of the sampler's session.
    pub(super) async fn start(
        db_config: &DatabaseConfig,
        bench_pid: i32,
        bench_enqueues: bool,
    ) -> Result<Sampler, Error> {
        let client = db::connect(db_config, SAMPLER_ROLE).await?;
        let row = client
            .query_one("SELECT pg_backend_pid(), current_database()", &[])
            .await?;
        let (pid, database): (i32, String) = (row.get(0), row.get(1));
        let pid = u32::try_from(pid).unwrap_or(0);
        // The server runs here only if this pid is a backend of this very database; a local
        // process that merely has the same pid as a remote backend is not one.
        let local = title_of(pid)
            .as_deref()
            .and_then(parse_title)
            .is_some_and(|t| t == Title::Backend(database.clone()));
        let (stop, stopped) = oneshot::channel();
        let (Some(pm), Some(began), true) = (stat_of(pid).map(|s| s.ppid), uptime_ticks(), local)
        else {
            return Ok(Sampler { stop, task: None });
        };
        let bench = u32::try_from(bench_pid).unwrap_or(0);
        let (own, enqueuer) = if bench_enqueues {
            ([pid].into(), Some(bench))
        } else {
            ([pid, bench].into(), None)
        };
        let mut window = Window::new(&database, own, began);
        let mut producers = producer_pids(&client).await?;
        producers.extend(enqueuer);
        window.record(&children_of(pm), &producers, title_of);
        let task = tokio::spawn(sample(client, (pm, enqueuer), window, stopped));
        Ok(Sampler {
            stop,
            task: Some(task),
        })
    }

    /// Ends the window (one last sample) and returns its CPU seconds per class.
    ///
    /// # Errors
    /// The sampler's statement errors; [`Error::Internal`] if its task panicked.
    pub(super) async fn stop(self) -> Result<Split, Error> {
        let _ = self.stop.send(());
        match self.task {
            Some(task) => task.await.map_err(|_| Error::Internal)?,
            None => Ok(Split::default()),
        }
    }
}

/// Samples postmaster `pm`'s children into `window` every [`INTERVAL`] until `stopped`, then
/// once more; the producers are the sessions `pg_stat_activity` shows as theirs, and the bench's
/// `enqueuer` session if it has one.
async fn sample(
    client: tokio_postgres::Client,
    (pm, enqueuer): (u32, Option<u32>),
    mut window: Window,
    mut stopped: oneshot::Receiver<()>,
) -> Result<Split, Error> {
    let mut tick = tokio::time::interval(INTERVAL);
    // Behind (a busy machine): no burst of catch-up samples.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut stopped => true,
        };
        let mut producers = producer_pids(&client).await?;
        producers.extend(enqueuer);
        // `/proc` reads are memory reads, but many of them: off the runtime's threads.
        window = tokio::task::spawn_blocking(move || {
            window.record(&children_of(pm), &producers, title_of);
            window
        })
        .await
        .map_err(|_| Error::Internal)?;
        if last {
            return Ok(window.split());
        }
    }
}

#[cfg(test)]
#[path = "server_cpu_tests.rs"]
mod tests;
