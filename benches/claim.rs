//! Claim benches: contention between simulated replicas (each with its own pool and claim loop)
//! draining one pre-filled queue, and claim statement cost by batch size.
//!
//! Setup (fill) and cleanup (truncate) stay outside the timed region (`iter_custom`).
// `criterion_group!` and `criterion_main!` generate functions that cannot carry doc comments.
// A bench aborts on a failed setup step: `expect` names the step.
#![allow(
    missing_docs,
    clippy::missing_docs_in_private_items,
    clippy::expect_used
)]

mod common;

use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer;
use std::time::{Duration, Instant};

/// Jobs each contention sample drains.
const JOBS: usize = 2_000;

/// Slots of each simulated replica (its claim size).
const SLOTS: usize = 50;

/// One simulated replica: claims up to [`SLOTS`] jobs and group-completes them, until the
/// queue is empty.
async fn replica(pool: durable_etl::db::Pool, owner: String) {
    let claimant = Claimant {
        owner_id: &owner,
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: &["noop"],
    };
    loop {
        let conn = pool.get().await.expect("conn");
        let jobs = claimer::claim(&*conn, claimant, SLOTS)
            .await
            .expect("claim");
        if jobs.is_empty() {
            return;
        }
        let entries: Vec<_> = jobs.iter().map(|j| (j.lease(), None)).collect();
        let done = completer::succeed_many(&*conn, &entries)
            .await
            .expect("succeed");
        assert_eq!(done.len(), entries.len(), "every held claim completes");
    }
}

/// Drains [`JOBS`] jobs with 1, 2, 4 and 8 replicas claiming concurrently.
fn contention(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_claim");
    let mut group = c.benchmark_group("claim_contention");
    group.throughput(Throughput::Elements(JOBS as u64));
    for replicas in [1usize, 2, 4, 8] {
        let pools: Vec<_> = rt.block_on(async {
            let mut pools = Vec::new();
            for _ in 0..replicas {
                pools.push(db.pool(1).await);
            }
            pools
        });
        group.bench_with_input(BenchmarkId::from_parameter(replicas), &replicas, |b, _| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, pools) = (&db, pools.clone());
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        db.reset().await;
                        db.fill(JOBS).await;
                        let start = Instant::now();
                        let tasks: Vec<_> = pools
                            .iter()
                            .enumerate()
                            .map(|(i, p)| tokio::spawn(replica(p.clone(), format!("r{i}"))))
                            .collect();
                        for t in tasks {
                            t.await.expect("replica");
                        }
                        total += start.elapsed();
                    }
                    total
                }
            });
        });
    }
    group.finish();
}

/// One claim statement of 1, 10 and 100 jobs out of a queue of 5,000 due jobs.
fn batch_size(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_claim_batch");
    let pool = rt.block_on(db.pool(1));
    let mut group = c.benchmark_group("claim_batch");
    for n in [1usize, 10, 100] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, pool) = (&db, pool.clone());
                async move {
                    let claimant = Claimant {
                        owner_id: "batch",
                        owner_locked: false,
                        lease: Duration::from_secs(60),
                        heartbeat_interval: std::time::Duration::from_secs(4),
                        alive_locked: false,
                        kinds: &["noop"],
                    };
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        if i % 40 == 0 {
                            db.reset().await;
                            db.fill(5_000).await;
                        }
                        let conn = pool.get().await.expect("conn");
                        let start = Instant::now();
                        let jobs = claimer::claim(&*conn, claimant, n).await.expect("claim");
                        total += start.elapsed();
                        assert_eq!(jobs.len(), n);
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
    targets = contention, batch_size
}
criterion_main!(benches);
