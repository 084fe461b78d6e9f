//! The next-due read: how long until the next deferred job of a replica's queues and kinds is
//! due (see the parent module's invariants).

use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

/// How long until the next deferred pending job of the queues `$1` and kinds `$2` is due, in whole
/// milliseconds rounded up (NULL if none is deferred).
///
/// A deferred job's virtual deadline is never before its due time (`sort_at >= run_at > now()`)
/// and at most the largest priority offset after it. So for each (queue, kind), `first` is the
/// first deferred job in `(sort_at, id)` order, and the earliest due time is among the deferred
/// jobs whose `sort_at` is at most that offset after `first`'s: `window` reads the first
/// [`NEXT_DUE_WINDOW`] of those in order. The answer is exact unless more deferred jobs than that
/// sort within the offset of the first (many jobs deferred to about one instant): then it is the
/// earliest of those read, and a later-sorting job of a lower priority due before it is found by
/// the poll, as every job is.
///
/// Locks: none (snapshot reads of `etl_job_records_claim_idx`, two bounded probes per (queue,
/// kind): the first passes over due jobs of a positive priority whose deadline is still ahead,
/// at most the jobs due within the largest offset; the second reads at most
/// [`NEXT_DUE_WINDOW`] rows).
pub const NEXT_DUE_SQL: &str = "
SELECT ceil(extract(epoch FROM min(w.run_at) - now()) * 1000)::int8
  FROM unnest($1::text[]) AS q(queue)
 CROSS JOIN unnest($2::text[]) AS k(kind)
 CROSS JOIN LATERAL (
     SELECT f.sort_at
       FROM etl_job_records f
      WHERE f.status = 'pending' AND f.queue = q.queue AND f.kind = k.kind
        AND f.sort_at > now() AND f.run_at > now()
      ORDER BY f.sort_at, f.id
      LIMIT 1
 ) first
 CROSS JOIN LATERAL (
     SELECT x.run_at
       FROM etl_job_records x
      WHERE x.status = 'pending' AND x.queue = q.queue AND x.kind = k.kind
        AND x.sort_at >= first.sort_at AND x.sort_at <= durable_etl_sort_at(first.sort_at, 9::int2)
        AND x.run_at > now()
      ORDER BY x.sort_at, x.id
      LIMIT 64
 ) w";

/// How many deferred jobs [`NEXT_DUE_SQL`] reads per (queue, kind) after the first, at most.
pub const NEXT_DUE_WINDOW: usize = 64;

/// The types of [`NEXT_DUE_SQL`]'s parameters.
pub(super) const NEXT_DUE_PARAMS: [Type; 2] = [Type::TEXT_ARRAY, Type::TEXT_ARRAY];

/// The time until the next deferred job of `queues` and `kinds` is due, if one is pending.
///
/// # Errors
/// The database error of the query.
pub async fn next_due(
    client: &impl GenericClient,
    queues: &[&str],
    kinds: &[&str],
) -> Result<Option<Duration>, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            NEXT_DUE_SQL,
            &[(&queues, Type::TEXT_ARRAY), (&kinds, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(until_due(&row))
}

/// The time until due of [`NEXT_DUE_SQL`]'s row.
pub(super) fn until_due(row: &Row) -> Option<Duration> {
    let millis: Option<i64> = row.get(0);
    millis.map(|m| Duration::from_millis(u64::try_from(m).unwrap_or(0)))
}
