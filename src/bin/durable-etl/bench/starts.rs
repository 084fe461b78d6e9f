//! Handler starts as the replicas record them, for the bench's `ack->start` figure: the peers'
//! latency definition (the handler's own wall-clock time at its first statement minus the
//! producer's wall-clock time when its enqueue call returned, same host and clock).
//!
//! Why this mechanism (the least intrusive honest one):
//! - Only a replica the bench starts records anything: the bench sets [`STARTS_FILE_ENV`] (the
//!   hidden `work --record-handler-starts`), and only then does `work` wrap its handlers in
//!   [`StartLog::wrap`]. Without it the registry, and so the replica, is exactly as in production;
//!   an older binary ignores the variable, records nothing, and the figure is absent, not zero.
//! - The time is taken in the first statement of the wrapper's [`Handler::prepare`], which is the
//!   call the executor makes to start the handler's compute phase: not the claim, not the commit.
//! - Recording is one push onto an in-memory list; the file is written once, after the replica
//!   has stopped. Nothing is written per job, to the database or anywhere else, on the measured
//!   path.
//!
//! File format: one line per handler start, `<job id> <Unix seconds>.<nanoseconds, 9 digits>`.

use durable_etl::job::handler::{Effects, Handler, JobContext, JobError, Registry};
use futures::future::BoxFuture;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// The environment variable by which the bench tells a replica where to write its handler starts.
pub(crate) const STARTS_FILE_ENV: &str = "DURABLE_ETL_RECORD_HANDLER_STARTS";

/// The handler starts of one replica: job id and Unix time, in the order they happened.
#[derive(Debug, Clone, Default)]
pub(crate) struct StartLog(Arc<Mutex<Vec<(Uuid, Duration)>>>);

impl StartLog {
    /// `registry` with every handler wrapped so that its starts are recorded here.
    pub(crate) fn wrap(&self, registry: &Registry) -> Registry {
        registry
            .kinds()
            .into_iter()
            .filter_map(|kind| registry.get(kind))
            .fold(Registry::new(), |wrapped, inner| {
                wrapped.register(Recorded {
                    inner,
                    log: self.clone(),
                })
            })
    }

    /// Notes that the handler of job `id` starts now.
    fn record(&self, id: Uuid) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if let Ok(mut starts) = self.0.lock() {
            starts.push((id, now));
        }
    }

    /// The recorded starts in the file format of this module.
    fn to_text(&self) -> String {
        let starts = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        starts.iter().fold(String::new(), |mut out, (id, at)| {
            let _ = writeln!(out, "{id} {}.{:09}", at.as_secs(), at.subsec_nanos());
            out
        })
    }

    /// Writes the recorded starts to `path` (replacing it).
    ///
    /// # Errors
    /// The I/O error of the write.
    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_text())
    }
}

/// A handler whose starts are recorded in a [`StartLog`] before it runs.
struct Recorded {
    /// The handler that does the work.
    inner: Arc<dyn Handler>,
    /// Where its starts go.
    log: StartLog,
}

impl Handler for Recorded {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn prepare<'a>(
        &'a self,
        job: &'a Arc<JobContext>,
        payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        self.log.record(job.id);
        self.inner.prepare(job, payload)
    }
}

/// Adds the handler starts in `text` (this module's file format) to `starts`, Unix seconds by
/// job id; a job started more than once (a retry, or on two replicas) keeps its first start.
/// Lines that do not parse are skipped.
pub(super) fn parse(text: &str, starts: &mut HashMap<String, f64>) {
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(id), Some(at), None) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let (Ok(id), Ok(at)) = (id.parse::<Uuid>(), at.parse::<f64>()) else {
            continue;
        };
        starts
            .entry(id.to_string())
            .and_modify(|first: &mut f64| *first = first.min(at))
            .or_insert(at);
    }
}

/// The pickup latencies of one offered job, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct JobLatency {
    /// The job's id.
    pub(crate) id: String,
    /// The producer's commit acknowledgement → the handler's start as its replica recorded it
    /// (absent when the replica recorded none).
    pub(crate) ack_to_start: Option<f64>,
    /// The producer's commit acknowledgement → the start of the statement that completed the job.
    pub(crate) ack_to_done: f64,
}

/// The latencies of every offered job that ended: `done` holds `(job id, Unix seconds of the
/// completing statement)`, `acks` and `starts` Unix seconds by job id. Jobs without an ack (not
/// offered) are left out.
pub(super) fn per_job(
    done: &[(String, f64)],
    acks: &HashMap<String, f64>,
    starts: &HashMap<String, f64>,
) -> Vec<JobLatency> {
    done.iter()
        .filter_map(|(id, done)| {
            let ack = acks.get(id)?;
            Some(JobLatency {
                id: id.clone(),
                ack_to_start: starts.get(id).map(|start| (start - ack) * 1000.0),
                ack_to_done: (done - ack) * 1000.0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable_etl::job::handler::{Noop, NOOP_KIND};

    /// A context for job `id`, shared as the worker shares it.
    fn context(id: Uuid) -> Arc<JobContext> {
        Arc::new(JobContext {
            id,
            kind: NOOP_KIND.to_owned(),
            lease_claim_id: Uuid::new_v4(),
            fencing_token: 1,
            attempt: 1,
            max_attempts: 1,
            owner_key: Vec::new(),
            run_at: chrono::Utc::now(),
            lease_lost: durable_etl::job::handler::LeaseLost::default(),
            recorded: Default::default(),
        })
    }

    #[tokio::test]
    async fn wrapped_handlers_record_each_start_and_still_run() {
        let log = StartLog::default();
        let registry = log.wrap(&Registry::new().register(Noop));
        assert_eq!(registry.kinds(), vec![NOOP_KIND]);
        let handler = registry.get(NOOP_KIND).unwrap();
        assert_eq!(handler.kind(), NOOP_KIND);
        let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        for id in [first, second] {
            let effects = handler
                .prepare(&context(id), serde_json::Value::Null)
                .await
                .unwrap();
            assert!(!effects.writes());
        }
        let path = std::env::temp_dir().join(format!("starts-{}", Uuid::new_v4()));
        log.write(&path).unwrap();
        let mut starts = HashMap::new();
        parse(&std::fs::read_to_string(&path).unwrap(), &mut starts);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(starts.len(), 2);
        assert!(starts[&first.to_string()] >= before - 1e-6);
        assert!(starts[&second.to_string()] >= starts[&first.to_string()]);
    }

    #[test]
    fn parsing_keeps_the_first_start_of_a_job_and_skips_bad_lines() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let text = format!(
            "{a} 1700000000.000000500\n{b} 1700000001.250000000\n{a} 1699999999.000000000\n\
             not-a-uuid 1.0\n{b}\n{b} soon\n{a} 1.0 extra\n\n"
        );
        let mut starts = HashMap::from([(b.to_string(), 1_700_000_002.0)]);
        parse(&text, &mut starts);
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[&a.to_string()], 1_699_999_999.0);
        assert_eq!(starts[&b.to_string()], 1_700_000_001.25);
        parse(&format!("{b} 1700000003.0\n"), &mut starts);
        assert_eq!(
            starts[&b.to_string()],
            1_700_000_001.25,
            "an earlier file's start stays"
        );
    }

    #[test]
    fn nanoseconds_survive_the_file_format() {
        let log = StartLog::default();
        let id = Uuid::new_v4();
        log.0
            .lock()
            .unwrap()
            .push((id, Duration::new(1_700_000_000, 5)));
        assert_eq!(log.to_text(), format!("{id} 1700000000.000000005\n"));
    }

    #[test]
    fn per_job_latencies_pair_acks_with_starts_and_completions() {
        let done = vec![
            ("a".to_owned(), 10.003),
            ("b".to_owned(), 20.004),
            ("c".to_owned(), 30.0),
        ];
        let acks = HashMap::from([("a".to_owned(), 10.0), ("b".to_owned(), 20.0)]);
        let starts = HashMap::from([("a".to_owned(), 10.001)]);
        let jobs = per_job(&done, &acks, &starts);
        assert_eq!(jobs.len(), 2, "c was not offered");
        assert_eq!(jobs[0].id, "a");
        assert!((jobs[0].ack_to_start.unwrap() - 1.0).abs() < 1e-6);
        assert!((jobs[0].ack_to_done - 3.0).abs() < 1e-6);
        assert_eq!(jobs[1].ack_to_start, None, "b's replica recorded nothing");
        assert!((jobs[1].ack_to_done - 4.0).abs() < 1e-6);
    }
}
