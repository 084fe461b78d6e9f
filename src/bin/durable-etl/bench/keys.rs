//! The per-key figures of a run with `--keys`: how soon the hot key's jobs were claimed, the next
//! [`WARM_KEYS`] keys' (busy enough to wait for their own running job now and then under a key
//! cap of 1), and the cold keys' (every other), so that what a key cap costs the cold keys shows
//! beside an uncapped run.
//!
//! Invariants this module keeps:
//! - A job's key is read from its number, not from the database (the key leaves with the live
//!   row): a job the bench inserted itself (`load::insert_noops`: fill, saturated top-ups) carries
//!   `sha256(g)` as its intake row's idempotency digest; a producer's job (enqueued through the
//!   library's API, without a key) is numbered by the producer that sent it (`producers`); and
//!   [`zipf_index`] gives job `g`'s key, as the enqueue did.
//! - Only succeeded jobs count, with their enqueue → claim time on the database clock, as the
//!   report's `enqueue_to_start_ms`.

use super::percentiles::Percentiles;
use super::shape::{zipf_index, Shape};
use durable_etl::error::Error;
use serde::Serialize;

/// The keys after the hot one that count as warm, not cold: `k1` to `k9`.
pub(crate) const WARM_KEYS: usize = 9;

/// Enqueue → claim of the hot key's jobs, the warm keys' and the cold keys'.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KeyFigures {
    /// Jobs of the hot key (`k0`).
    pub(crate) hot_enqueue_to_start_ms: Percentiles,
    /// Jobs of the warm keys (`k1` to `k9`).
    pub(crate) warm_enqueue_to_start_ms: Percentiles,
    /// Jobs of every other key (`k10` on).
    pub(crate) cold_enqueue_to_start_ms: Percentiles,
}

/// The succeeded jobs, by number (the bench numbers its jobs from 0, one intake row each), with
/// their enqueue → claim time in milliseconds.
///
/// Locks: none (reads the intake, through its idempotency index, and the jobs view).
const BY_NUMBER_SQL: &str = "
SELECT g, extract(epoch FROM j.started_at - j.created_at)::float8 * 1000
  FROM generate_series(0, (SELECT count(*) FROM etl_job_intake) - 1) AS g
  JOIN etl_job_intake i
    ON i.owner_key = sha256('bench'::bytea) AND i.idempotency_key_digest = sha256(g::text::bytea)
  JOIN etl_jobs j ON j.id = i.id
 WHERE j.status = 'succeeded'";

/// The figures of a run of `noop` jobs shaped by `shape`, or `None` without `--keys`:
/// the succeeded jobs the bench inserted itself, read here, and `offered`, the producers'
/// succeeded jobs as (number, enqueue → claim in milliseconds).
///
/// # Errors
/// The database error of the read.
pub(crate) async fn figures(
    client: &tokio_postgres::Client,
    shape: &Shape,
    offered: &[(usize, f64)],
) -> Result<Option<KeyFigures>, Error> {
    if shape.keys == 0 {
        return Ok(None);
    }
    let rows = client.query(BY_NUMBER_SQL, &[]).await?;
    let inserted = rows.iter().map(|row| {
        (
            usize::try_from(row.get::<_, i64>(0)).unwrap_or(0),
            row.get(1),
        )
    });
    let (mut hot, mut warm, mut cold) = (Vec::new(), Vec::new(), Vec::new());
    for (number, ms) in inserted.chain(offered.iter().copied()) {
        match zipf_index(shape.keys, number) {
            0 => hot.push(ms),
            key if key <= WARM_KEYS => warm.push(ms),
            _ => cold.push(ms),
        }
    }
    Ok(Some(KeyFigures {
        hot_enqueue_to_start_ms: Percentiles::of(hot),
        warm_enqueue_to_start_ms: Percentiles::of(warm),
        cold_enqueue_to_start_ms: Percentiles::of(cold),
    }))
}
