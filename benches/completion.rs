//! Completion benches: fenced group completion (one statement for many `(id, claim)` pairs)
//! against one fenced statement per job, for the same claimed jobs.
//!
//! Claiming happens outside the timed region (`iter_custom`); only the completions are timed.
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
use durable_etl::job::handler::Output;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer;
use durable_etl::worker::lease::Lease;
use std::time::{Duration, Instant};

/// Jobs completed per sample.
const JOBS: usize = 100;

/// Claims [`JOBS`] fresh jobs and returns their ledger entries.
async fn claimed(db: &BenchDb, conn: &tokio_postgres::Client) -> Vec<(Lease, Option<Output>)> {
    db.reset().await;
    db.fill(JOBS).await;
    let claimant = Claimant {
        owner_id: "completion",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: &["noop"],
    };
    claimer::claim(conn, claimant, JOBS)
        .await
        .expect("claim")
        .iter()
        .map(|j| (j.lease(), None))
        .collect()
}

/// Group completion vs one statement per job.
fn completion(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_completion");
    let pool = rt.block_on(db.pool(1));
    let mut group = c.benchmark_group("fenced_completion");
    group.throughput(Throughput::Elements(JOBS as u64));
    for grouped in [true, false] {
        let name = if grouped { "grouped" } else { "one_by_one" };
        group.bench_with_input(
            BenchmarkId::from_parameter(name),
            &grouped,
            |b, &grouped| {
                b.to_async(&rt).iter_custom(|iters| {
                    let (db, pool) = (&db, pool.clone());
                    async move {
                        let conn = pool.get().await.expect("conn");
                        let conn: &tokio_postgres::Client = &conn;
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let entries = claimed(db, conn).await;
                            let start = Instant::now();
                            let done = if grouped {
                                completer::succeed_many(conn, &entries)
                                    .await
                                    .expect("succeed")
                                    .len()
                            } else {
                                let mut n = 0;
                                for entry in &entries {
                                    n += completer::succeed_many(conn, std::slice::from_ref(entry))
                                        .await
                                        .expect("succeed")
                                        .len();
                                }
                                n
                            };
                            total += start.elapsed();
                            assert_eq!(done, JOBS);
                        }
                        total
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = completion
}
criterion_main!(benches);
