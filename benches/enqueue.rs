//! Enqueue benches: single-job inserts from 8 concurrent producers, one simple-query round trip
//! per job, to price the NOTIFY: with the trigger on while no replica waits (`on`: each enqueue
//! takes the enqueue barrier and finds nobody to wake, as while every replica is busy), on while
//! one waits (`on_waiting`: each commit notifies), off (`off`: nobody notifies), and with the
//! API's coalescing notifier (`notifier`, `notifier_waiting`: each transaction runs `SET LOCAL
//! durable_etl.notify = 'off'` and signals one shared `Notifier` after its commit). Each ÷ `off`
//! is what that path keeps of trigger-off throughput.
//!
//! `typed_one_producer` prices the library's typed enqueue from one producer, in one
//! transaction per sample, with the trigger on and nobody waiting: `enqueue_many` of
//! [`BULK`] small jobs (one statement per 5,000), and a loop of [`SINGLES`] single `enqueue`
//! calls (one round trip each). Elements/s is jobs/s.
//!
//! The table is emptied between samples, outside the timed region (`iter_custom`).
// `criterion_group!` and `criterion_main!` generate functions that cannot carry doc comments.
// A bench aborts on a failed setup step: `expect` names the step.
#![allow(
    missing_docs,
    clippy::missing_docs_in_private_items,
    clippy::expect_used
)]

// This bench fills no queue and needs no pool: it uses only part of the shared helpers.
#[allow(dead_code)]
mod common;

use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};

/// Concurrent producers.
const PRODUCERS: usize = 8;

/// Jobs each producer inserts per sample, one autocommit statement each.
const PER_PRODUCER: usize = 50;

/// One job's insert (its intake row and its live row, in one statement); `KEY` stands for its
/// idempotency key (a number, written in as a literal).
const INSERT_SQL: &str = "WITH intake AS (
     INSERT INTO etl_job_intake
            (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts,
             run_at)
     VALUES (gen_random_uuid(), sha256('bench'::bytea), sha256(KEY::text::bytea),
             sha256(KEY::text::bytea), 'noop', 5, now())
     RETURNING id, owner_key, kind, max_attempts, run_at
 )
 INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
 SELECT id, owner_key, kind, '{}'::jsonb, max_attempts, run_at FROM intake";

/// Inserts [`PER_PRODUCER`] jobs numbered after `base`, one transaction and one simple-query
/// round trip each (so that no variant pays a round trip the others do not): an autocommit
/// insert or, with a notifier, a transaction that skips the trigger's NOTIFY, followed by a
/// signal to the notifier once it has committed.
async fn produce(
    client: &tokio_postgres::Client,
    base: i64,
    notifier: Option<&durable_etl::jobs::notifier::Notifier>,
) {
    for key in base..base + PER_PRODUCER as i64 {
        let insert = INSERT_SQL.replace("KEY", &key.to_string());
        let sql = match notifier {
            None => insert,
            Some(_) => format!("BEGIN; SET LOCAL durable_etl.notify = 'off'; {insert}; COMMIT"),
        };
        client.batch_execute(&sql).await.expect("insert");
        if let Some(notifier) = notifier {
            notifier.signal();
        }
    }
}

/// Jobs per `typed_one_producer/enqueue_many` sample.
const BULK: usize = 20_000;

/// Jobs per `typed_one_producer/enqueue_loop` sample.
const SINGLES: usize = 500;

/// A small job of the typed enqueue benches.
#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {
    /// Its number.
    n: u64,
}

impl durable_etl::Job for Ping {
    const KIND: &'static str = "noop";
}

/// The typed enqueue from one producer: bulk and single, jobs/s.
fn typed(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_enqueue_typed");
    let secret = durable_etl::Secret::new("bench-secret-0123456789").expect("secret");
    let jobs = durable_etl::Jobs::new(secret, "bench");
    let mut group = c.benchmark_group("typed_one_producer");
    for (variant, size) in [("enqueue_many", BULK), ("enqueue_loop", SINGLES)] {
        let batch: Vec<Ping> = (0..size as u64).map(|n| Ping { n }).collect();
        group.throughput(Throughput::Elements(size as u64));
        group.bench_function(variant, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, jobs, batch) = (&db, &jobs, &batch);
                async move {
                    let mut client = durable_etl::db::connect(&db.config, "bench")
                        .await
                        .expect("connect");
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        db.reset().await;
                        let start = Instant::now();
                        let tx = client.transaction().await.expect("begin");
                        if variant == "enqueue_many" {
                            jobs.enqueue_many(&tx, batch).await.expect("enqueue_many");
                        } else {
                            for ping in batch {
                                jobs.enqueue(&tx, ping, durable_etl::EnqueueOptions::default())
                                    .await
                                    .expect("enqueue");
                            }
                        }
                        tx.commit().await.expect("commit");
                        total += start.elapsed();
                    }
                    total
                }
            });
        });
    }
    group.finish();
}

/// Enqueue commits/s with the trigger on, off, and off with the coalescing notifier.
fn enqueue(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_enqueue");
    let producers: Vec<tokio_postgres::Client> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..PRODUCERS {
            v.push(
                durable_etl::db::connect(&db.config, "bench")
                    .await
                    .expect("connect"),
            );
        }
        v
    });
    let mut group = c.benchmark_group("enqueue_8_producers");
    group.throughput(Throughput::Elements((PRODUCERS * PER_PRODUCER) as u64));
    let notifier = rt
        .block_on(async { durable_etl::jobs::notifier::Notifier::start(&db.config) })
        .expect("notifier");
    for variant in ["on", "on_waiting", "off", "notifier", "notifier_waiting"] {
        let toggle = if variant == "off" {
            "DISABLE"
        } else {
            "ENABLE"
        };
        // `_waiting`: a replica waits for work, so every enqueue (or every coalesced signal)
        // notifies; otherwise nobody waits, as while every replica is busy.
        let waiting = if variant.ends_with("_waiting") {
            "INSERT INTO etl_waiting_replicas (owner_id) VALUES ('bench')"
        } else {
            "SELECT 1"
        };
        rt.block_on(db.client.batch_execute(&format!(
            "ALTER TABLE etl_job_records {toggle} TRIGGER etl_job_records_notify_enqueue;
             DELETE FROM etl_waiting_replicas; {waiting}"
        )))
        .expect("toggle trigger");
        let notifier = variant.starts_with("notifier").then_some(&notifier);
        group.bench_with_input(BenchmarkId::from_parameter(variant), &variant, |b, _| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, producers) = (&db, &producers);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        db.reset().await;
                        let start = Instant::now();
                        let runs = producers.iter().enumerate().map(|(p, client)| {
                            produce(client, (p * PER_PRODUCER) as i64, notifier)
                        });
                        futures::future::join_all(runs).await;
                        total += start.elapsed();
                    }
                    total
                }
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = enqueue, typed
}
criterion_main!(benches);
