//! The claim and next-due statements, their parameters and their rows (see the parent module's
//! invariants).

use super::rows::{claimed, refused, Claim};
use crate::queue::DEFAULT_QUEUE;
use crate::worker::lease::{millis, ClaimedJob};
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::GenericClient;

/// The LATERAL probe of one asked queue `r` (its `queue`, and `$limit`, an expression over `r`):
/// for each kind of `$8`, the queue's due pending jobs of that kind in `(sort_at, id)` order that
/// also meet `$filter` (a condition on row `d`, or nothing), row-locked, at most `$limit`; then
/// the earliest `$limit` of them all, as `c (id, sort_at, concurrency_key)`.
macro_rules! due_probe {
    ($limit:expr, $filter:expr) => {
        concat!(
            "
     CROSS JOIN LATERAL (
         SELECT p.id, p.sort_at, p.concurrency_key
           FROM unnest($8::text[]) AS k(kind)
          CROSS JOIN LATERAL (
              SELECT d.id, d.sort_at, d.concurrency_key
                FROM etl_job_records d
               WHERE d.status = 'pending' AND d.queue = r.queue AND d.kind = k.kind
                 AND d.sort_at <= durable_etl_sort_at(now(), 9::int2) AND d.run_at <= now()",
            $filter,
            "
               ORDER BY d.sort_at, d.id
               LIMIT ",
            $limit,
            "
                 FOR NO KEY UPDATE SKIP LOCKED
          ) p
          ORDER BY p.sort_at, p.id
          LIMIT ",
            $limit,
            "
     ) c"
        )
    };
}

/// The highest slot a claim may take under cap `$cap` (an int4 expression), given the held
/// permits of the cap as the rows `x` of `$held` (a table and its condition): the cap itself
/// while no held permit is above it; else, while a lowered cap drains, the largest `k` with
/// `k` plus the held permits above `k` at most the cap (0 when none is), found per held permit
/// in descending slot order: with `i` held permits at or above slot `h`, the next held one
/// below at `lo` (0 for none), the `k` from `lo` to `h - 1` have `i` held above them, so the
/// largest of them that fits is `least(h - 1, cap - i)`, if at least `lo`. A claim that takes
/// only free slots up to that `k` (found in its snapshot) never brings the running claims above
/// the cap: held permits above `k` are the older claims (a newer one took at most its own `k`),
/// which are only ever freed, and at most `k` slots lie at or below it. Reads the held permits
/// by index only while one above the cap is held.
macro_rules! top_slot {
    ($held:expr, $cap:expr) => {
        concat!(
            "CASE WHEN NOT EXISTS (SELECT 1 FROM ",
            $held,
            " AND x.slot > ",
            $cap,
            ") THEN ",
            $cap,
            "
                  ELSE (SELECT coalesce(max(least(s.slot - 1, ",
            $cap,
            " - s.i)), 0)::int4
                          FROM (SELECT x.slot, row_number() OVER (ORDER BY x.slot DESC) AS i,
                                       coalesce(lead(x.slot) OVER (ORDER BY x.slot DESC), 0) AS lo
                                  FROM ",
            $held,
            ") s
                         WHERE least(s.slot - 1, ",
            $cap,
            " - s.i) >= s.lo) END"
        )
    };
}

/// The UPDATE that claims the rows of CTE `paired` (`id`, the ask's position `i`, a fresh
/// `claim_id`, as `$slot` the queue permit's slot or NULL, and as `$permitted` whether the claim
/// holds a permit of either kind), with the claimant's values `$2..$6`, returning what
/// [`claimed`] reads.
macro_rules! claim_update {
    ($slot:expr, $permitted:expr) => {
        concat!(
            "UPDATE etl_job_records AS j
   SET status = 'running',
       attempts = j.attempts + 1,
       fencing_token = j.fencing_token + 1,
       lease_claim_id = p.claim_id,
       permit_slot = ",
            $slot,
            ",
       lease_owner_id = $2,
       lease_owner_locked = $4,
       lease_expires_at = now() + $3 * interval '1 millisecond',
       lease_renewed_at = now(),
       lease_heartbeat_ms = $5,
       lease_owner_alive_locked = $6,
       started_at = now(),
       updated_at = now()
  FROM paired p
 WHERE j.id = p.id
RETURNING j.id, j.kind, j.request_payload, j.attempts, j.max_attempts, j.lease_claim_id,
          j.owner_key, greatest(extract(epoch FROM now() - j.run_at), 0)::float8,
          j.fencing_token, j.run_at, p.i, ",
            $permitted
        )
    };
}

/// Claims due jobs for owner `$2` with a lease of `$3` milliseconds: up to `$1[i]` of queue
/// `$7[i]` for each served queue, of the kinds `$8` the replica has registered and no other; `$4`
/// says whether the owner holds its owner lock (so recovery may treat the lock's absence as
/// death), `$5` is the owner's heartbeat interval in milliseconds and `$6` whether every
/// connection of the owner holds its alive lock (the terms recovery judges the owner by). Each
/// claimed row returns the position (from 1) of the ask it filled and whether its claim holds a
/// permit; then one marker row (every column NULL but the ask's position and the last) per
/// capped or key-capped ask says whether the claim left free permits of the queue's cap to
/// other claimers: it picked fewer due jobs than the free permits it saw (NULL for a queue with a
/// key cap only).
///
/// Order: within a queue, due jobs in `(sort_at, id)` order, their virtual deadlines
/// ([`crate::queue`]). A queue that is paused (`etl_queues.paused`) gives nothing. A capped queue
/// (`etl_queues.cap`, migration 0021) gives at most as many jobs as it has free permits: `room`
/// counts the free permits the statement's snapshot sees (at most the ask's count), `due` takes
/// at most that many jobs, each with a fresh claim id, `picked` keeps them, `permits` locks free
/// permits for the picked jobs only, `chosen` keeps as many jobs as it locked, `paired` gives
/// each a permit, and `taken` writes the claim id into the permit while the UPDATE writes the
/// permit's slot into the live row, in this one statement. A claim with no job to pair (none of
/// its kinds is due) locks no permit, so it never hides one from a claimer that has. In a queue
/// with a key cap (`etl_queues.key_cap`, migration 0022), `due` skips a job whose concurrency key
/// already holds that many key permits and takes up to twice the room (so that several due jobs
/// of one key still leave room for other keys); `fitting` gives the `krn`-th due job of a key the
/// `krn`-th slot of that key not held in the statement's snapshot and drops the jobs beyond the
/// key's free slots; `picked` keeps the room's earliest; `key_taken` inserts their key permits and
/// `paired` keeps only the keyed jobs whose permit it inserted: two claimers that pick the same
/// slot of one key cannot both insert it, so a key never runs more than its cap.
///
/// A cap lowered while more jobs run than it allows is never exceeded by a claim: while a permit
/// above the cap is held, a claim takes only free slots up to `top_slot!`'s bound (`top`, for a
/// queue cap; the end of the `generate_series` of `fitting`, for a key cap), the largest `k`
/// whose held permits above it leave room for `k` below, so it claims nothing while the running
/// jobs, old and new, are as many as the cap, and its claims never make them more, whichever of
/// the older jobs ends first and however claimers race (they contend on the same low slots).
///
/// Locks: `asked` reads each asked queue's settings row by primary key, and `room` reads (without
/// locking) up to the ask's count of its free permits by primary key. `permits` row-locks free
/// permit rows of each capped queue (`FOR UPDATE SKIP LOCKED`, in slot order, at most the picked
/// jobs' count; slots above the cap, or above `top`, are never taken), after the jobs' row locks, so concurrent
/// claimers never wait on each other or take the same permit; a permit another claimer locked or
/// took since the snapshot is skipped, and the picked jobs beyond the permits locked stay
/// pending, unlocked at commit. For
/// each (queue, kind), one probe walks `etl_job_records_claim_idx` on its equal leading columns in
/// `(sort_at, id)` order, from the start of the queue to `now()` plus the largest priority offset
/// (no due job sorts later), and takes a row lock (`FOR NO KEY UPDATE`: the claim changes no key,
/// so the `FOR KEY SHARE` locks that foreign-key checks of rows referencing a job take never make
/// a claim skip it) on up to the queue's room of due pending rows, skipping (`SKIP LOCKED`) rows
/// another claimer, canceller or recovery holds. After locking, PostgreSQL re-checks the row's
/// current version against the probe's conditions, so a row that another transaction changed
/// meanwhile is left out. Each queue then keeps its room of the locked rows, earliest first (a
/// sort of at most room × kinds rows); the rows another kind's probe locked beyond it stay
/// pending and are unlocked when the statement commits. The UPDATEs rewrite only the rows and
/// permits kept. Only `status = 'pending'` appears in the probe's predicate (no OR across
/// states), so the partial index is always usable; expired leases are returned to `pending` by
/// recovery, not here. A job of a kind the replica has not registered is never probed: it waits
/// for a replica that runs it. `key_taken` inserts its permits in (queue, key, slot) order, each
/// `ON CONFLICT DO NOTHING`: a slot another transaction holds (committed) is skipped at once; one
/// another claim is inserting, or a finisher deleting, makes it wait for that transaction (one
/// short statement), and the fixed order means two claims never wait on each other in a cycle.
/// The probe of a key-capped queue walks, beside the jobs it takes, the due jobs of keys at their
/// cap that sort before them (one count of a key's permits, by index, each): a key at its cap
/// with a long backlog slows its queue's claims, never blocks them.
pub const CLAIM_SQL: &str = concat!(
    "
WITH asked AS MATERIALIZED (
    SELECT q.queue, q.n, q.i, s.cap, s.key_cap
      FROM unnest($7::text[], $1::int8[]) WITH ORDINALITY AS q(queue, n, i)
      LEFT JOIN etl_queues s ON s.queue = q.queue
     WHERE s.paused IS NOT TRUE
), room AS MATERIALIZED (
    SELECT a.queue, a.i, a.cap, a.key_cap, c.n, l.top,
           CASE WHEN a.key_cap IS NULL THEN c.n ELSE 2 * c.n END AS fetch
      FROM asked a
     CROSS JOIN LATERAL (
         SELECT CASE WHEN a.cap IS NOT NULL THEN ",
    top_slot!(
        "etl_queue_permits x WHERE x.queue = a.queue AND x.claim_id IS NOT NULL",
        "a.cap"
    ),
    " END AS top
     ) l
     CROSS JOIN LATERAL (
         SELECT CASE WHEN a.cap IS NULL THEN a.n
                     ELSE (SELECT count(*)
                             FROM (SELECT FROM etl_queue_permits x
                                    WHERE x.queue = a.queue AND x.claim_id IS NULL
                                      AND x.slot <= l.top
                                    LIMIT a.n) f) END AS n
     ) c
), due AS MATERIALIZED (
    SELECT c.id, r.i, r.queue, c.sort_at, gen_random_uuid() AS claim_id,
           CASE WHEN r.key_cap IS NOT NULL THEN c.concurrency_key END AS concurrency_key,
           r.key_cap
      FROM room r
",
    due_probe!(
        "r.fetch",
        "
                 AND (r.key_cap IS NULL OR d.concurrency_key IS NULL
                      OR (SELECT count(*) FROM etl_key_permits x
                           WHERE x.queue = r.queue AND x.concurrency_key = d.concurrency_key)
                         < r.key_cap)"
    ),
    "
), fitting AS MATERIALIZED (
    SELECT d.id, d.i, d.queue, d.claim_id, d.concurrency_key, f.slot AS key_slot,
           row_number() OVER (PARTITION BY d.queue ORDER BY d.sort_at, d.id) AS rn
      FROM (SELECT d.*, row_number() OVER (PARTITION BY d.queue, d.concurrency_key
                                            ORDER BY d.sort_at, d.id) AS krn
              FROM due d) d
      LEFT JOIN LATERAL (
          SELECT g AS slot
            FROM generate_series(1, ",
    top_slot!(
        "etl_key_permits x WHERE x.queue = d.queue AND x.concurrency_key = d.concurrency_key",
        "d.key_cap"
    ),
    ") AS g
           WHERE d.concurrency_key IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM etl_key_permits x
                              WHERE x.queue = d.queue AND x.concurrency_key = d.concurrency_key
                                AND x.slot = g)
           ORDER BY g
          OFFSET d.krn - 1
           LIMIT 1
      ) f ON true
     WHERE d.concurrency_key IS NULL OR f.slot IS NOT NULL
), picked AS MATERIALIZED (
    SELECT f.*
      FROM fitting f
      JOIN room r ON r.queue = f.queue
     WHERE f.rn <= r.n
), permits AS MATERIALIZED (
    SELECT r.queue, p.slot, row_number() OVER (PARTITION BY r.queue ORDER BY p.slot) AS rn
      FROM room r
     CROSS JOIN LATERAL (
         SELECT x.slot
           FROM etl_queue_permits x
          WHERE x.queue = r.queue AND x.claim_id IS NULL AND x.slot <= r.top
          ORDER BY x.slot
          LIMIT (SELECT count(*) FROM picked k WHERE k.queue = r.queue)
            FOR UPDATE SKIP LOCKED
     ) p
     WHERE r.cap IS NOT NULL
), chosen AS MATERIALIZED (
    SELECT k.*
      FROM picked k
      JOIN room r ON r.queue = k.queue
     WHERE r.cap IS NULL OR k.rn <= (SELECT count(*) FROM permits m WHERE m.queue = k.queue)
), key_taken AS (
    INSERT INTO etl_key_permits (claim_id, queue, concurrency_key, slot)
    SELECT c.claim_id, c.queue, c.concurrency_key, c.key_slot
      FROM chosen c
     WHERE c.concurrency_key IS NOT NULL
     ORDER BY c.queue, c.concurrency_key, c.key_slot
        ON CONFLICT (queue, concurrency_key, slot) DO NOTHING
    RETURNING claim_id
), paired AS MATERIALIZED (
    SELECT c.id, c.i, c.queue, m.slot, c.claim_id,
           (m.slot IS NOT NULL OR c.concurrency_key IS NOT NULL) AS permitted
      FROM chosen c
      LEFT JOIN permits m ON m.queue = c.queue AND m.rn = c.rn
     WHERE c.concurrency_key IS NULL OR c.claim_id IN (SELECT t.claim_id FROM key_taken t)
), taken AS (
    UPDATE etl_queue_permits AS x
       SET claim_id = p.claim_id
      FROM paired p
     WHERE p.slot IS NOT NULL AND x.queue = p.queue AND x.slot = p.slot
), claimed AS (
",
    claim_update!("p.slot", "p.permitted"),
    "
)
SELECT * FROM claimed
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::int4, NULL::int4, NULL::uuid, NULL::bytea,
       NULL::float8, NULL::int8, NULL::timestamptz, r.i,
       CASE WHEN r.cap IS NOT NULL
            THEN (SELECT count(*) FROM picked k WHERE k.queue = r.queue) < r.n END
  FROM room r
 WHERE r.cap IS NOT NULL OR r.key_cap IS NOT NULL"
);

/// [`CLAIM_SQL`] for queues without a cap or a key cap: no permit is locked, inserted or paired,
/// so an uncapped queue's claim costs what it did before caps (the same parameters and order;
/// the probe and the UPDATE are [`CLAIM_SQL`]'s). It refuses a capped queue itself rather than
/// trusting the caller: an ask whose queue has a cap or a key cap in the statement's snapshot
/// claims nothing and returns one marker row (every column NULL but the ask's position), and the
/// caller claims that ask again with [`CLAIM_SQL`]. So a queue capped after a replica last
/// looked is never claimed past its cap, just as with [`CLAIM_SQL`] (a cap applies to claims
/// whose snapshot saw it).
///
/// Locks: as [`CLAIM_SQL`]'s `asked` and probe (no permit row is touched).
pub const CLAIM_UNCAPPED_SQL: &str = concat!(
    "
WITH asked AS MATERIALIZED (
    SELECT q.queue, q.n, q.i, (s.cap IS NOT NULL OR s.key_cap IS NOT NULL) AS capped
      FROM unnest($7::text[], $1::int8[]) WITH ORDINALITY AS q(queue, n, i)
      LEFT JOIN etl_queues s ON s.queue = q.queue
     WHERE s.paused IS NOT TRUE
), paired AS MATERIALIZED (
    SELECT c.id, r.i, gen_random_uuid() AS claim_id
      FROM (SELECT a.queue, a.n, a.i FROM asked a WHERE NOT a.capped) r",
    due_probe!("r.n", ""),
    "
), claimed AS (
",
    claim_update!("NULL", "false"),
    "
)
SELECT * FROM claimed
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::jsonb, NULL::int4, NULL::int4, NULL::uuid, NULL::bytea,
       NULL::float8, NULL::int8, NULL::timestamptz, a.i, NULL::bool
  FROM asked a
 WHERE a.capped"
);

/// Claims, of each queue of `asks`, up to as many due jobs as it asks for `claimant`, with
/// [`CLAIM_UNCAPPED_SQL`] (unnamed, planned for its values): the asks of capped queues claim
/// nothing and are listed in [`Claim::capped`].
///
/// # Errors
/// The database error of the claim statement.
pub async fn claim_uncapped(
    client: &impl GenericClient,
    claimant: Claimant<'_>,
    asks: &[Ask<'_>],
) -> Result<Claim, tokio_postgres::Error> {
    let values = ClaimValues::of(claimant, asks);
    let typed: Vec<_> = values.params().into_iter().zip(CLAIM_PARAMS).collect();
    Ok(refused(
        client.query_typed(CLAIM_UNCAPPED_SQL, &typed).await?,
        asks,
    ))
}

/// Who claims, and on what terms.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The replica's `lease_owner_id`.
    pub owner_id: &'a str,
    /// Whether the replica holds its owner lock on a live session.
    pub owner_locked: bool,
    /// The lease each claim grants.
    pub lease: Duration,
    /// The owner's heartbeat interval: recovery gives the owner two of them to renew.
    pub heartbeat_interval: Duration,
    /// Whether every connection of the owner holds its alive lock
    /// (`durable_etl_owner_alive_key`, see `worker::alive`), so that recovery reads "no lock at
    /// all" as death.
    pub alive_locked: bool,
    /// The kinds the replica has registered: it claims jobs of these kinds only.
    pub kinds: &'a [&'a str],
}

/// The types of [`CLAIM_SQL`]'s parameters.
pub(super) const CLAIM_PARAMS: [Type; 8] = [
    Type::INT8_ARRAY,
    Type::TEXT,
    Type::INT8,
    Type::BOOL,
    Type::INT4,
    Type::BOOL,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
];

/// How many jobs a claim asks of one queue.
pub type Ask<'a> = (&'a str, usize);

/// Claims up to `free_slots` due jobs of [`DEFAULT_QUEUE`] for `claimant` ([`claim_from`]).
///
/// # Errors
/// The database error of the claim statement.
pub async fn claim(
    client: &impl GenericClient,
    claimant: Claimant<'_>,
    free_slots: usize,
) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
    claim_from(client, claimant, &[(DEFAULT_QUEUE, free_slots)]).await
}

/// Claims, of each queue of `asks`, up to as many due jobs as it asks for `claimant`, with an
/// unnamed statement planned for its values.
///
/// # Errors
/// The database error of the claim statement.
pub async fn claim_from(
    client: &impl GenericClient,
    claimant: Claimant<'_>,
    asks: &[Ask<'_>],
) -> Result<Vec<ClaimedJob>, tokio_postgres::Error> {
    let values = ClaimValues::of(claimant, asks);
    let typed: Vec<_> = values.params().into_iter().zip(CLAIM_PARAMS).collect();
    Ok(claimed(client.query_typed(CLAIM_SQL, &typed).await?, asks).jobs)
}

/// The parameter values of [`CLAIM_SQL`] for a claim of `asks` for a claimant.
pub(super) struct ClaimValues<'a> {
    /// How many jobs of each queue.
    counts: Vec<i64>,
    /// The queues.
    queues: Vec<&'a str>,
    /// The kinds.
    kinds: &'a [&'a str],
    /// The owner id.
    owner_id: &'a str,
    /// The lease in milliseconds.
    lease: i64,
    /// Whether the owner holds its owner lock.
    owner_locked: bool,
    /// The owner's heartbeat interval in milliseconds, at least 1.
    heartbeat: i32,
    /// Whether the owner's connections hold its alive lock.
    alive_locked: bool,
}

impl<'a> ClaimValues<'a> {
    /// The values of a claim of `asks` for `claimant`.
    pub(super) fn of(claimant: Claimant<'a>, asks: &[Ask<'a>]) -> ClaimValues<'a> {
        ClaimValues {
            counts: asks
                .iter()
                .map(|&(_, n)| i64::try_from(n).unwrap_or(i64::MAX))
                .collect(),
            queues: asks.iter().map(|&(queue, _)| queue).collect(),
            kinds: claimant.kinds,
            owner_id: claimant.owner_id,
            lease: millis(claimant.lease),
            owner_locked: claimant.owner_locked,
            heartbeat: i32::try_from(millis(claimant.heartbeat_interval))
                .unwrap_or(i32::MAX)
                .max(1),
            alive_locked: claimant.alive_locked,
        }
    }

    /// The values in [`CLAIM_SQL`]'s parameter order.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.counts,
            &self.owner_id,
            &self.lease,
            &self.owner_locked,
            &self.heartbeat,
            &self.alive_locked,
            &self.queues,
            &self.kinds,
        ]
    }
}
