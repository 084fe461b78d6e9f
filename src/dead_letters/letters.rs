//! The dead letters of one owner, or of all owners: listed newest first by keyset pages,
//! filtered, counted per queue and code, read one by one, and discarded.
//!
//! Invariants this module keeps:
//! - Every read and write is scoped: with an owner, a letter of another owner is as if it did
//!   not exist; without one (an operator's), every owner's letters are seen.
//! - A listing walks one of the letters' indexes (migration 0035), newest first, from its
//!   cursor: never the jobs' history, so a page costs the same at a million ended jobs.
//! - Only metadata leaves: queue, kind, stable code, attempts, times, ids. Never a payload, an
//!   owner or an error message.
//! - A discard deletes the letter and its retained payload in one statement; the job's outcome
//!   stays. A replayed letter is no longer open and is neither listed, counted nor discarded.

use crate::error::Error;
use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// The most letters one page holds.
pub const PAGE_MAX: i64 = 500;

/// The most letters one statement of a bulk discard deletes.
const DISCARD_BATCH: i64 = 1_000;

/// One dead letter: a job that ended `failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Letter {
    /// The failed job's id (the letter's own).
    pub job_id: Uuid,
    /// The queue it waited in.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Its stored failure code.
    pub code: String,
    /// The attempts it was charged.
    pub attempts: i32,
    /// When it failed.
    pub failed_at: DateTime<Utc>,
    /// The job its replay made, if it was replayed.
    pub replayed_job_id: Option<Uuid>,
    /// When it was replayed.
    pub replayed_at: Option<DateTime<Utc>>,
    /// Whether its payload is retained (sealed), so it can be replayed without its body.
    pub retained: bool,
}

/// Which open letters a listing, a count, a bulk discard or a bulk replay takes; every field
/// may be left out.
#[derive(Debug, Clone, Copy, Default)]
pub struct LetterFilter<'a> {
    /// Only letters of this queue.
    pub queue: Option<&'a str>,
    /// Only letters of this kind.
    pub kind: Option<&'a str>,
    /// Only letters with this failure code.
    pub code: Option<&'a str>,
    /// Only letters that failed at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only letters that failed before this instant.
    pub until: Option<DateTime<Utc>>,
}

/// Where a page of letters continues: after the letter that failed at `failed_at` with id
/// `job_id` (the last of the page before), in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LetterCursor {
    /// When the page's last letter failed.
    pub failed_at: DateTime<Utc>,
    /// The page's last letter.
    pub job_id: Uuid,
}

impl LetterCursor {
    /// The cursor as one opaque token (microseconds since the epoch, `.`, the job id).
    pub fn token(&self) -> String {
        format!("{}.{}", self.failed_at.timestamp_micros(), self.job_id)
    }

    /// The cursor a [`LetterCursor::token`] stands for, or `None` for anything else.
    pub fn parse(token: &str) -> Option<LetterCursor> {
        let (micros, id) = token.split_once('.')?;
        Some(LetterCursor {
            failed_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            job_id: Uuid::parse_str(id).ok()?,
        })
    }
}

/// One page of letters, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterPage {
    /// The letters.
    pub letters: Vec<Letter>,
    /// Where the next page starts, when older letters follow.
    pub next: Option<LetterCursor>,
}

/// How many open letters one queue holds with one code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterCount {
    /// The queue.
    pub queue: String,
    /// The failure code.
    pub code: String,
    /// How many.
    pub count: i64,
}

/// Whether the retained payload `r` of letter `l` is still kept: its time to keep, counted from
/// the failure, has not passed. A payload past it is never used, whether maintenance deleted it
/// yet or not.
macro_rules! kept {
    () => {
        "l.failed_at + r.ttl_s * interval '1 second' > now()"
    };
}

/// The columns a letter is read from, over `etl_dead_letters l`.
macro_rules! letter_columns {
    () => {
        concat!(
            "l.job_id, l.queue, l.kind, l.code, l.attempts, l.failed_at, l.replayed_job_id,
       l.replayed_at, EXISTS (SELECT 1 FROM etl_retained_payloads r WHERE r.job_id = l.job_id AND ",
            kept!(),
            ")"
        )
    };
}

/// The open letters of owner `$1` (every owner's when null) matching the filter `$2` queue, `$3`
/// kind, `$4` code, `$5` since, `$6` until (each ignored when null), as SQL over
/// `etl_dead_letters l`. Planned with its parameters' values (an unnamed statement), so a null
/// filter folds away and the index of the filter that is set is walked.
macro_rules! letters_matching {
    () => {
        "l.replayed_job_id IS NULL
   AND ($1::bytea IS NULL OR l.owner_key = $1)
   AND ($2::text IS NULL OR l.queue = $2)
   AND ($3::text IS NULL OR l.kind = $3)
   AND ($4::text IS NULL OR l.code = $4)
   AND ($5::timestamptz IS NULL OR l.failed_at >= $5)
   AND ($6::timestamptz IS NULL OR l.failed_at < $6)"
    };
}

/// A page of open letters (`letters_matching!`), newest first, after the cursor `$7` failed at,
/// `$8` id (from the start when null), at most `$9` of them.
///
/// Locks: none (a read).
pub const LIST_SQL: &str = concat!(
    "
SELECT ",
    letter_columns!(),
    "
  FROM etl_dead_letters l
 WHERE ",
    letters_matching!(),
    "
   AND ($7::timestamptz IS NULL OR (l.failed_at, l.job_id) < ($7, $8::uuid))
 ORDER BY l.failed_at DESC, l.job_id DESC
 LIMIT $9"
);

/// One letter (`$1`), open or replayed, of owner `$2` (any owner's when null).
///
/// Locks: none (a read).
pub const GET_SQL: &str = concat!(
    "
SELECT ",
    letter_columns!(),
    "
  FROM etl_dead_letters l
 WHERE l.job_id = $1 AND ($2::bytea IS NULL OR l.owner_key = $2)"
);

/// The open letters (`letters_matching!`) counted per queue and code, the largest counts
/// first (at most 200 pairs).
///
/// Locks: none (a read).
pub const COUNTS_SQL: &str = concat!(
    "
SELECT l.queue, l.code, count(*)
  FROM etl_dead_letters l
 WHERE ",
    letters_matching!(),
    "
 GROUP BY l.queue, l.code
 ORDER BY count(*) DESC, l.queue, l.code
 LIMIT 200"
);

/// Discards open letters: letter `$7` (any matching the filter when null) among
/// `letters_matching!`, at most `$8` of them; their retained payloads go with them. Returns how
/// many were discarded.
///
/// Locks: row-locks the letters it takes (`FOR UPDATE SKIP LOCKED`: a letter a replay holds is
/// left to it), deletes them and their retained payloads.
pub const DISCARD_SQL: &str = concat!(
    "
WITH taken AS (
    SELECT l.job_id FROM etl_dead_letters l
     WHERE ",
    letters_matching!(),
    "
       AND ($7::uuid IS NULL OR l.job_id = $7)
     LIMIT $8
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM etl_dead_letters l USING taken t WHERE l.job_id = t.job_id RETURNING l.job_id
), kept AS (
    DELETE FROM etl_retained_payloads r USING gone g WHERE r.job_id = g.job_id
)
SELECT count(*) FROM gone"
);

/// The parameters of a statement over `letters_matching!`: `$1` to `$6`, then `extra`.
pub(crate) fn filtered<'a, const N: usize>(
    owner: &'a Option<&'a [u8]>,
    filter: &'a LetterFilter<'a>,
    extra: [(&'a (dyn ToSql + Sync), Type); N],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    let mut params: Vec<(&'a (dyn ToSql + Sync), Type)> = vec![
        (owner, Type::BYTEA),
        (&filter.queue, Type::TEXT),
        (&filter.kind, Type::TEXT),
        (&filter.code, Type::TEXT),
        (&filter.since, Type::TIMESTAMPTZ),
        (&filter.until, Type::TIMESTAMPTZ),
    ];
    params.extend(extra);
    params
}

/// The letter of a row of `letter_columns!`.
fn letter(row: &Row) -> Result<Letter, tokio_postgres::Error> {
    Ok(Letter {
        job_id: row.try_get(0)?,
        queue: row.try_get(1)?,
        kind: row.try_get(2)?,
        code: row.try_get(3)?,
        attempts: row.try_get(4)?,
        failed_at: row.try_get(5)?,
        replayed_job_id: row.try_get(6)?,
        replayed_at: row.try_get(7)?,
        retained: row.try_get(8)?,
    })
}

/// A page of at most `size` (1 to [`PAGE_MAX`]) of `owner`'s open letters matching `filter`,
/// after `after`; one more is read to tell whether a page follows.
///
/// # Errors
/// Database errors.
pub(crate) async fn page(
    client: &impl GenericClient,
    owner: Option<&[u8; 32]>,
    filter: &LetterFilter<'_>,
    after: Option<LetterCursor>,
    size: i64,
) -> Result<LetterPage, Error> {
    let size = size.clamp(1, PAGE_MAX);
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let (at, id) = (after.map(|c| c.failed_at), after.map(|c| c.job_id));
    let limit = size + 1;
    let extra: [(&(dyn ToSql + Sync), Type); 3] = [
        (&at, Type::TIMESTAMPTZ),
        (&id, Type::UUID),
        (&limit, Type::INT8),
    ];
    let rows = client
        .query_typed(LIST_SQL, &filtered(&owner, filter, extra))
        .await?;
    let mut letters = rows.iter().map(letter).collect::<Result<Vec<_>, _>>()?;
    let next = if letters.len() as i64 > size {
        letters.truncate(size as usize);
        letters.last().map(|l| LetterCursor {
            failed_at: l.failed_at,
            job_id: l.job_id,
        })
    } else {
        None
    };
    Ok(LetterPage { letters, next })
}

/// Letter `id` of `owner` (any owner's when `None`), open or replayed.
///
/// # Errors
/// Database errors.
pub(crate) async fn get(
    client: &impl GenericClient,
    owner: Option<&[u8; 32]>,
    id: Uuid,
) -> Result<Option<Letter>, Error> {
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let row = client
        .query_typed_opt(GET_SQL, &[(&id, Type::UUID), (&owner, Type::BYTEA)])
        .await?;
    Ok(row.as_ref().map(letter).transpose()?)
}

/// `owner`'s open letters matching `filter`, counted per queue and code.
///
/// # Errors
/// Database errors.
pub(crate) async fn counts(
    client: &impl GenericClient,
    owner: Option<&[u8; 32]>,
    filter: &LetterFilter<'_>,
) -> Result<Vec<LetterCount>, Error> {
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let rows = client
        .query_typed(COUNTS_SQL, &filtered(&owner, filter, []))
        .await?;
    rows.iter()
        .map(|r| {
            Ok(LetterCount {
                queue: r.try_get(0)?,
                code: r.try_get(1)?,
                count: r.try_get(2)?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(Error::from)
}

/// Discards `owner`'s open letter `id`, or, with `id` `None`, every open letter matching
/// `filter` (in statements of at most a thousand); returns how many were discarded.
///
/// # Errors
/// Database errors (the statements before the failing one stay done).
pub(crate) async fn discard(
    client: &impl GenericClient,
    owner: Option<&[u8; 32]>,
    filter: &LetterFilter<'_>,
    id: Option<Uuid>,
) -> Result<u64, Error> {
    let owner: Option<&[u8]> = owner.map(|o| &o[..]);
    let mut total = 0;
    loop {
        let extra: [(&(dyn ToSql + Sync), Type); 2] =
            [(&id, Type::UUID), (&DISCARD_BATCH, Type::INT8)];
        let row = client
            .query_typed_one(DISCARD_SQL, &filtered(&owner, filter, extra))
            .await?;
        let n: i64 = row.try_get(0)?;
        total += u64::try_from(n).unwrap_or(0);
        if id.is_some() || n < DISCARD_BATCH {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_token_round_trips_and_junk_is_refused() {
        let cursor = LetterCursor {
            failed_at: DateTime::from_timestamp_micros(1_765_000_000_123_456).unwrap(),
            job_id: Uuid::now_v7(),
        };
        assert_eq!(LetterCursor::parse(&cursor.token()), Some(cursor));
        for junk in [
            "",
            "12",
            "x.y",
            "12.not-a-uuid",
            &format!("x.{}", cursor.job_id),
        ] {
            assert_eq!(LetterCursor::parse(junk), None, "{junk}");
        }
    }
}
