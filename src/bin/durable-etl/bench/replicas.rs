//! The replica processes of a run, and what they say about themselves: their metrics endpoints
//! and their `/proc` entries (the server's CPU is `server_cpu`'s).

use super::config::{BenchConfig, WAIT_LIMIT};
use super::server_cpu::cpu_seconds;
use super::starts::{parse, STARTS_FILE_ENV};
use durable_etl::config::{ConfigError, DatabaseConfig};
use durable_etl::error::Error;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long a replica gets to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the replicas' metrics endpoints and `/proc` said at the end.
#[derive(Debug, Default)]
pub(super) struct Scraped {
    /// Sum of `durable_etl_db_round_trips_total`.
    pub(super) round_trips: u64,
    /// Sum of `durable_etl_claims_total`.
    pub(super) claims: u64,
    /// Claims made to keep draining a backlog (`durable_etl_claims_total{trigger="drain"}`).
    pub(super) drain_claims: u64,
    /// Sum of `durable_etl_claims_empty_total`.
    pub(super) empty_claims: u64,
    /// Sum of `durable_etl_commit_batch_size_count`.
    pub(super) commit_batches: u64,
    /// The largest `VmHWM` of a replica, in KiB.
    pub(super) peak_rss_kib: u64,
    /// CPU seconds the replicas used.
    pub(super) cpu_seconds: f64,
}

/// The replica processes of a run and their metrics addresses.
pub(super) struct Replicas {
    /// `(process, metrics address)` per replica.
    children: Vec<(Child, String)>,
    /// The bench database's URL.
    url: String,
    /// The cell the replicas run in (`--cell`), if the bench runs in one.
    cell: Option<String>,
    /// Slots per replica.
    slots: usize,
    /// Jobs each replica may claim ahead of its free slots.
    prefetch: usize,
    /// The replicas' claim cooldown, in microseconds.
    claim_cooldown_us: u64,
    /// The replicas' `--queues` (`None`: left out, so they serve the default queue).
    queues: Option<String>,
    /// When the run records handler starts: where replica `i` writes them (`{prefix}-{i}`).
    starts_prefix: Option<PathBuf>,
}

impl Replicas {
    /// Starts `config.replicas` replicas of this binary on `db_config`, and waits until each one's
    /// session is up.
    pub(super) async fn start(
        db_config: &DatabaseConfig,
        config: &BenchConfig,
    ) -> Result<Replicas, Error> {
        let mut replicas = Replicas {
            children: Vec::new(),
            url: db_config.url.clone(),
            cell: db_config.cell.clone(),
            slots: config.slots,
            prefetch: config.prefetch,
            claim_cooldown_us: config.claim_cooldown_us,
            queues: config.shape.served(),
            starts_prefix: config.record_starts.then(|| {
                std::env::temp_dir().join(format!(
                    "{}-{}-handler-starts",
                    config.database,
                    std::process::id()
                ))
            }),
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

    /// Where replica `i` writes its handler starts, when this run records them.
    fn starts_file(&self, i: usize) -> Option<PathBuf> {
        let prefix = self.starts_prefix.as_ref()?;
        let mut name = prefix.as_os_str().to_owned();
        name.push(format!("-{i}"));
        Some(PathBuf::from(name))
    }

    /// Spawns replica `i` (owner id `bench-{i}`) on a fresh metrics address; when the run records
    /// handler starts it records its own (and never otherwise, whatever this process's
    /// environment).
    fn spawn(&self, i: usize) -> Result<(Child, String), Error> {
        let exe = std::env::current_exe().map_err(Error::io)?;
        let addr = free_local_addr()?;
        let mut command = Command::new(&exe);
        match self.starts_file(i) {
            Some(file) => {
                // A file left from an earlier process must not pass for this replica's.
                let _ = std::fs::remove_file(&file);
                command.env(STARTS_FILE_ENV, file)
            }
            None => command.env_remove(STARTS_FILE_ENV),
        };
        let child = command
            .env("DATABASE_URL", &self.url)
            .env("RUST_LOG", "warn")
            .env_remove("DURABLE_ETL_CELL")
            .args(["work", "--owner-id", &format!("bench-{i}")])
            .args(self.cell.iter().flat_map(|cell| ["--cell", cell.as_str()]))
            .args(["--slots", &self.slots.to_string()])
            .args(["--prefetch", &self.prefetch.to_string()])
            .args(["--claim-cooldown", &format!("{}us", self.claim_cooldown_us)])
            .args(["--metrics-listen", &addr])
            .args(self.queues.iter().flat_map(|q| ["--queues", q.as_str()]))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io)?;
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
            // `/readyz` reads the replica's gauge only: polling `/metrics` here counted the
            // backlog on the server every 20 ms while the replicas already up ran jobs.
            let up = http
                .get(format!("http://{addr}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Io(None));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs replica `i` and reaps it.
    pub(super) async fn kill(&mut self, i: usize) {
        if let Some((child, _)) = self.children.get_mut(i) {
            let _ = child.kill().await;
        }
    }

    /// Starts replica `i` again (same owner id) and waits until it is up.
    pub(super) async fn restart(&mut self, i: usize) -> Result<(), Error> {
        let restarted = self.spawn(i)?;
        if let Some(slot) = self.children.get_mut(i) {
            *slot = restarted;
        }
        self.until_up(i).await
    }

    /// Reads every replica's counters and peak RSS.
    pub(super) async fn scrape(&self) -> Result<Scraped, Error> {
        let http = reqwest::Client::new();
        let mut scraped = Scraped::default();
        for (child, addr) in &self.children {
            let metrics = metrics_of(&http, addr).await.ok_or(Error::Io(None))?;
            scraped.round_trips += value(&metrics, "durable_etl_db_round_trips_total");
            scraped.claims += value(&metrics, "durable_etl_claims_total");
            scraped.empty_claims += value(&metrics, "durable_etl_claims_empty_total");
            scraped.drain_claims += value(&metrics, "durable_etl_claims_total{trigger=\"drain\"}");
            scraped.commit_batches += value(&metrics, "durable_etl_commit_batch_size_count");
            let hwm = child.id().map_or(0, peak_rss_kib);
            scraped.peak_rss_kib = scraped.peak_rss_kib.max(hwm);
            scraped.cpu_seconds += child.id().map_or(0.0, cpu_seconds);
        }
        Ok(scraped)
    }

    /// CPU seconds the running replica processes have used so far (`/proc`; no request to
    /// them, so nothing reaches the database).
    pub(super) fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .map(|(child, _)| child.id().map_or(0.0, cpu_seconds))
            .sum()
    }

    /// Stops every replica the way an orchestrator would: SIGTERM, then SIGKILL if it has not
    /// ended within [`STOP_GRACE`].
    pub(super) async fn stop(&mut self) {
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

    /// The handler starts the stopped replicas wrote, per replica in start order (Unix seconds by
    /// job id, the first start of each job); empty maps for replicas that wrote none. The files
    /// are removed.
    pub(super) fn handler_starts(&self) -> Vec<HashMap<String, f64>> {
        (0..self.children.len())
            .map(|i| {
                let mut starts = HashMap::new();
                if let Some(file) = self.starts_file(i) {
                    if let Ok(text) = std::fs::read_to_string(&file) {
                        let _ = std::fs::remove_file(&file);
                        parse(&text, &mut starts);
                    }
                }
                starts
            })
            .collect()
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
    use super::value;

    #[test]
    fn metric_values_sum_every_label_set_of_exactly_that_name() {
        let text =
            "# HELP x\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3\nfoo_total_x 9\nfoo_total 1\n";
        assert_eq!(value(text, "foo_total"), 6);
        assert_eq!(value(text, "bar"), 0);
    }
}
