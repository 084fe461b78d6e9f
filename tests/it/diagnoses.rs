//! Attempt diagnoses: every attempt that failed records its phase (compute, effects, commit,
//! recovery), its retry decision and delay, its duration, its error's type chain and its kind's
//! declared detail, and nothing of its error's text. A canary in every error message is searched
//! for in every column of every table of the test's database, every log line, the API's answers
//! and the console's pages; the type names and I/O error kinds must be there instead. The
//! handler's own logs carry its job's span.

use crate::console::{Console, SECRET};
use crate::privacy::capture_logs;
use crate::support::{count, eventually, expire_and_recover, pool, TestDb};
use durable_etl::codes::Code;
use durable_etl::config::WorkerConfig;
use durable_etl::job::diagnosis::{Decision, Phase, UNKNOWN_TYPE};
use durable_etl::job::handler::Registry;
use durable_etl::job::{Detail, Diagnosis};
use durable_etl::jobs::{AttemptEnding, Attempts};
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::Worker;
use durable_etl::{Apply, EnqueueOptions, Job, JobContext, JobError, Jobs, Perform, Secret};
use std::io::{Error as IoError, ErrorKind};
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

/// The text of every error the kind fails with: it must never be stored, logged or shown.
const CANARY: &str = "CANARY-smtp-busy-for-alice@example.com";

/// The kind's name.
const KIND: &str = "test.diagnosed";

/// A job of the diagnosed kind: `what` it does (see [`Runner`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct Diagnosed {
    /// What the job does.
    what: String,
}

impl Job for Diagnosed {
    const KIND: &'static str = KIND;
    const CODES: &'static [&'static str] = &["quota_spent"];
}

/// An error of a type no probe knows, wrapping `source`.
#[derive(Debug)]
struct Wrapped(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wrapped {CANARY}")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// The detail the kind declares with its transient failures.
fn smtp_detail() -> Detail {
    Detail::new()
        .field("smtp_reply", 421)
        .field("relay", "eu-west-1")
        .field("tls", true)
}

/// Runs [`Diagnosed`] jobs: `ok`; in compute, `transient` (an I/O error with a detail),
/// `retry_after` (an hour), `permanent` (with an I/O source), `kind_code` (a declared code with a
/// detail), `chain` (an unknown type wrapping an unknown type wrapping an I/O error); in the
/// effects, `effects_transient` and `effects_permanent`; at the commit, `commit` (a deferred
/// unique violation, raised by COMMIT). It logs inside its compute phase and its effects.
struct Runner;

/// What a [`Diagnosed`] job's effects do.
enum Effects {
    /// Nothing.
    Nothing,
    /// Fail with this error.
    Fail(fn() -> JobError),
    /// Insert a row twice into a table whose unique key is checked at COMMIT.
    Clash,
}

impl Perform for Runner {
    type Job = Diagnosed;
    type Effects = Effects;

    async fn compute(&self, job: Diagnosed, _ctx: &JobContext) -> Result<Effects, JobError> {
        tracing::info!(step = "compute", "the handler logs inside its span");
        Ok(match job.what.as_str() {
            "transient" => {
                return Err(JobError::transient(IoError::other(CANARY)).with_detail(smtp_detail()))
            }
            "retry_after" => {
                let timed_out = IoError::new(ErrorKind::TimedOut, CANARY);
                return Err(JobError::retry_after(Duration::from_secs(3600), timed_out));
            }
            "permanent" => {
                let refused = IoError::new(ErrorKind::ConnectionRefused, CANARY);
                return Err(JobError::permanent(Code::HandlerFailed).with_source(refused));
            }
            "kind_code" => {
                let detail = Detail::new().field("used", 3u32).field("plan", "free");
                return Err(JobError::failed("quota_spent").with_detail(detail));
            }
            "chain" => {
                let inner = Wrapped(Box::new(IoError::other(CANARY)));
                return Err(JobError::transient(Wrapped(Box::new(inner))));
            }
            "effects_transient" => {
                Effects::Fail(|| JobError::transient(IoError::new(ErrorKind::BrokenPipe, CANARY)))
            }
            "effects_permanent" => Effects::Fail(|| {
                JobError::permanent(Code::HandlerFailed).with_source(IoError::other(CANARY))
            }),
            "commit" => Effects::Clash,
            _ => Effects::Nothing,
        })
    }
}

impl Apply for Effects {
    async fn apply(
        self,
        tx: &tokio_postgres::Transaction<'_>,
        _: &JobContext,
    ) -> Result<(), JobError> {
        tracing::info!(step = "effects", "the effects log inside the job's span");
        match self {
            Effects::Nothing => Ok(()),
            Effects::Fail(error) => Err(error()),
            Effects::Clash => {
                tx.batch_execute("INSERT INTO diagnosed_clash VALUES (1), (1)")
                    .await?;
                Ok(())
            }
        }
    }
}

/// A worker of the diagnosed kind on `db`, one slot, retrying after 10 to 20 ms.
async fn worker(db: &TestDb, owner_id: &str) -> Worker {
    let config = WorkerConfig {
        owner_id: owner_id.into(),
        slots: 1,
        retry_min_delay: Duration::from_millis(10),
        retry_max_delay: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    Worker::start(
        pool(db).await,
        &db.config,
        config,
        Registry::new().perform(Runner),
    )
    .await
    .unwrap()
}

/// Enqueues a [`Diagnosed`] job doing `what`, with `max_attempts`, for `jobs`'s owner.
async fn enqueue(client: &Client, jobs: &Jobs, what: &str, max_attempts: i32) -> Uuid {
    let job = Diagnosed { what: what.into() };
    let options = EnqueueOptions {
        max_attempts: Some(max_attempts),
        ..EnqueueOptions::default()
    };
    jobs.enqueue(client, &job, options).await.unwrap().id
}

/// Steps `worker` until job `id` has ended (each retry is due within 20 ms).
async fn run_to_end(worker: &Worker, client: &Client, id: Uuid) {
    for _ in 0..200 {
        worker.step().await.unwrap();
        let live = client
            .query_one("SELECT count(*) FROM etl_job_records WHERE id = $1", &[&id])
            .await
            .unwrap();
        if live.get::<_, i64>(0) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} did not end");
}

/// The only attempt that did not end the job, which must have a diagnosis.
fn only_past(attempts: &Attempts, ending: AttemptEnding) -> &Diagnosis {
    assert_eq!(attempts.past.len(), 1, "{attempts:?}");
    assert_eq!(attempts.past[0].ending, ending);
    attempts.past[0].diagnosis.as_ref().unwrap()
}

/// The type names of a diagnosis's chain.
fn types(diagnosis: &Diagnosis) -> Vec<&str> {
    diagnosis
        .chain
        .iter()
        .map(|l| l.type_name.as_str())
        .collect()
}

/// Every row of every table of the test's database, as text.
async fn dump(client: &Client) -> String {
    let tables: Vec<String> = crate::support::first_column(
        client,
        "SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables
          WHERE table_type = 'BASE TABLE'
            AND table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .await;
    assert!(tables.iter().any(|t| t == "public.etl_job_attempts"));
    let mut text = String::new();
    for table in tables {
        let rows = client
            .query(&format!("SELECT t::text FROM {table} t"), &[])
            .await
            .unwrap();
        for row in rows {
            text.push_str(row.get::<_, &str>(0));
            text.push('\n');
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_diagnosed_by_type_and_kind_and_their_text_leaks_nowhere() {
    let sink = capture_logs();
    let console = Console::start().await;
    let client = console.db.client().await;
    let jobs = Jobs::new(Secret::new(SECRET).unwrap(), "alice");
    let transient = enqueue(&client, &jobs, "transient", 2).await;
    let permanent = enqueue(&client, &jobs, "permanent", 3).await;
    let kind_code = enqueue(&client, &jobs, "kind_code", 3).await;
    let chain = enqueue(&client, &jobs, "chain", 1).await;
    let ok = enqueue(&client, &jobs, "ok", 1).await;
    let worker = worker(&console.db, "diagnosing-replica").await;
    for id in [transient, permanent, kind_code, chain, ok] {
        run_to_end(&worker, &client, id).await;
    }

    // A transient failure, retried: compute, retry after the policy's delay, the I/O error's type
    // and kind, the declared detail.
    let attempts = jobs.attempts(&client, transient).await.unwrap();
    let retried = only_past(&attempts, AttemptEnding::Retried);
    assert_eq!(
        (retried.phase, retried.decision),
        (Phase::Compute, Decision::Retry)
    );
    let delay = retried.delay_ms.unwrap();
    assert!((10..=20).contains(&delay), "{delay}");
    assert!(retried.duration_ms >= 0);
    assert_eq!(types(retried), ["std::io::error::Error"]);
    assert_eq!(retried.chain[0].io_kind.as_deref(), Some("Other"));
    let detail = retried.detail.as_ref().unwrap();
    assert_eq!(detail["smtp_reply"], 421);
    assert_eq!(detail["relay"], "eu-west-1");
    assert_eq!(detail["tls"], true);
    // Its second and last attempt: the database decided `fail` (attempts exhausted), no delay.
    let last = attempts.last.as_ref().unwrap();
    assert_eq!(last.attempt, 2);
    assert_eq!(last.diagnosis.decision, Decision::Fail);
    assert_eq!(last.diagnosis.delay_ms, None);
    assert_eq!(types(&last.diagnosis), ["std::io::error::Error"]);
    let status = jobs.status(&client, transient).await.unwrap().unwrap();
    assert_eq!(status.failure.unwrap().code, "attempts_exhausted");

    // A permanent failure with a source, and a kind's code with a detail and no source.
    let attempts = jobs.attempts(&client, permanent).await.unwrap();
    assert!(attempts.past.is_empty());
    let failed = attempts.last.unwrap().diagnosis;
    assert_eq!(
        (failed.phase, failed.decision),
        (Phase::Compute, Decision::Fail)
    );
    assert_eq!(
        failed.chain[0].io_kind.as_deref(),
        Some("ConnectionRefused")
    );
    let coded = jobs
        .attempts(&client, kind_code)
        .await
        .unwrap()
        .last
        .unwrap()
        .diagnosis;
    assert!(coded.chain.is_empty());
    assert_eq!(coded.detail.unwrap()["used"], 3);
    // Unknown types behind the first are a placeholder; the known I/O error is named.
    let chained = jobs
        .attempts(&client, chain)
        .await
        .unwrap()
        .last
        .unwrap()
        .diagnosis;
    let wrapped = std::any::type_name::<Wrapped>();
    assert_eq!(
        types(&chained),
        [wrapped, UNKNOWN_TYPE, "std::io::error::Error"]
    );
    // A success keeps no diagnosis.
    let succeeded = jobs.attempts(&client, ok).await.unwrap();
    assert_eq!((succeeded.past.len(), succeeded.last), (0, None));
    assert_eq!(
        count(&client, "etl_job_outcomes WHERE diagnosis IS NOT NULL").await,
        4,
        "one per failed job"
    );

    // The API answers the attempts with their diagnoses.
    let mut answers = String::new();
    for id in [transient, permanent, kind_code, chain, ok] {
        let response = console
            .http
            .get(format!("{}/v1/etl-jobs/{id}/attempts", console.base))
            .bearer_auth(&console.alice)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        answers.push_str(&response.text().await.unwrap());
    }
    let answer: serde_json::Value = serde_json::from_str(
        &console
            .http
            .get(format!("{}/v1/etl-jobs/{transient}/attempts", console.base))
            .bearer_auth(&console.alice)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(answer["attempts"][0]["ending"], "retried");
    assert_eq!(answer["attempts"][0]["diagnosis"]["phase"], "compute");
    assert_eq!(
        answer["attempts"][0]["diagnosis"]["chain"][0]["type"],
        "std::io::error::Error"
    );
    assert_eq!(answer["failed"]["diagnosis"]["decision"], "fail");
    // Another owner's job is not found.
    let bobs = console
        .http
        .get(format!("{}/v1/etl-jobs/{transient}/attempts", console.base))
        .bearer_auth(&console.bob)
        .send()
        .await
        .unwrap();
    assert_eq!(bobs.status(), 404);

    // The console's job pages show them.
    let session = console.sign_in(&console.alice).await;
    let mut pages = String::new();
    for id in [transient, permanent, kind_code, chain] {
        let page = console.get(&format!("/console/jobs/{id}"), &session).await;
        assert_eq!(page.status, 200);
        pages.push_str(&page.body);
    }
    for shown in [
        "Failed in compute",
        "std::io::error::Error",
        "ConnectionRefused",
        "smtp_reply=421",
        "no retry",
        UNKNOWN_TYPE
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .as_str(),
    ] {
        assert!(pages.contains(shown), "{shown} not in the pages");
    }

    // The logs: the end of each attempt at info for a failure, with its code and phase, and the
    // handler's own lines inside its job's span.
    let logs = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let ended: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("job attempt ended") && l.contains(&transient.to_string()))
        .collect();
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(ended.iter().all(|l| l.contains(" INFO ")), "{ended:?}");
    assert!(
        ended[0].contains("code=\"handler_failed\"") || ended[0].contains("code=handler_failed"),
        "{}",
        ended[0]
    );
    assert!(
        ended[0].contains("phase=") && ended[0].contains("compute"),
        "{}",
        ended[0]
    );
    assert!(
        ended[0].contains("transition=") && ended[0].contains("retried"),
        "{}",
        ended[0]
    );
    assert!(ended[1].contains("attempts_exhausted"), "{}", ended[1]);
    let succeeded_line = logs
        .lines()
        .find(|l| l.contains("job attempt ended") && l.contains(&ok.to_string()))
        .unwrap();
    assert!(succeeded_line.contains("DEBUG"), "{succeeded_line}");
    let inside = logs
        .lines()
        .find(|l| l.contains("the handler logs inside its span") && l.contains(&ok.to_string()))
        .unwrap_or_else(|| panic!("no handler line of job {ok}:\n{logs}"));
    for field in [
        format!("job_id={ok}"),
        format!("kind={KIND}"),
        "queue=default".into(),
        "attempt=1".into(),
    ] {
        assert!(inside.contains(&field), "{field} not in {inside}");
    }
    let effects = logs
        .lines()
        .find(|l| {
            l.contains("the effects log inside the job's span") && l.contains(&ok.to_string())
        })
        .unwrap_or_else(|| panic!("no effects line of job {ok}"));
    assert!(effects.contains(&format!("kind={KIND}")), "{effects}");

    // The canary is nowhere: no column of any table, no log line, no answer, no page.
    let dumped = dump(&client).await;
    assert!(
        dumped.contains("std::io::error::Error"),
        "the diagnoses are stored"
    );
    for (what, text) in [
        ("database", &dumped),
        ("logs", &logs),
        ("answers", &answers),
        ("pages", &pages),
    ] {
        assert!(
            !text.to_lowercase().contains("canary"),
            "the canary leaked into the {what}"
        );
        assert!(
            !text.contains("alice@example.com"),
            "the canary leaked into the {what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_phase_is_diagnosed_with_its_decision_and_delay() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE diagnosed_clash (id int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        .await
        .unwrap();
    let jobs = Jobs::new(Secret::new("diagnoses-secret-0123456789").unwrap(), "owner");
    let worker = worker(&db, "phases-replica").await;

    // Compute, with the delay the handler asked for, exactly.
    let later = enqueue(&client, &jobs, "retry_after", 3).await;
    worker.step().await.unwrap();
    let attempts = jobs.attempts(&client, later).await.unwrap();
    let retried = only_past(&attempts, AttemptEnding::Retried);
    assert_eq!(retried.phase, Phase::Compute);
    assert_eq!(retried.delay_ms, Some(3_600_000));
    assert_eq!(retried.chain[0].io_kind.as_deref(), Some("TimedOut"));
    assert_eq!(attempts.last, None, "still pending");

    // Effects: a transient failure retried, a permanent one failed.
    let effects = enqueue(&client, &jobs, "effects_transient", 1).await;
    run_to_end(&worker, &client, effects).await;
    let attempts = jobs.attempts(&client, effects).await.unwrap();
    let failed = attempts.last.unwrap().diagnosis;
    assert_eq!(
        (failed.phase, failed.decision),
        (Phase::Effects, Decision::Fail)
    );
    assert_eq!(failed.chain[0].io_kind.as_deref(), Some("BrokenPipe"));
    let permanent = enqueue(&client, &jobs, "effects_permanent", 3).await;
    run_to_end(&worker, &client, permanent).await;
    let failed = jobs
        .attempts(&client, permanent)
        .await
        .unwrap()
        .last
        .unwrap()
        .diagnosis;
    assert_eq!(
        (failed.phase, failed.decision),
        (Phase::Effects, Decision::Fail)
    );
    assert_eq!(types(&failed), ["std::io::error::Error"]);

    // Commit: the batch's COMMIT fails (a deferred unique violation); retried, then exhausted.
    let commit = enqueue(&client, &jobs, "commit", 2).await;
    run_to_end(&worker, &client, commit).await;
    let attempts = jobs.attempts(&client, commit).await.unwrap();
    let retried = only_past(&attempts, AttemptEnding::Retried);
    assert_eq!(
        (retried.phase, retried.decision),
        (Phase::Commit, Decision::Retry)
    );
    // The batch's own error, named by its type and SQLSTATE (a unique violation).
    assert_eq!(types(retried), ["tokio_postgres::error::Error"]);
    assert_eq!(retried.chain[0].sqlstate.as_deref(), Some("23505"));
    let last = attempts.last.unwrap().diagnosis;
    assert_eq!((last.phase, last.decision), (Phase::Commit, Decision::Fail));
    assert_eq!(
        count(&client, "diagnosed_clash").await,
        0,
        "nothing committed"
    );

    // Recovery: a claim whose lease expired goes back (retry, due now), then, on its last
    // attempt, ends `lease_expired_exhausted`.
    let recovered = enqueue(&client, &jobs, "ok", 2).await;
    let claimant = Claimant {
        owner_id: "vanished-replica",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(4),
        alive_locked: false,
        kinds: &[KIND],
    };
    for _ in 0..2 {
        let claimed = claimer::claim(&client, claimant, 1).await.unwrap();
        assert_eq!(claimed[0].id(), recovered);
        assert_eq!(expire_and_recover(&client).await, 1);
    }
    let attempts = jobs.attempts(&client, recovered).await.unwrap();
    let given_back = only_past(&attempts, AttemptEnding::Recovered);
    assert_eq!(given_back.phase, Phase::Recovery);
    assert_eq!(
        (given_back.decision, given_back.delay_ms),
        (Decision::Retry, Some(0))
    );
    assert_eq!(given_back.lease_expired, Some(true));
    assert!(given_back.chain.is_empty());
    let last = attempts.last.unwrap();
    assert_eq!(last.attempt, 2);
    assert_eq!(
        (last.diagnosis.phase, last.diagnosis.decision),
        (Phase::Recovery, Decision::Fail)
    );
    let status = jobs.status(&client, recovered).await.unwrap().unwrap();
    assert_eq!(status.failure.unwrap().code, "lease_expired_exhausted");

    // A cancellation keeps none: the constraint admits a diagnosis only on a failure.
    let cancelled = enqueue(&client, &jobs, "ok", 1).await;
    jobs.cancel(&client, cancelled).await.unwrap();
    eventually("the cancel ended the job", || async {
        count(&client, "etl_job_outcomes WHERE status = 'cancelled'").await == 1
    })
    .await;
    let refused = client
        .execute(
            "UPDATE etl_job_outcomes SET diagnosis = '{}' WHERE job_id = $1",
            &[&cancelled],
        )
        .await;
    assert!(
        refused.is_err(),
        "only a failed outcome may keep a diagnosis"
    );
    assert_eq!(
        count(
            &client,
            "etl_job_outcomes WHERE status <> 'failed' AND diagnosis IS NOT NULL"
        )
        .await,
        0
    );
}
