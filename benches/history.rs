//! Flat with history: the cost of claiming and completing a batch of jobs with an empty history
//! and with 1,000,000 ended jobs (intake rows and outcomes, as the retention runbook leaves them
//! until they age out). Since migration 0008 neither the claim nor the completion reads the
//! history: the claim walks the live table's pending index, the completion deletes live rows by
//! primary key and appends outcomes at the right edge of a time-ordered key.
//!
//! Filling happens outside the timed region (`iter_custom`); each sample claims and completes
//! [`JOBS`] fresh jobs, as a replica's claim and group commit would, with asynchronous commits
//! so that the figure is the statements' cost rather than the disk's flush latency.
// `criterion_group!` and `criterion_main!` generate functions that cannot carry doc comments.
// A bench aborts on a failed setup step: `expect` names the step.
#![allow(
    missing_docs,
    clippy::missing_docs_in_private_items,
    clippy::expect_used
)]

mod common;

use common::history::{add_history, HISTORY};
use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer;
use std::time::{Duration, Instant};

/// Jobs claimed and completed per sample.
const JOBS: usize = 100;

/// Claim + fenced completion of [`JOBS`] jobs, with no history and with [`HISTORY`] ended jobs.
fn history(c: &mut Criterion) {
    let rt = common::runtime();
    let db = BenchDb::create(&rt, "durable_etl_bench_history");
    let pool = rt.block_on(db.pool(1));
    let mut group = c.benchmark_group("claim_and_complete_with_history");
    group.throughput(Throughput::Elements(JOBS as u64));
    let claimant = Claimant {
        owner_id: "history",
        owner_locked: false,
        lease: Duration::from_secs(60),
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: &["noop"],
    };
    for ended in [0, HISTORY] {
        rt.block_on(async {
            db.reset().await;
            add_history(&db, ended).await;
        });
        group.bench_with_input(BenchmarkId::from_parameter(ended), &ended, |b, _| {
            b.to_async(&rt).iter_custom(|iters| {
                let (db, pool) = (&db, pool.clone());
                async move {
                    let conn = pool.get().await.expect("conn");
                    let conn: &tokio_postgres::Client = &conn;
                    // The statements' own cost, not the WAL flush of their commits (which no
                    // history changes, and which on this machine varies more than they do).
                    conn.batch_execute("SET synchronous_commit = off")
                        .await
                        .expect("set");
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        db.fill(JOBS).await;
                        let start = Instant::now();
                        let claimed = claimer::claim(conn, claimant, JOBS).await.expect("claim");
                        let entries: Vec<_> = claimed.iter().map(|j| (j.lease(), None)).collect();
                        let done = completer::succeed_many(conn, &entries)
                            .await
                            .expect("succeed")
                            .len();
                        total += start.elapsed();
                        assert_eq!(done, JOBS);
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
    targets = history
}
criterion_main!(benches);
