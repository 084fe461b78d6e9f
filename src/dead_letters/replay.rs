//! Replay of dead letters: each letter makes at most one new job, linked from the letter, with
//! the payload its owner sends again (checked against the job's stored fingerprint) or the one
//! retained sealed for it.
//!
//! Invariants this module keeps:
//! - A letter is replayed at most once, whoever asks and however often: the replay row-locks
//!   the letter, reads whether it was replayed, enqueues and marks it in one transaction, so
//!   concurrent or repeated replays serialize on the letter and the later ones find the job the
//!   first made. The new job's idempotency key is derived from the letter too, so even a
//!   replay that bypassed the mark could not make a second job.
//! - A body sent again is accepted only when its keyed fingerprint is the job's stored one: a
//!   replay can never run a payload its owner did not submit. A job enqueued without an
//!   idempotency key kept no fingerprint of its payload, so its letter replays only from a
//!   retained payload.
//! - A retained payload opens only under the key that sealed it ([`PayloadKey::open`]); it is
//!   deleted when its letter is replayed (the new job keeps its own, under the current key, when
//!   the letter's was kept) or discarded.
//! - A bulk replay takes letters in chunks, each chunk in one transaction: a cut connection or
//!   a crash loses at most the chunk in flight, which a later bulk replay takes again, and every
//!   letter still makes exactly one job.
//! - Who asked is recorded on the letter (an API key's id, or a caller's label), never an owner.

use crate::codes::Code;
use crate::dead_letters::letters::{filtered, LetterFilter};
use crate::dead_letters::retention::Retain;
use crate::dead_letters::seal::PayloadKey;
use crate::digest::Secret;
use crate::error::Error;
use crate::intake::Rejection;
use crate::jobs::enqueue::{self, fingerprint, Submission};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// The most letters one transaction of a bulk replay takes.
pub const REPLAY_CHUNK: i64 = 200;

/// The longest label of who asked for a replay, in characters.
pub const REPLAYED_BY_MAX: usize = 128;

/// What a replay of one letter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// The job the letter's replay made (now, or by an earlier replay).
    pub job_id: Uuid,
    /// Whether this call made it (`false`: an earlier replay had).
    pub made: bool,
}

/// What a bulk replay of the letters matching a filter would do, read before it runs (a count
/// preview: letters failing or replayed meanwhile change it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayPreview {
    /// Matching letters whose payload is retained under the current key: the replay takes them.
    pub replayable: u64,
    /// Matching letters with no payload retained: the replay leaves them.
    pub not_retained: u64,
    /// Matching letters whose payload was sealed under another key: the replay leaves them.
    pub unreadable: u64,
}

/// What a bulk replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkReplay {
    /// Letters this call replayed (one new job each).
    pub made: u64,
    /// Matching letters left open because their payload was not retained (replay them one by
    /// one with their body).
    pub not_retained: u64,
    /// Matching letters left open because their retained payload does not open under the
    /// current key (sealed under a key since rotated or destroyed).
    pub unreadable: u64,
}

/// The columns a replay reads of letter `l`, its intake row `i` and its retained payload `r`.
macro_rules! replay_columns {
    () => {
        "l.job_id, l.owner_key, l.kind, i.queue, i.priority, i.max_attempts,
       i.request_fingerprint, l.replayed_job_id, r.key_id, r.sealed, r.ttl_s"
    };
}

/// Letter `$1` of owner `$2` (any owner's when null), row-locked, with what its replay needs.
///
/// Locks: `FOR UPDATE` on the letter row: replays of one letter serialize here, and the later
/// one reads the letter as the earlier one left it.
pub const LOCK_ONE_SQL: &str = concat!(
    "
SELECT ",
    replay_columns!(),
    "
  FROM etl_dead_letters l
  JOIN etl_job_intake i ON i.id = l.job_id
  LEFT JOIN etl_retained_payloads r ON r.job_id = l.job_id AND ",
    kept!(),
    "
 WHERE l.job_id = $1 AND ($2::bytea IS NULL OR l.owner_key = $2)
   FOR UPDATE OF l"
);

/// Up to `$7` open letters (the filter of `letters_matching!`, `$1` to `$6`) whose payload is
/// retained under key `$8`, except those in `$9`, oldest first, row-locked, with what their
/// replay needs.
///
/// Locks: `FOR UPDATE` on each letter, in the order taken (oldest first, as every bulk replay
/// takes them, so two never deadlock). A letter another replay holds is waited for, then
/// re-checked: one it replayed meanwhile is no longer open and is left out.
pub const LOCK_CHUNK_SQL: &str = concat!(
    "
SELECT ",
    replay_columns!(),
    "
  FROM etl_dead_letters l
  JOIN etl_job_intake i ON i.id = l.job_id
  JOIN etl_retained_payloads r ON r.job_id = l.job_id AND ",
    kept!(),
    "
 WHERE ",
    letters_matching!(),
    "
   AND r.key_id = $8 AND NOT l.job_id = ANY($9)
 ORDER BY l.failed_at, l.job_id
 LIMIT $7
   FOR UPDATE OF l"
);

/// Whether any open letter (the filter, `$1` to `$6`) has a payload retained under key `$7`,
/// except those in `$8`: what [`LOCK_CHUNK_SQL`] would take, were none held.
///
/// Locks: none (a read).
pub const ELIGIBLE_SQL: &str = concat!(
    "
SELECT EXISTS (
    SELECT 1
      FROM etl_dead_letters l
      JOIN etl_retained_payloads r ON r.job_id = l.job_id AND ",
    kept!(),
    "
     WHERE ",
    letters_matching!(),
    "
       AND r.key_id = $7 AND NOT l.job_id = ANY($8))"
);

/// How many open letters (the filter, `$1` to `$6`) have no payload retained (`not_retained`),
/// how many have one under a key other than `$7` (`other_key`), and how many have one under key
/// `$7` (`replayable`: what a bulk replay under that key takes).
///
/// Locks: none (a read).
pub const UNREPLAYABLE_SQL: &str = concat!(
    "
SELECT count(*) FILTER (WHERE r.job_id IS NULL),
       count(*) FILTER (WHERE r.key_id <> $7),
       count(*) FILTER (WHERE r.key_id = $7)
  FROM etl_dead_letters l
  LEFT JOIN etl_retained_payloads r ON r.job_id = l.job_id AND ",
    kept!(),
    "
 WHERE ",
    letters_matching!()
);

/// Marks letters `$1` replayed as jobs `$2` (parallel arrays), by `$3`, and deletes their
/// retained payloads.
///
/// Locks: updates the letter rows the transaction holds; deletes their retained payloads.
pub const MARK_SQL: &str = "
WITH marked AS (
    UPDATE etl_dead_letters l
       SET replayed_job_id = m.job_id, replayed_at = now(), replayed_by = $3
      FROM unnest($1::uuid[], $2::uuid[]) AS m(letter, job_id)
     WHERE l.job_id = m.letter AND l.replayed_job_id IS NULL
 RETURNING l.job_id
)
DELETE FROM etl_retained_payloads r USING marked m WHERE r.job_id = m.job_id";

/// One locked letter, as its replay needs it.
struct Locked {
    /// The letter (its failed job's id).
    id: Uuid,
    /// Its owner's digest.
    owner: [u8; 32],
    /// The job's kind.
    kind: String,
    /// The job's queue.
    queue: String,
    /// The job's priority.
    priority: i16,
    /// The job's attempt bound.
    max_attempts: i32,
    /// The job's stored request fingerprint.
    fingerprint: Vec<u8>,
    /// The job an earlier replay made.
    replayed: Option<Uuid>,
    /// The retained payload: its key id, the sealed bytes and how long it was to be kept.
    retained: Option<(String, Vec<u8>, i32)>,
}

impl Locked {
    /// The letter of a row of `replay_columns!`.
    fn of(row: &Row) -> Result<Locked, Error> {
        let owner: Vec<u8> = row.try_get(1)?;
        let key_id: Option<String> = row.try_get(8)?;
        let sealed: Option<Vec<u8>> = row.try_get(9)?;
        let ttl: Option<i32> = row.try_get(10)?;
        Ok(Locked {
            id: row.try_get(0)?,
            owner: owner.try_into().map_err(|_| Error::Internal)?,
            kind: row.try_get(2)?,
            queue: row.try_get(3)?,
            priority: row.try_get(4)?,
            max_attempts: row.try_get(5)?,
            fingerprint: row.try_get(6)?,
            replayed: row.try_get(7)?,
            retained: key_id.zip(sealed).zip(ttl).map(|((k, s), t)| (k, s, t)),
        })
    }

    /// The payload to replay: `body`, when its fingerprint is the job's; else the retained
    /// payload, opened under `key`.
    fn payload(
        &self,
        secret: &Secret,
        key: Option<&PayloadKey>,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, Error> {
        if let Some(body) = body {
            if fingerprint(secret, body)[..] != self.fingerprint[..] {
                return Err(Rejection::new(Code::ReplayBodyMismatch, "").into());
            }
            return Ok(body.clone());
        }
        let Some((key_id, sealed, _)) = &self.retained else {
            return Err(Rejection::new(Code::PayloadNotRetained, "").into());
        };
        key.and_then(|k| k.open(self.id, key_id, sealed))
            .ok_or_else(|| Rejection::new(Code::PayloadUnreadable, "").into())
    }

    /// The idempotency key of the job this letter's replay makes.
    fn replay_key(&self) -> String {
        format!("durable-etl:replay:{}", self.id)
    }
}

/// Refuses a `by` that is empty or longer than [`REPLAYED_BY_MAX`] characters.
fn check_by(by: &str) -> Result<(), Error> {
    if (1..=REPLAYED_BY_MAX).contains(&by.chars().count()) {
        Ok(())
    } else {
        Err(Rejection::new(Code::RequestInvalid, "/replayed_by").into())
    }
}

/// The submission of `letter`'s replay with `payload`, under the idempotency key `key_text`
/// ([`Locked::replay_key`]), its payload retained under `key` if the letter's was.
fn replay_of<'a>(
    letter: &'a Locked,
    payload: &serde_json::Value,
    key_text: &'a str,
    key: Option<&'a PayloadKey>,
) -> Submission<'a> {
    let retain = match (&letter.retained, key) {
        (Some((_, _, ttl)), Some(key)) => Some(Retain {
            key,
            ttl: Duration::from_secs(u64::try_from(*ttl).unwrap_or(1)),
        }),
        _ => None,
    };
    Submission {
        payload: payload.clone(),
        idempotency_key: Some(key_text),
        max_attempts: letter.max_attempts,
        run_at: None,
        dated: false,
        replaces: None,
        queue: Some(&letter.queue),
        priority: letter.priority,
        concurrency_key: None,
        retain,
    }
}

/// Enqueues the replays of `letters` (with their payloads) on `tx`, each for its letter's
/// owner in its job's queue, priority and attempt bound, and marks the letters replayed by
/// `by`. A letter whose payload was retained has its new job's retained too, under `key`. The
/// letters of one owner and kind go in one enqueue (one statement per chunk of them).
async fn enqueue_replays(
    tx: &tokio_postgres::Transaction<'_>,
    secret: &Secret,
    key: Option<&PayloadKey>,
    letters: &[(Locked, serde_json::Value)],
    by: &str,
) -> Result<Vec<Uuid>, Error> {
    let keys: Vec<String> = letters.iter().map(|(l, _)| l.replay_key()).collect();
    // The letters' positions by (owner, kind), in the order each pair first comes.
    let mut groups: Vec<(&[u8; 32], &str, Vec<usize>)> = Vec::new();
    for (i, (letter, _)) in letters.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(owner, kind, _)| **owner == letter.owner && *kind == letter.kind)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((&letter.owner, &letter.kind, vec![i])),
        }
    }
    let mut made = vec![Uuid::nil(); letters.len()];
    for (owner, kind, members) in &groups {
        let submissions = members
            .iter()
            .map(|&i| replay_of(&letters[i].0, &letters[i].1, &keys[i], key))
            .collect();
        let done = enqueue::submit(tx, secret, owner, kind, submissions).await?;
        if done.len() != members.len() {
            return Err(Error::Internal);
        }
        for (&i, job) in members.iter().zip(done) {
            made[i] = job.id;
        }
    }
    let ids: Vec<Uuid> = letters.iter().map(|(l, _)| l.id).collect();
    tx.execute_typed(
        MARK_SQL,
        &[
            (&ids, Type::UUID_ARRAY),
            (&made, Type::UUID_ARRAY),
            (&by, Type::TEXT),
        ],
    )
    .await?;
    Ok(made)
}

/// Replays letter `id` of `owner` (any owner's when `None`) once, as `by` asked: with `body`,
/// the job's payload sent again, or without it from its retained payload.
///
/// # Errors
/// [`Error::Rejected`] with `not_found` (no such letter for this owner), `replay_body_mismatch`
/// (the body is not the job's, or the job kept no fingerprint), `payload_not_retained`,
/// `payload_unreadable` (sealed under a key this caller does not hold) or `request_invalid` (a
/// `by` that is empty or too long); database errors. Nothing is written on an error.
pub(crate) async fn replay(
    client: &mut impl GenericClient,
    secret: &Secret,
    key: Option<&PayloadKey>,
    owner: Option<&[u8; 32]>,
    id: Uuid,
    by: &str,
    body: Option<&serde_json::Value>,
) -> Result<Replayed, Error> {
    check_by(by)?;
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_opt(LOCK_ONE_SQL, &[(&id, Type::UUID), (&owner, Type::BYTEA)])
        .await?
        .ok_or_else(|| Error::from(Rejection::new(Code::NotFound, "")))?;
    let letter = Locked::of(&row)?;
    if let Some(job_id) = letter.replayed {
        return Ok(Replayed {
            job_id,
            made: false,
        });
    }
    let payload = letter.payload(secret, key, body)?;
    let made = enqueue_replays(&tx, secret, key, &[(letter, payload)], by).await?;
    tx.commit().await?;
    Ok(Replayed {
        job_id: made.first().copied().ok_or(Error::Internal)?,
        made: true,
    })
}

/// Replays every open letter of `owner` (every owner's when `None`) matching `filter` whose
/// payload is retained under `key`, as `by` asked, in transactions of [`REPLAY_CHUNK`] letters;
/// says how many it made and how many matching letters it could not replay, and why.
///
/// # Errors
/// `request_invalid` for a bad `by`; database errors (the chunks before stay replayed, and a
/// later bulk replay takes the rest).
pub(crate) async fn replay_matching(
    client: &mut impl GenericClient,
    secret: &Secret,
    key: &PayloadKey,
    owner: Option<&[u8; 32]>,
    filter: &LetterFilter<'_>,
    by: &str,
) -> Result<BulkReplay, Error> {
    check_by(by)?;
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let key_id = key.id();
    let mut done = BulkReplay::default();
    let mut unopened: Vec<Uuid> = Vec::new();
    loop {
        let tx = client.transaction().await?;
        let extra: [(&(dyn ToSql + Sync), Type); 3] = [
            (&REPLAY_CHUNK, Type::INT8),
            (&key_id, Type::TEXT),
            (&unopened, Type::UUID_ARRAY),
        ];
        let rows = tx
            .query_typed(LOCK_CHUNK_SQL, &filtered(&owner, filter, extra))
            .await?;
        if rows.is_empty() {
            tx.commit().await?;
            // None taken: either none is left, or every one this chunk waited for was replayed
            // by another bulk replay meanwhile (re-checked after its commit), and more may
            // follow them.
            let extra: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key_id, Type::TEXT), (&unopened, Type::UUID_ARRAY)];
            let left: bool = client
                .query_typed_one(ELIGIBLE_SQL, &filtered(&owner, filter, extra))
                .await?
                .try_get(0)?;
            if left {
                continue;
            }
            break;
        }
        let mut letters = Vec::with_capacity(rows.len());
        for row in &rows {
            let letter = Locked::of(row)?;
            match letter.payload(secret, Some(key), None) {
                Ok(payload) => letters.push((letter, payload)),
                Err(_) => unopened.push(letter.id),
            }
        }
        let made = enqueue_replays(&tx, secret, Some(key), &letters, by).await?;
        tx.commit().await?;
        done.made += made.len() as u64;
    }
    let extra: [(&(dyn ToSql + Sync), Type); 1] = [(&key_id, Type::TEXT)];
    let row = client
        .query_typed_one(UNREPLAYABLE_SQL, &filtered(&owner, filter, extra))
        .await?;
    let (not_retained, other_key): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    done.not_retained = u64::try_from(not_retained).unwrap_or(0);
    done.unreadable = u64::try_from(other_key).unwrap_or(0) + unopened.len() as u64;
    Ok(done)
}

/// What a bulk replay of `owner`'s (every owner's when `None`) open letters matching `filter`
/// under `key` would take and leave, counted now.
///
/// # Errors
/// Database errors.
pub(crate) async fn preview(
    client: &impl GenericClient,
    key: &PayloadKey,
    owner: Option<&[u8; 32]>,
    filter: &LetterFilter<'_>,
) -> Result<ReplayPreview, Error> {
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let key_id = key.id();
    let extra: [(&(dyn ToSql + Sync), Type); 1] = [(&key_id, Type::TEXT)];
    let row = client
        .query_typed_one(UNREPLAYABLE_SQL, &filtered(&owner, filter, extra))
        .await?;
    let count = |i: usize| -> Result<u64, Error> {
        let n: i64 = row.try_get(i)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    Ok(ReplayPreview {
        not_retained: count(0)?,
        unreadable: count(1)?,
        replayable: count(2)?,
    })
}
