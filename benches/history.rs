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

use common::BenchDb;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use durable_etl::handler::LedgerEntry;
use durable_etl::worker::claimer::{self, Claimant};
use durable_etl::worker::completer;
use std::time::{Duration, Instant};

/// Jobs claimed and completed per sample.
const JOBS: usize = 100;

/// The ended jobs of the larger history.
const HISTORY: i64 = 1_000_000;

/// Ended jobs appended per statement: each statement stays well inside the setup session's
/// `statement_timeout` even on a slow, busy machine (one 1,000,000-row statement did not).
const HISTORY_CHUNK: i64 = 50_000;

/// Appends `n` ended jobs (succeeded, with their ledger) of another owner, two days old, with
/// time-ordered ids, in chunks of [`HISTORY_CHUNK`], then analyzes the tables.
async fn add_history(db: &BenchDb, n: i64) {
    for first in (1..=n).step_by(usize::try_from(HISTORY_CHUNK).expect("chunk")) {
        let last = (first + HISTORY_CHUNK - 1).min(n);
        db.client
            .batch_execute(&format!(
                "WITH ids AS (
                     SELECT (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::int8
                                         + g / 1000), 12, '0')
                             || '7' || lpad(to_hex(g), 19, '0'))::uuid AS id, g
                       FROM generate_series({first}, {last}) g
                 ), intake AS (
                     INSERT INTO etl_job_intake
                            (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                             max_attempts, run_at, created_at)
                     SELECT id, sha256('history'::bytea), sha256(g::text::bytea),
                            sha256(g::text::bytea), 'noop', 5, now() - interval '2 days',
                            now() - interval '2 days'
                       FROM ids
                 )
                 INSERT INTO etl_job_outcomes
                        (job_id, owner_key, status, attempts, run_at, lease_claim_id,
                         rows_inserted, rows_updated, rows_unchanged, data_checksum, started_at,
                         finished_at)
                 SELECT id, sha256('history'::bytea), 'succeeded', 1, now() - interval '2 days',
                        gen_random_uuid(), 0, 0, 0, sha256(g::text::bytea),
                        now() - interval '2 days', now() - interval '2 days'
                   FROM ids"
            ))
            .await
            .expect("history");
    }
    db.client
        .batch_execute("ANALYZE etl_job_intake, etl_job_outcomes, etl_job_records")
        .await
        .expect("analyze");
}

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
                        let entries: Vec<_> = claimed
                            .iter()
                            .map(|j| (j.lease(), LedgerEntry::default()))
                            .collect();
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
