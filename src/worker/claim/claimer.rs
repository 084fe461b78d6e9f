//! The claim: one statement that takes, of each queue the replica serves, up to that queue's
//! share of its room in due jobs of the kinds it has registered. It comes in two forms: with
//! permits ([`CLAIM_SQL`], for capped and key-capped queues) and without ([`CLAIM_UNCAPPED_SQL`],
//! which costs what the claim cost before caps and refuses a capped queue itself).
//!
//! Invariants this module keeps:
//! - No claim ever takes a job of a capped queue without its permits: the claim without permits
//!   reads each asked queue's settings in its own snapshot and claims nothing of a capped one,
//!   returning a marker for that ask instead; the replica claims those asks again with permits at
//!   once, and from then on until its next poll ([`CappedQueues`]). What the replica remembers
//!   only chooses the statement.
//! - The counts asked never add up to more than the replica's room (the caller shares it out,
//!   `worker::queues`).
//! - A job is claimed only by a replica that serves its queue and has registered its kind; any
//!   other job waits, whatever its state of due-ness (no claim fails it for being unknown).
//! - Every claimed row gets a fresh `lease_claim_id`, this replica's `lease_owner_id`, a lease on
//!   the database clock, `lease_renewed_at = now()`, `attempts + 1` and `fencing_token + 1`:
//!   attempts are counted at claim time, so a job that kills its worker every time still reaches
//!   its bound, and the fencing token grows with every claim and is never given back.
//! - The claim commits like every other commit, under the server's `synchronous_commit` (its WAL
//!   flushed, and under synchronous replication replicated, before the claimer sees its rows), so
//!   no handler starts on a claim that a crash or a failover can undo. A claim that committed
//!   without waiting for its flush (as claims did before) could be lost by a server crash while
//!   its handler ran: the row came back `pending` with its old fencing token and attempt count,
//!   and the next claim handed the same token to a second attempt, which an external system
//!   fencing by token would accept too (`faults::restart` crashes a private server to prove it
//!   cannot happen now).
//! - The claim's plan is pinned on the claim sessions alone: the producer claims on its own small
//!   pool ([`connect_claim_pool`]), whose sessions plan with sorts and bitmap scans
//!   off, so the claim walks the pending index in order even on a table without statistics; the
//!   replica's other sessions (group commits, handlers' effects) plan with the server's
//!   settings. (A SQL function with its own `SET` clause pinned it too, but cost about 100 µs of
//!   server CPU per job in a burn-down.)
//! - On the replica's claim sessions ([`ClaimSessions`]) the claim and the next-due read are
//!   prepared once per session and planned once, generically; the claim's plan is checked when
//!   the session opens (it must walk the claim index in order, with no sort below its row
//!   locks, and join the
//!   claimed rows back through the primary key, with no scan or hash of the whole table), and a
//!   session whose plan fails the check sends the claim unnamed, planned on every call with its
//!   values. It counts a `claim_plan_fallbacks` only when the check can be judged (the live
//!   table has [`JUDGED_FROM_PAGES`] pages on disk: on an empty or nearly empty queue a
//!   sequential scan is the right plan, not an alarm); a session that could not judge is
//!   replaced after [`RECHECK_AFTER`], and its successor checks again. Elsewhere (tests, tools) [`claim`] sends it unnamed
//!   with typed parameters (`query_typed`): one round trip either way.

mod adopt;
mod capped;
mod next_due;
mod plan_check;
mod planner;
mod rows;
mod session;
mod statement;

pub use adopt::ADOPT_SQL;
pub(crate) use adopt::{adopt, Orphans};
pub use capped::CappedQueues;
pub use next_due::{next_due, NEXT_DUE_SQL, NEXT_DUE_WINDOW};
pub use plan_check::{JUDGED_FROM_PAGES, RECHECK_AFTER};
pub use planner::{claim_pg_config, CLAIM_POOL_SIZE};
pub use rows::Claim;
pub use session::{connect_claim_pool, ClaimPool, ClaimSession, ClaimSessions};
pub use statement::{
    claim, claim_from, claim_uncapped, Ask, Claimant, CLAIM_SQL, CLAIM_UNCAPPED_SQL,
};

#[cfg(test)]
mod adopt_tests;
#[cfg(test)]
mod pooled_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod uncapped_tests;
