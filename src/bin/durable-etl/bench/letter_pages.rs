//! `bench dead-letters`' listing half: a history of ended jobs filled by bulk statements, then
//! pages of [`DeadLetters::list`] timed over it, with no filter and with an owner, a queue and a
//! code filter, each at the first page and deep into the letters.
//!
//! - **History**: `history` ended jobs of the `noop` kind, one millisecond-ordered id each
//!   ([`HISTORY_SPAN`] back from now, evenly spaced), each an intake row and an outcome; one in
//!   [`FAILED_EVERY`] failed, with its letter, spread evenly over [`OWNERS`] owners, the
//!   queues of [`QUEUES`] and the codes of [`CODES`]; the others succeeded. Then `ANALYZE`, as
//!   autovacuum would after such a load.
//! - **Pages**: per filter, the first page read `pages` times, then a keyset walk of up to
//!   `pages` consecutive pages from the middle of the filter's letters (a cursor read untimed by
//!   one statement of the bench's own), each page timed from the call to its answer on the
//!   bench's session (a round trip to the server included).
//!
//! Invariants this module keeps:
//! - Every page is read by the library's call (the one the HTTP API and the console make), with
//!   an operator's handle, or an owner's for the owner filter; the bench times it and reads its
//!   plan, nothing else.
//! - The history's rows are those the product writes for ended jobs (intake, outcome, letter),
//!   with the checks of the schema; it is set-up, never timed.

use durable_etl::dead_letters::{DeadLetters, LetterCursor, LetterFilter, LIST_SQL};
use durable_etl::digest::Secret;
use durable_etl::error::Error;
use serde::Serialize;
use std::time::Duration;
use tokio::time::Instant;

use super::percentiles::Percentiles;

/// The span of time the history's jobs ended over, ending now.
const HISTORY_SPAN: Duration = Duration::from_secs(30 * 24 * 3600);

/// One ended job in this many failed (a letter); the others succeeded.
pub(super) const FAILED_EVERY: i64 = 10;

/// The history's owners: principals `bench-history-0` … `bench-history-{OWNERS - 1}`.
pub(super) const OWNERS: usize = 5;

/// The history's queues.
pub(super) const QUEUES: [&str; 4] = ["mail", "billing", "reports", "exports"];

/// The history's failure codes.
pub(super) const CODES: [&str; 4] = [
    "attempts_exhausted",
    "invalid_payload",
    "lease_expired_exhausted",
    "execution_timeout",
];

/// Ended jobs per statement of the fill.
const HISTORY_CHUNK: usize = 50_000;

/// Inserts ended jobs `$5` to `$6` of the history: job `g` ended at `$3` + `g` × `$4`
/// milliseconds since the epoch (its id a UUID v7 of that instant), for owner `$1[k % owners]`,
/// in queue `$2[(k / owners) % queues]`, where `k = g / $8` ([`FAILED_EVERY`]); a job whose `g`
/// is a multiple of `$8` failed with code `$7[(k / (owners × queues)) % codes]` and has
/// its letter, the others succeeded (with the ledger columns a success writes).
///
/// Locks: inserts new rows only (the letters' foreign keys take `FOR KEY SHARE` on the intake
/// rows the same statement inserted).
const FILL_SQL: &str = "
WITH ids AS (
    SELECT (lpad(to_hex(ms), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid AS id,
           'epoch'::timestamptz + ms * interval '1 millisecond' AS at, g,
           $1::bytea[] AS owners, $2::text[] AS queues, $7::text[] AS codes,
           g / $8::int8 AS k, g % $8::int8 = 0 AS failed
      FROM (SELECT $3::int8 + g * $4::int8 AS ms, g
              FROM generate_series($5::int8, $6::int8) AS g) s
), jobs AS (
    SELECT id, at, g, failed,
           owners[1 + k % cardinality(owners)] AS owner_key,
           queues[1 + (k / cardinality(owners)) % cardinality(queues)] AS queue,
           codes[1 + (k / (cardinality(owners) * cardinality(queues))) % cardinality(codes)]
               AS code
      FROM ids
), intake AS (
    INSERT INTO etl_job_intake (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                                max_attempts, run_at, created_at, queue)
    SELECT id, owner_key, sha256(id::text::bytea), sha256(id::text::bytea), 'noop', 5, at, at,
           queue
      FROM jobs
    RETURNING id
), outcome AS (
    INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at, lease_claim_id,
                                  failure_code, rows_inserted, rows_updated, rows_unchanged,
                                  data_checksum, started_at, finished_at)
    SELECT id, owner_key, CASE WHEN failed THEN 'failed' ELSE 'succeeded' END,
           CASE WHEN failed THEN 5 ELSE 1 END, at, gen_random_uuid(),
           CASE WHEN failed THEN code END,
           CASE WHEN failed THEN NULL ELSE 0 END, CASE WHEN failed THEN NULL ELSE 0 END,
           CASE WHEN failed THEN NULL ELSE 0 END,
           CASE WHEN failed THEN NULL ELSE sha256(id::text::bytea) END, at, at
      FROM jobs
)
INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts, failed_at)
SELECT j.id, j.owner_key, j.queue, 'noop', j.code, 5, j.at
  FROM jobs j JOIN intake i ON i.id = j.id
 WHERE j.failed";

/// How many open letters match owner `$1`, queue `$2` and code `$3` (each ignored when null).
///
/// Locks: none (a read).
const MATCHING_SQL: &str = "
SELECT count(*) FROM etl_dead_letters l
 WHERE l.replayed_job_id IS NULL
   AND ($1::bytea IS NULL OR l.owner_key = $1) AND ($2::text IS NULL OR l.queue = $2)
   AND ($3::text IS NULL OR l.code = $3)";

/// The open letter `$4` places into the listing of owner `$1`, queue `$2` and code `$3` (each
/// ignored when null), newest first: where the deep walk starts.
///
/// Locks: none (a read).
const NTH_SQL: &str = "
SELECT l.failed_at, l.job_id FROM etl_dead_letters l
 WHERE l.replayed_job_id IS NULL
   AND ($1::bytea IS NULL OR l.owner_key = $1) AND ($2::text IS NULL OR l.queue = $2)
   AND ($3::text IS NULL OR l.code = $3)
 ORDER BY l.failed_at DESC, l.job_id DESC
OFFSET $4 LIMIT 1";

/// What the history holds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct History {
    /// Ended jobs (outcomes).
    pub(crate) ended: u64,
    /// Of those, failed ones (each a letter).
    pub(crate) failed: u64,
    /// Seconds the fill and its `ANALYZE` took (set-up, not a figure of the product).
    pub(crate) fill_s: f64,
}

/// The page times of one listing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ListingFigures {
    /// The filter: `none`, `owner`, `queue` or `code`.
    pub(crate) filter: &'static str,
    /// Open letters matching it.
    pub(crate) letters: u64,
    /// Letters per page.
    pub(crate) page_size: usize,
    /// The first page (newest letters), read again and again.
    pub(crate) first_page_ms: Percentiles,
    /// Consecutive keyset pages from the middle of the filter's letters.
    pub(crate) deep_page_ms: Percentiles,
    /// How many letters into the listing the deep walk starts.
    pub(crate) deep_from: u64,
    /// The index the deep page's plan walks (`EXPLAIN`), or `none`.
    pub(crate) index: String,
    /// Whether that plan sorts or scans the letters' table sequentially (it should not).
    pub(crate) sorts_or_scans: bool,
}

/// Principal `i` of the history's owners.
fn owner_name(i: usize) -> String {
    format!("bench-history-{i}")
}

/// Fills the history of `history` ended jobs (see the module doc) for owners digested under
/// `secret`, then analyzes it.
///
/// # Errors
/// Database errors.
pub(super) async fn fill(
    client: &tokio_postgres::Client,
    secret: &Secret,
    history: usize,
) -> Result<History, Error> {
    let started = Instant::now();
    let owners: Vec<Vec<u8>> = (0..OWNERS)
        .map(|i| {
            let jobs = durable_etl::Jobs::new(secret.clone(), &owner_name(i));
            jobs.owner_key().to_vec()
        })
        .collect();
    let span_ms = i64::try_from(HISTORY_SPAN.as_millis()).unwrap_or(i64::MAX);
    let total = i64::try_from(history).unwrap_or(i64::MAX);
    let spacing = (span_ms / total.max(1)).max(1);
    let start: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM now()) * 1000)::int8 - $1::int8",
            &[&(spacing * total)],
        )
        .await?
        .get(0);
    let chunk = i64::try_from(HISTORY_CHUNK).unwrap_or(i64::MAX);
    let mut first = 1;
    while first <= total {
        let last = (first + chunk - 1).min(total);
        client
            .execute(
                FILL_SQL,
                &[
                    &owners,
                    &QUEUES.as_slice(),
                    &start,
                    &spacing,
                    &first,
                    &last,
                    &CODES.as_slice(),
                    &FAILED_EVERY,
                ],
            )
            .await?;
        first = last + 1;
    }
    client
        .batch_execute("ANALYZE etl_job_intake, etl_job_outcomes, etl_dead_letters")
        .await?;
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE status = 'failed') FROM etl_job_outcomes",
            &[],
        )
        .await?;
    let (ended, failed): (i64, i64) = (row.get(0), row.get(1));
    Ok(History {
        ended: u64::try_from(ended).unwrap_or(0),
        failed: u64::try_from(failed).unwrap_or(0),
        fill_s: started.elapsed().as_secs_f64(),
    })
}

/// One listing to time: its name, the handle that lists, and its filter's owner (for the
/// bench's own reads), queue and code.
struct Listing {
    /// The filter's name.
    name: &'static str,
    /// The handle the pages are listed with.
    letters: DeadLetters,
    /// The owner's digest, for an owner's listing.
    owner: Option<Vec<u8>>,
    /// The queue filter.
    queue: Option<&'static str>,
    /// The code filter.
    code: Option<&'static str>,
}

/// Times `pages` pages of `page_size` letters per listing (no filter, an owner's, a queue's, a
/// code's: see the module doc) over the history of the owners digested under `secret`.
///
/// # Errors
/// Database errors.
pub(super) async fn time_pages(
    client: &tokio_postgres::Client,
    secret: &Secret,
    pages: usize,
    page_size: usize,
) -> Result<Vec<ListingFigures>, Error> {
    let operator = DeadLetters::all_owners(secret.clone());
    let owner = durable_etl::Jobs::new(secret.clone(), &owner_name(1));
    let listings = [
        Listing {
            name: "none",
            letters: operator.clone(),
            owner: None,
            queue: None,
            code: None,
        },
        Listing {
            name: "owner",
            letters: owner.dead_letters(),
            owner: Some(owner.owner_key().to_vec()),
            queue: None,
            code: None,
        },
        Listing {
            name: "queue",
            letters: operator.clone(),
            owner: None,
            queue: Some(QUEUES[1]),
            code: None,
        },
        Listing {
            name: "code",
            letters: operator,
            owner: None,
            queue: None,
            code: Some(CODES[1]),
        },
    ];
    let mut figures = Vec::with_capacity(listings.len());
    for listing in &listings {
        figures.push(time_listing(client, listing, pages, page_size).await?);
    }
    Ok(figures)
}

/// Times one listing's first page `pages` times, then its deep walk (see the module doc).
async fn time_listing(
    client: &tokio_postgres::Client,
    listing: &Listing,
    pages: usize,
    page_size: usize,
) -> Result<ListingFigures, Error> {
    let filter = LetterFilter {
        queue: listing.queue,
        code: listing.code,
        ..LetterFilter::default()
    };
    let size = i64::try_from(page_size).unwrap_or(i64::MAX);
    let params = (&listing.owner, &listing.queue, &listing.code);
    let matching: i64 = client
        .query_one(MATCHING_SQL, &[params.0, params.1, params.2])
        .await?
        .get(0);
    let mut first = Vec::with_capacity(pages);
    for _ in 0..pages {
        let asked = Instant::now();
        listing.letters.list(client, &filter, None, size).await?;
        first.push(asked.elapsed().as_secs_f64() * 1000.0);
    }
    let deep_from = matching / 2;
    let start = client
        .query_opt(NTH_SQL, &[params.0, params.1, params.2, &deep_from])
        .await?
        .map(|row| LetterCursor {
            failed_at: row.get(0),
            job_id: row.get(1),
        });
    let (index, sorts_or_scans) = plan(client, listing, start, size).await?;
    let mut deep = Vec::with_capacity(pages);
    let mut after = start;
    while let Some(cursor) = after.filter(|_| deep.len() < pages) {
        let asked = Instant::now();
        let page = listing
            .letters
            .list(client, &filter, Some(cursor), size)
            .await?;
        deep.push(asked.elapsed().as_secs_f64() * 1000.0);
        after = page.next;
    }
    Ok(ListingFigures {
        filter: listing.name,
        letters: u64::try_from(matching).unwrap_or(0),
        page_size,
        first_page_ms: Percentiles::of(first),
        deep_page_ms: Percentiles::of(deep),
        deep_from: u64::try_from(deep_from).unwrap_or(0),
        index,
        sorts_or_scans,
    })
}

/// The index the plan of `listing`'s page after `after` walks (the first of the letters'
/// indexes `EXPLAIN` names, or `none`), and whether that plan sorts or scans the letters' table
/// sequentially. Planned as the library's call is: an unnamed statement, with its values.
async fn plan(
    client: &tokio_postgres::Client,
    listing: &Listing,
    after: Option<LetterCursor>,
    size: i64,
) -> Result<(String, bool), Error> {
    let (at, id) = (after.map(|c| c.failed_at), after.map(|c| c.job_id));
    let none_at: Option<chrono::DateTime<chrono::Utc>> = None;
    let kind: Option<&str> = None;
    let limit = size + 1;
    let rows = client
        .query(
            &format!("EXPLAIN {LIST_SQL}"),
            &[
                &listing.owner,
                &listing.queue,
                &kind,
                &listing.code,
                &none_at,
                &none_at,
                &at,
                &id,
                &limit,
            ],
        )
        .await?;
    let lines: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let text = lines.join("\n");
    let index = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|word| word.starts_with("etl_dead_letters_"))
        .unwrap_or("none")
        .to_owned();
    let sorts = text.contains("Sort") || text.contains("Seq Scan on etl_dead_letters");
    Ok((index, sorts))
}
