//! Infrastructure faults while a job's computed result commits (a cut of every connection of its
//! replica, its backends terminated over and over): never the job's failure. The replica commits
//! the result again under the same claim once it reconnects, or gives the job back uncharged;
//! the job ends `succeeded`, its effects applied once, no attempt charged. And a fault that loses
//! a claim's reply: the replica adopts what the claim took, under that claim.

use crate::proxy::{Mode, Proxy};
use crate::support::{count, eventually, insert_jobs, job_row, pool, TestDb};
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::job::handler::{Effects, Handler, JobContext, JobError, Output, Registry};
use futures::future::BoxFuture;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_postgres::Transaction;

/// The kind whose effects wait at a gate.
const GATED: &str = "test.gated_effects";

/// Where the gated effects write: one row per application that committed.
const EFFECTS_TABLE: &str = "CREATE TABLE commit_cut_effects (job_id uuid NOT NULL)";

/// Effects that say they are applying (a permit of `applying`), wait until `gate` opens (a
/// permit, given back: once opened it stays open), then write their job's row. They keep a copy
/// to commit again.
#[derive(Clone)]
struct GatedEffects {
    /// The job.
    job: uuid::Uuid,
    /// One permit per application that started.
    applying: Arc<Semaphore>,
    /// Opened by the test.
    gate: Arc<Semaphore>,
}

impl Effects for GatedEffects {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async move {
            self.applying.add_permits(1);
            drop(self.gate.acquire().await);
            tx.execute(
                "INSERT INTO commit_cut_effects (job_id) VALUES ($1)",
                &[&self.job],
            )
            .await?;
            Ok(None)
        })
    }

    fn replay(&self) -> Option<Box<dyn Effects>> {
        Some(Box::new(self.clone()))
    }
}

/// Prepares [`GatedEffects`] at once.
struct Gated {
    /// Shared with every effects.
    applying: Arc<Semaphore>,
    /// Shared with every effects.
    gate: Arc<Semaphore>,
}

impl Handler for Gated {
    fn kind(&self) -> &'static str {
        GATED
    }
    fn prepare<'a>(
        &'a self,
        job: &'a Arc<JobContext>,
        _payload: serde_json::Value,
    ) -> BoxFuture<'a, Result<Box<dyn Effects>, JobError>> {
        Box::pin(async move {
            Ok(Box::new(GatedEffects {
                job: job.id,
                applying: Arc::clone(&self.applying),
                gate: Arc::clone(&self.gate),
            }) as Box<dyn Effects>)
        })
    }
}

/// A replica running [`Gated`], and the handler's semaphores.
struct Replica {
    /// The replica.
    replica: crate::wake::Replica,
    /// A permit per application of effects that started.
    applying: Arc<Semaphore>,
    /// Opens every effects' gate for good.
    gate: Arc<Semaphore>,
}

impl Replica {
    /// Starts a replica with the defaults on `pool` and `config`.
    async fn start(pooled: (durable_etl::db::Pool, &DatabaseConfig)) -> Replica {
        let config = WorkerConfig {
            owner_id: "committer".to_owned(),
            ..WorkerConfig::default()
        };
        Replica::start_with(pooled, config).await
    }

    /// Starts a replica with `config` on `pool` and its database configuration.
    async fn start_with(
        pooled: (durable_etl::db::Pool, &DatabaseConfig),
        config: WorkerConfig,
    ) -> Replica {
        let (applying, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
        let handler = Gated {
            applying: Arc::clone(&applying),
            gate: Arc::clone(&gate),
        };
        let registry = Registry::new().register(handler);
        Replica {
            replica: crate::wake::Replica::start_pooled(pooled, config, registry).await,
            applying,
            gate,
        }
    }

    /// Waits until `n` applications of effects have started.
    async fn until_applying(&self, n: u32) {
        let permits = self.applying.acquire_many(n).await.unwrap();
        permits.forget();
    }

    /// Its counters now.
    fn stats(&self) -> durable_etl::worker::stats::StatsSnapshot {
        self.replica.stats.snapshot()
    }

    /// Stops it cleanly.
    async fn stop(self) {
        self.replica.stop().await.unwrap();
    }
}

/// Asserts that every job of `ids` succeeded under one charged attempt, its effects committed
/// once, and that no attempt of theirs was recorded `retried` (charged).
async fn assert_committed_uncharged(client: &tokio_postgres::Client, ids: &[uuid::Uuid]) {
    for &id in ids {
        let row = job_row(client, id).await;
        assert_eq!(
            (row.status.as_str(), row.attempts, row.failure_code),
            ("succeeded", 1, None),
            "job {id} succeeded without an attempt charged"
        );
        let effects = format!("commit_cut_effects WHERE job_id = '{id}'");
        assert_eq!(count(client, &effects).await, 1, "effects applied once");
    }
    let retried = "etl_job_attempts WHERE ending IN ('retried', 'recovered')";
    assert_eq!(count(client, retried).await, 0, "no attempt charged");
}

/// Waits until every job of `ids` has ended.
async fn until_ended(client: &tokio_postgres::Client, ids: &[uuid::Uuid]) {
    eventually("the jobs to end", || async move {
        let live = format!(
            "etl_job_records WHERE id = ANY('{{{}}}'::uuid[])",
            ids.iter()
                .map(uuid::Uuid::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
        count(client, &live).await == 0
    })
    .await;
}

/// A job on its second-to-last attempt (`max_attempts` 2) whose replica loses every connection
/// for 4 s while its effects apply (longer than the replica trusts its lease, 1.5 s after its
/// last beat): the effects' write fails on the cut connection, and yet the job ends `succeeded`,
/// effects applied once, its one attempt the only one counted. (Before, the write's failure was
/// a charged retry: attempt 1 `retried`, the job on its last attempt after the cut.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_second_cut_in_the_effects_charges_no_attempt() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(EFFECTS_TABLE).await.unwrap();
    let ids = insert_jobs(&client, GATED, &[json!({})], 2).await;
    let proxy = Proxy::in_front_of_test_server().await;
    let proxied = DatabaseConfig {
        url: proxy.url_for(&db.config.url),
        ..db.config.clone()
    };
    let replica_pool = durable_etl::db::connect_pool(&proxied, "test")
        .await
        .unwrap();
    let replica = Replica::start((replica_pool, &proxied)).await;
    replica.until_applying(1).await;
    proxy.set_mode(Mode::Blackhole);
    proxy.drop_all();
    // The effects go on, and write on the connection that is gone.
    replica.gate.add_permits(1);
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.set_mode(Mode::Pass);
    until_ended(&client, &ids).await;
    assert_committed_uncharged(&client, &ids).await;
    let stats = replica.stats();
    assert_eq!((stats.retried, stats.failed), (0, 0), "{stats:?}");
    assert!(
        stats.recommits + stats.given_back >= 1,
        "committed again or given back: {stats:?}"
    );
    replica.stop().await;
}

/// Four jobs whose replica's backends are all terminated, over and over, for 3 s while their
/// effects apply and commit (default attempts, 5): each ends `succeeded`, effects once, no
/// attempt charged. (Before, every termination that reached a commit charged its jobs an
/// attempt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_for_three_seconds_in_the_commit_charge_nothing() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(EFFECTS_TABLE).await.unwrap();
    let ids = insert_jobs(&client, GATED, &vec![json!({}); 4], 5).await;
    let replica = Replica::start((pool(&db).await, &db.config)).await;
    replica.until_applying(1).await;
    let terminating = tokio::time::Instant::now() + Duration::from_secs(3);
    replica.gate.add_permits(1);
    while tokio::time::Instant::now() < terminating {
        client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'durable-etl/%'",
                &[],
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_ended(&client, &ids).await;
    assert_committed_uncharged(&client, &ids).await;
    let stats = replica.stats();
    assert_eq!((stats.retried, stats.failed), (0, 0), "{stats:?}");
    replica.stop().await;
}

/// A claim whose reply is lost: it committed on the server (three jobs `running` under the
/// replica's owner id and claim ids it never saw), and its connection closed before its rows came
/// back. The replica adopts them with its next statement and runs them under that claim: each
/// ends `succeeded` with its one attempt, effects once, nothing recorded `recovered` or
/// `released`, long before their 15 s lease ends. (Before, nothing renewed them and the replica
/// beat on, so they waited out the lease and were recovered, charged: the bound below fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_is_lost_is_adopted_under_its_claim_and_charges_nothing() {
    a_lost_claim_reply_is_adopted(0).await;
}

/// The same, with the adoption's own reply lost too (it ran on the server, renewing the leases,
/// and its connection closed): the replica sends the adoption again, before any claim, and
/// adopts the same jobs under the same claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_whose_reply_is_lost_is_sent_again_and_adopts_the_same_jobs() {
    a_lost_claim_reply_is_adopted(1).await;
}

/// A replica asked to stop while a lost claim reply's jobs wait for their adoption (the first
/// two adoptions' replies lost too) adopts them as it drains and releases them with what it
/// holds: each back `pending`, its attempt not charged, nothing left `running` for recovery.
/// The stop comes right after the first adoption is cut, whether or not the claim loop has seen
/// it fail: either way the drain meets a lost adoption reply of its own and must send the
/// adoption again. (Without the drain's adoptions they stay `running` under the stopped
/// replica's claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_after_a_lost_claim_reply_adopts_and_releases_its_jobs() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ids = insert_jobs(&client, GATED, &vec![json!({}); 3], 5).await;
    let proxy = Proxy::in_front_of_test_server().await;
    cut_the_claim(&proxy);
    proxy.cut_next_statement_carrying(b"WITH orphan AS");
    proxy.cut_next_statement_carrying(b"WITH orphan AS");
    let replica = lost_reply_replica(&db, &proxy, Duration::from_millis(100)).await;
    eventually("the claim and the first adoption to be cut", || async {
        proxy.commits_cut() == 2
    })
    .await;
    let stats = replica.replica.stats.clone();
    replica.stop().await;
    let jobs: Vec<(String, i32)> = client
        .query(
            "SELECT status, attempts FROM etl_jobs WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        jobs,
        vec![("pending".to_owned(), 0); 3],
        "released uncharged"
    );
    let stats = stats.snapshot();
    assert_eq!((stats.adopted, stats.released), (3, 3), "{stats:?}");
    assert_eq!(
        proxy.commits_cut(),
        3,
        "the second adoption's reply was not lost"
    );
}

/// Arms `proxy` to cut the replica's first claim: its parameters carry the kinds it claims, as
/// do those of its first report, sent at start-up too (told apart by the report's text, sent
/// with it).
fn cut_the_claim(proxy: &Proxy) {
    proxy.cut_next_statement_carrying_unless(GATED.as_bytes(), b"etl_replica");
}

/// A replica through `proxy` to `db` that claims by its poll alone (no presence statements: the
/// claim is its first statement carrying the kind but its reports), with `shutdown_grace`, running
/// [`Gated`].
async fn lost_reply_replica(db: &TestDb, proxy: &Proxy, shutdown_grace: Duration) -> Replica {
    let proxied = DatabaseConfig {
        url: proxy.url_for(&db.config.url),
        ..db.config.clone()
    };
    let replica_pool = durable_etl::db::connect_pool(&proxied, "test")
        .await
        .unwrap();
    let config = WorkerConfig {
        owner_id: "adopter".to_owned(),
        poll_only: true,
        poll_interval: Duration::from_secs(60),
        shutdown_grace,
        ..WorkerConfig::default()
    };
    Replica::start_with((replica_pool, &proxied), config).await
}

/// A claim's reply lost, then `adoptions_lost` adoptions' replies: the three jobs the claim took
/// still run at once, under that claim, charged nothing.
async fn a_lost_claim_reply_is_adopted(adoptions_lost: usize) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client.batch_execute(EFFECTS_TABLE).await.unwrap();
    let ids = insert_jobs(&client, GATED, &vec![json!({}); 3], 5).await;
    let proxy = Proxy::in_front_of_test_server().await;
    // The adoption is sent unnamed, its text with it.
    cut_the_claim(&proxy);
    for _ in 0..adoptions_lost {
        proxy.cut_next_statement_carrying(b"WITH orphan AS");
    }
    let grace = WorkerConfig::default().shutdown_grace;
    let replica = lost_reply_replica(&db, &proxy, grace).await;
    replica.gate.add_permits(1);
    eventually(
        "the claim and the adoptions to be cut after they ran",
        || async { proxy.commits_cut() == 1 + adoptions_lost },
    )
    .await;
    let claimed = "etl_job_records WHERE status = 'running' AND lease_owner_id = 'adopter'";
    assert_eq!(
        count(&client, claimed).await,
        3,
        "the lost claim took every job"
    );
    let bound = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(&client, "etl_job_records").await > 0 {
        assert!(
            tokio::time::Instant::now() < bound,
            "the claimed jobs ran at once, not after their lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_committed_uncharged(&client, &ids).await;
    let released = "etl_job_attempts WHERE ending = 'released'";
    assert_eq!(count(&client, released).await, 0, "none given back");
    let stats = replica.stats();
    assert_eq!(
        (stats.adopted, stats.claimed, stats.succeeded),
        (3, 3, 3),
        "{stats:?}"
    );
    replica.stop().await;
}
