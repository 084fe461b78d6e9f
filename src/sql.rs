//! SQL fragments shared by the statements that end or fence a job (the worker's and the owner's
//! cancellation), as macros so each statement stays one `concat!`-ed constant that tests can
//! EXPLAIN.
//!
//! Invariants this module keeps:
//! - Every statement that gives a live row back to `pending` clears the whole lease with
//!   `lease_cleared!()`, so none forgets a lease column.
//! - Every statement that ends a job deletes its live row and appends its outcome row in the same
//!   statement, through `ended_columns!()` and `outcome_of!()`: the outcome is built only from
//!   rows the fenced DELETE returned, so a stale claim (whose DELETE matched nothing) can never
//!   write one, and the payload leaves with the live row.
//! - Every path that ends an attempt or gives a job back reads a cancel request with
//!   `cancel_requested!()`, the one definition of "the owner asked to cancel", off the live row
//!   it locked or changed (never off another table), so a request and a commit serialize on the
//!   row lock and never both win; a cancelled job's code is the row's `cancel_code`.
//! - Every statement that can end a job `failed` appends its dead letter in the same statement,
//!   through `dead_letters_of!()`, built only from the outcome rows it appended.
//! - An outcome's `finished_at` is the time its statement ran (`statement_timestamp()`), not the
//!   start of its transaction, which a batch of effects may have opened long before.
//! - Every statement that gives a live row back to `pending` (retry, recovery, release) appends
//!   the attempt it ended to `etl_job_attempts` in the same statement, through
//!   `attempt_ended!()`, built only from the rows its fenced UPDATE returned: a stale claim
//!   changes no row, so it records no attempt.
//! - A statement that ends an attempt that failed (a retry, a failure, a recovery) writes that
//!   attempt's diagnosis in the same row it appends (`attempt_ended!` or `outcome_of!` with
//!   `diagnosis:`), never in a second statement; the success, cancellation and release
//!   statements write none and are unchanged by it.
//! - Every statement that moves a claim out of `running` frees the permits that claim held (a job
//!   of a capped queue, migration 0021; a job of a key-capped queue, migration 0022) in the same
//!   statement, through `permits_freed!()`, built only from the rows it moved; `lease_cleared!()`
//!   clears the live row's `permit_slot`.

/// The SET items that end a lease, shared by every statement that gives a live row back to
/// `pending` (retry, release, recovery), so none forgets a lease column.
macro_rules! lease_cleared {
    () => {
        "lease_owner_id = NULL, lease_claim_id = NULL, lease_expires_at = NULL, \
         lease_owner_locked = false, lease_renewed_at = NULL, lease_heartbeat_ms = NULL, \
         lease_owner_alive_locked = false, permit_slot = NULL"
    };
}

/// Whether the owner of the job row aliased `j` asked to cancel it: its `cancel_code` (the code
/// the job ends with, `cancelled` or `replaced`) is set. A column of the live row, not a row of
/// another table, so the request and every statement that ends or fences the job serialize on the
/// job's row lock, and a statement that waited for a request's lock re-checks the row's current
/// version (PostgreSQL re-evaluates a waiting UPDATE's, DELETE's or `FOR UPDATE`'s predicate on
/// the new version, but a sub-select over another table only on its own snapshot).
macro_rules! cancel_requested {
    () => {
        "j.cancel_code IS NOT NULL"
    };
}

/// The RETURNING list of a fenced DELETE of live rows aliased `j`: what [`outcome_of`] needs, the
/// code a cancelled job ends with (`cancel_code`, null without a request), and the permit its
/// claim held (`queue`, `permit_slot`; see [`permits_freed`]).
macro_rules! ended_columns {
    () => {
        "j.id, j.owner_key, j.attempts, j.run_at, j.started_at, j.lease_claim_id, j.cancel_code, \
         j.queue, j.permit_slot"
    };
}

/// Appends one outcome row per row of CTE `$source` (which returned [`ended_columns`]), with
/// status `$status`, failure code `$code` and record index `$index` (SQL expressions over
/// `$source`'s columns), returning `job_id, status` and what [`dead_letters_of`] needs. With
/// `diagnosis: $diagnosis`, an SQL expression of type `jsonb` (NULL for a cancellation), it also
/// writes the failed attempt's diagnosis (`job::diagnosis`, migration 0036); without it the
/// statement is exactly as before.
///
/// Locks: inserts new rows and their primary-key entries; a second outcome for a job would
/// violate the key (none can be built: its live row is deleted once).
macro_rules! outcome_of {
    ($source:expr, $status:expr, $code:expr, $index:expr) => {
        outcome_of!(@ $source, $status, $code, $index, "", "")
    };
    ($source:expr, $status:expr, $code:expr, $index:expr, diagnosis: $diagnosis:expr) => {
        outcome_of!(@ $source, $status, $code, $index, ", diagnosis", concat!(", ", $diagnosis))
    };
    (@ $source:expr, $status:expr, $code:expr, $index:expr, $column:expr, $value:expr) => {
        concat!(
            "INSERT INTO etl_job_outcomes
           (job_id, owner_key, status, attempts, run_at, lease_claim_id, failure_code,
            failure_record_index, started_at, finished_at",
            $column,
            ")
    SELECT id, owner_key, ",
            $status,
            ", attempts, run_at, lease_claim_id, ",
            $code,
            ", ",
            $index,
            ", started_at, statement_timestamp()",
            $value,
            " FROM ",
            $source,
            "
 RETURNING job_id, status, owner_key, failure_code, attempts, finished_at"
        )
    };
}

/// Appends one dead letter (`etl_dead_letters`, migration 0035) per `failed` row of CTE
/// `$outcome` (an [`outcome_of`] insert), with the job's queue and kind from its intake row. Only
/// jobs with an intake row get one (its foreign key), as with [`attempt_ended`].
///
/// Locks: reads each job's intake row by primary key; the foreign-key check takes `FOR KEY
/// SHARE` on it; inserts new rows and their index entries (a second letter for a job would
/// violate the key: its outcome is written once).
macro_rules! dead_letters_of {
    ($outcome:expr) => {
        concat!(
            "INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts, failed_at)
    SELECT o.job_id, o.owner_key, i.queue, i.kind, o.failure_code, o.attempts, o.finished_at
      FROM ",
            $outcome,
            " o JOIN etl_job_intake i ON i.id = o.job_id
     WHERE o.status = 'failed'"
        )
    };
}

/// The RETURNING list of an UPDATE that gives live rows aliased `j` back to `pending`: what
/// [`attempt_ended`] needs (the attempt's number as charged, so a release, which uncharges it,
/// writes its own list).
macro_rules! attempt_columns {
    () => {
        "j.id, j.attempts, j.started_at, j.run_at"
    };
}

/// Appends one row of attempt history per row of `$source` (a CTE or a parenthesized query that
/// returned [`attempt_columns`]): the attempt ended now, `$ending` (`retried`, `recovered` or
/// `released`), and the job is due again at its `run_at` (or now, if that has passed); with a
/// third argument, an SQL expression over `$source`'s row `s`, the owner the attempt was taken
/// from (recovery's, migration 0032: what a replica that was only cut off gives back); with a
/// fourth, `diagnosis: $diagnosis`, an SQL expression of type `jsonb` over `s`, the attempt's
/// diagnosis (`job::diagnosis`, migration 0036; without it the statement is exactly as before).
/// Only rows whose job has an intake row are recorded: a live row without one (which no release
/// writes) must not make the history's foreign key fail the statement that gives jobs back.
///
/// Locks: reads each job's intake row by primary key (no lock), inserts new rows; the
/// foreign-key check takes `FOR KEY SHARE` on the intake row. The other lockers of intake rows
/// take `FOR KEY SHARE` too (a cancel request's and a target row's foreign keys), which never
/// conflict with it; the retention runbook deletes only ended jobs' intake rows, and an ended
/// job has no live row to give back.
macro_rules! attempt_ended {
    ($source:expr, $ending:expr) => {
        attempt_ended!($source, $ending, "NULL")
    };
    ($source:expr, $ending:expr, $owner:expr) => {
        attempt_ended!(@ $source, $ending, $owner, "", "")
    };
    ($source:expr, $ending:expr, $owner:expr, diagnosis: $diagnosis:expr) => {
        attempt_ended!(@ $source, $ending, $owner, ", diagnosis", concat!(", ", $diagnosis))
    };
    (@ $source:expr, $ending:expr, $owner:expr, $column:expr, $value:expr) => {
        concat!(
            "INSERT INTO etl_job_attempts (job_id, attempt, started_at, ending, due_at, owner_id",
            $column,
            ")
    SELECT s.id, s.attempts, coalesce(s.started_at, now()), '",
            $ending,
            "', greatest(s.run_at, now()), ",
            $owner,
            $value,
            "
      FROM ",
            $source,
            " s JOIN etl_job_intake i ON i.id = s.id"
        )
    };
}

/// CTEs `moved`, `freed` and `keys_freed`: free the permits of the claims a statement moved out
/// of `running`, given as the query `$moved` (read once, into `moved`) with columns `queue`,
/// `permit_slot` (null for a job of an uncapped queue) and `claim_id`, built only from the rows
/// the statement's own fenced writes returned (or the rows it locked, restricted to those), never
/// from its input: a stale finisher moved no row, so it frees nothing. A queue permit is freed
/// only while it still names the claim; a key permit (migration 0022) is the row named by the
/// claim, deleted.
///
/// `permits_freed!(claimed_by_freer: $moved)` is the form of a completion by the claim's holder:
/// a CTE `freer`, joined by both frees so it runs before any permit is freed, sets
/// `durable_etl.freer_claims = on` for the transaction, and the permits' triggers then wake
/// nobody (migration 0023): the completing replica claims the permits' next jobs itself, or wakes
/// the waiting replicas after its commit when it cannot (`worker::claim::producer`). Every other
/// statement (a release, recovery) uses the plain form, whose freed permits wake the waiting
/// replicas.
///
/// Locks: the row lock of each freed queue permit (by primary key), to the end of the
/// statement's transaction, which a claim that finds it locked skips; each deleted key permit (by
/// primary key), which a claim inserting the same key's slot waits for.
macro_rules! permits_freed {
    ($moved:expr) => {
        permits_freed!(@ $moved, "", "")
    };
    (claimed_by_freer: $moved:expr) => {
        permits_freed!(
            @ $moved,
            "
), freer AS MATERIALIZED (
    SELECT set_config('durable_etl.freer_claims', 'on', true) AS claims",
            ", freer"
        )
    };
    (@ $moved:expr, $freer:expr, $joined:expr) => {
        concat!(
            "moved AS (
    ",
            $moved,
            $freer,
            "
), freed AS (
    UPDATE etl_queue_permits AS x
       SET claim_id = NULL
      FROM moved AS m",
            $joined,
            "
     WHERE m.permit_slot IS NOT NULL AND x.queue = m.queue AND x.slot = m.permit_slot
       AND x.claim_id = m.claim_id
), keys_freed AS (
    DELETE FROM etl_key_permits AS x
     USING moved AS m",
            $joined,
            "
     WHERE x.claim_id = m.claim_id
)"
        )
    };
}
