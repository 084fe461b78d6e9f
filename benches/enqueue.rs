//! Enqueue benches: single-job autocommit inserts from 8 concurrent producers, with the NOTIFY
//! trigger on and off, to price the notification.
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

/// Inserts [`PER_PRODUCER`] jobs, one statement each, numbered after `base`.
async fn produce(client: &tokio_postgres::Client, base: i64) {
    for i in 0..PER_PRODUCER as i64 {
        client
            .execute(
                "INSERT INTO etl_job_records
                        (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                         request_payload)
                 VALUES (gen_random_uuid(), sha256('bench'::bytea), sha256($1::text::bytea),
                         sha256($1::text::bytea), 'noop', '{}'::jsonb)",
                &[&(base + i).to_string()],
            )
            .await
            .expect("insert");
    }
}

/// Enqueue commits/s with the trigger on and off.
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
    for trigger in ["on", "off"] {
        let toggle = if trigger == "on" { "ENABLE" } else { "DISABLE" };
        rt.block_on(db.client.batch_execute(&format!(
            "ALTER TABLE etl_job_records {toggle} TRIGGER etl_job_records_notify_enqueue"
        )))
        .expect("toggle trigger");
        group.bench_with_input(BenchmarkId::from_parameter(trigger), &trigger, |b, _| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, producers) = (&db, &producers);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        db.reset().await;
                        let start = Instant::now();
                        let runs = producers
                            .iter()
                            .enumerate()
                            .map(|(p, client)| produce(client, (p * PER_PRODUCER) as i64));
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
    targets = enqueue
}
criterion_main!(benches);
