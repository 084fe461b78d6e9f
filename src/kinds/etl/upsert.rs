//! The target rows' upserts: one job's rows in one statement ([`UPSERT_SQL`]), and the rows of
//! several jobs of a commit batch in a few set-based statements ([`UPSERT_SET_SQL`]), with what
//! each job's rows came to (inserted, updated, unchanged).
//!
//! Invariants this module keeps:
//! - Every statement upserts its rows in key order (owner, dataset, record key, compared
//!   bytewise), so concurrent loads lock rows in the same order and do not deadlock each other.
//! - A row whose data is unchanged is not rewritten (and keeps the job that last changed it).
//! - A set's results are the ones the same jobs would get one by one, in batch order: no
//!   statement holds two rows of one target key, so a job writing a key an earlier job of the
//!   set writes goes to a later statement (a later round) and sees that job's row, as it would
//!   after it; each job's counts are read off the rows its own job id marks.
//! - A failed statement fails the whole set; the caller's savepoint takes back the rounds before.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;
use uuid::Uuid;

/// The rows one job loads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The owner digest the rows belong to.
    pub(crate) owner_key: &'a [u8],
    /// The target dataset.
    pub(crate) dataset: &'a str,
    /// The job writing them.
    pub(crate) job_id: Uuid,
    /// Record key → transformed record, in key order.
    pub(crate) rows: &'a BTreeMap<String, Value>,
}

/// What one job's upsert did to its rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// Rows inserted.
    pub(crate) inserted: usize,
    /// Rows changed.
    pub(crate) updated: usize,
    /// Rows found already as the job would have written them (left untouched).
    pub(crate) unchanged: usize,
}

impl Written {
    /// The counts of a job of `total` rows of which `written` were written, `inserted` of them
    /// inserted.
    fn of(total: usize, written: usize, inserted: usize) -> Written {
        Written {
            inserted,
            updated: written - inserted,
            unchanged: total - written,
        }
    }
}

/// Upserts the rows `$3`/`$4` (keys and records, in key order) of owner `$1`, dataset `$2`,
/// written by job `$5`; returns one row per row written, `true` where it was inserted.
///
/// Locks: a row lock on each target row it inserts or changes, taken in key order; rows whose
/// data is unchanged are left untouched (the `WHERE` on the update), but still locked for the
/// statement's check. Waits at most `lock_timeout` for a row another session holds.
pub const UPSERT_SQL: &str = "
INSERT INTO etl_target_rows AS t (owner_key, dataset, record_key, record, written_by_job,
                                  updated_at)
SELECT $1, $2, u.record_key, u.record, $5, now()
  FROM unnest($3::text[], $4::jsonb[]) WITH ORDINALITY AS u(record_key, record, n)
 ORDER BY u.n
    ON CONFLICT (owner_key, dataset, record_key) DO UPDATE
   SET record = EXCLUDED.record, written_by_job = EXCLUDED.written_by_job,
       updated_at = EXCLUDED.updated_at
 WHERE t.record IS DISTINCT FROM EXCLUDED.record
RETURNING (t.xmax = 0)";

/// Upserts the rows of one round of a set: row `i` is owner `$1[i]`, dataset `$2[i]`, key
/// `$3[i]`, record `$4[i]`, written by job `$5[i]`, in key order across the whole statement
/// (owner, dataset, key), no key twice; returns the writing job of each row written, and
/// `true` where it was inserted.
///
/// Locks: as [`UPSERT_SQL`], over every job's rows at once: a row lock on each target row it
/// inserts or changes, taken in key order across all the round's jobs (so two concurrent
/// rounds, or a round and a single job's upsert, lock shared rows in the same order), and an
/// unchanged row is still locked for the check. Waits at most `lock_timeout` for a row another
/// session holds; the foreign key of `written_by_job` takes a `FOR KEY SHARE` lock on each
/// writing job's live row, which the batch already holds `FOR NO KEY UPDATE` (compatible).
pub(crate) const UPSERT_SET_SQL: &str = "
INSERT INTO etl_target_rows AS t (owner_key, dataset, record_key, record, written_by_job,
                                  updated_at)
SELECT u.owner_key, u.dataset, u.record_key, u.record, u.job, now()
  FROM unnest($1::bytea[], $2::text[], $3::text[], $4::jsonb[], $5::uuid[]) WITH ORDINALITY
       AS u(owner_key, dataset, record_key, record, job, n)
 ORDER BY u.n
    ON CONFLICT (owner_key, dataset, record_key) DO UPDATE
   SET record = EXCLUDED.record, written_by_job = EXCLUDED.written_by_job,
       updated_at = EXCLUDED.updated_at
 WHERE t.record IS DISTINCT FROM EXCLUDED.record
RETURNING t.written_by_job, (t.xmax = 0)";

/// Upserts one job's rows ([`UPSERT_SQL`]).
///
/// # Errors
/// The statement's.
pub(crate) async fn one(
    tx: &Transaction<'_>,
    target: Target<'_>,
) -> Result<Written, tokio_postgres::Error> {
    let keys: Vec<&str> = target.rows.keys().map(String::as_str).collect();
    let records: Vec<&Value> = target.rows.values().collect();
    let written = tx
        .query_typed(
            UPSERT_SQL,
            &[
                (&target.owner_key, Type::BYTEA),
                (&target.dataset, Type::TEXT),
                (&keys, Type::TEXT_ARRAY),
                (&records, Type::JSONB_ARRAY),
                (&target.job_id, Type::UUID),
            ],
        )
        .await?;
    let inserted = written.iter().filter(|r| r.get::<_, bool>(0)).count();
    Ok(Written::of(target.rows.len(), written.len(), inserted))
}

/// The identity of a target row: owner, dataset, record key.
type RowKey<'a> = (&'a [u8], &'a str, &'a str);

/// The round of each target: one after the latest earlier target that writes one of its keys
/// (or is the same job), else the first. Each round holds each key at most once, and a target
/// comes after every earlier one it shares a key with.
fn rounds(targets: &[Target<'_>]) -> Vec<usize> {
    let mut last_of_key: HashMap<RowKey<'_>, usize> = HashMap::new();
    let mut last_of_job: HashMap<Uuid, usize> = HashMap::new();
    let mut rounds = Vec::with_capacity(targets.len());
    for target in targets {
        let keys = target
            .rows
            .keys()
            .map(|k| (target.owner_key, target.dataset, k.as_str()));
        let after = keys
            .clone()
            .filter_map(|key| last_of_key.get(&key))
            .chain(last_of_job.get(&target.job_id))
            .map(|round| round + 1)
            .max()
            .unwrap_or(0);
        for key in keys {
            last_of_key.insert(key, after);
        }
        last_of_job.insert(target.job_id, after);
        rounds.push(after);
    }
    rounds
}

/// Upserts the rows of every target, in as few statements ([`UPSERT_SET_SQL`]) as keys shared
/// between them allow (one when none share a key); returns each target's counts, in order.
///
/// # Errors
/// The first statement's that fails: the rounds before it stay written, for the caller's
/// savepoint to take back.
pub(crate) async fn set(
    tx: &Transaction<'_>,
    targets: &[Target<'_>],
) -> Result<Vec<Written>, tokio_postgres::Error> {
    let rounds = rounds(targets);
    let mut written: Vec<(usize, usize)> = vec![(0, 0); targets.len()];
    for round in 0..rounds.iter().max().map_or(0, |last| last + 1) {
        let members: Vec<usize> = (0..targets.len()).filter(|&i| rounds[i] == round).collect();
        let mut rows: Vec<(RowKey<'_>, &Value, Uuid)> = members
            .iter()
            .flat_map(|&i| {
                let t = targets[i];
                t.rows
                    .iter()
                    .map(move |(k, v)| ((t.owner_key, t.dataset, k.as_str()), v, t.job_id))
            })
            .collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let owners: Vec<&[u8]> = rows.iter().map(|r| r.0 .0).collect();
        let datasets: Vec<&str> = rows.iter().map(|r| r.0 .1).collect();
        let keys: Vec<&str> = rows.iter().map(|r| r.0 .2).collect();
        let records: Vec<&Value> = rows.iter().map(|r| r.1).collect();
        let jobs: Vec<Uuid> = rows.iter().map(|r| r.2).collect();
        let returned = tx
            .query_typed(
                UPSERT_SET_SQL,
                &[
                    (&owners, Type::BYTEA_ARRAY),
                    (&datasets, Type::TEXT_ARRAY),
                    (&keys, Type::TEXT_ARRAY),
                    (&records, Type::JSONB_ARRAY),
                    (&jobs, Type::UUID_ARRAY),
                ],
            )
            .await?;
        let member_of: HashMap<Uuid, usize> =
            members.iter().map(|&i| (targets[i].job_id, i)).collect();
        for row in &returned {
            if let Some(&i) = member_of.get(&row.get::<_, Uuid>(0)) {
                written[i].0 += 1;
                written[i].1 += usize::from(row.get::<_, bool>(1));
            }
        }
    }
    Ok(targets
        .iter()
        .zip(written)
        .map(|(t, (written, inserted))| Written::of(t.rows.len(), written, inserted))
        .collect())
}

#[cfg(test)]
mod tests;
