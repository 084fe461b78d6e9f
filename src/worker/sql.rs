//! SQL fragments shared by the statements that end or fence an attempt, as macros so each
//! statement stays one `concat!`-ed constant that tests can EXPLAIN.
//!
//! Invariants this module keeps:
//! - Every statement that takes a row out of `running` clears the whole lease with
//!   `lease_cleared!()`, so none forgets a lease column.
//! - Every path that ends an attempt or gives a job back reads a cancel request with
//!   `cancel_requested!()`, the one definition of "the owner asked to cancel".

/// The SET items that end a lease, shared by every statement that takes a row out of `running`
/// (success, retry, failure, release, recovery), so none forgets a lease column.
macro_rules! lease_cleared {
    () => {
        "lease_owner_id = NULL, lease_claim_id = NULL, lease_expires_at = NULL, \
         lease_owner_locked = false, lease_renewed_at = NULL"
    };
}

/// Whether the owner of the job row aliased `j` asked to cancel it: the row's own
/// `cancel_requested_at` (written by releases before migration 0004) or a row of
/// `etl_job_cancel_requests` (a primary-key probe), so a request never waits for the job's row.
/// Written out in each statement, not as an SQL function: a function with a sub-select is never
/// inlined, and calling it once per row tripled the server CPU of a group commit.
macro_rules! cancel_requested {
    () => {
        "(j.cancel_requested_at IS NOT NULL
          OR EXISTS (SELECT 1 FROM etl_job_cancel_requests c WHERE c.job_id = j.id))"
    };
}
