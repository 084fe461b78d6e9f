//! The complete stage: every fenced write after the claim. The statements that end, retry,
//! release and recover a claim ([`completer`]); the group commit that runs the effects of
//! every job that finished computing meanwhile in one fenced transaction (`group_commit`); the
//! shutdown release and the give-back of abandoned jobs, which run the release (`give_back`);
//! what an attempt ended as (`transition`); and which database errors are the infrastructure's
//! fault, never the job's (`infrastructure`).
//!
//! Invariants this stage keeps:
//! - Every write is fenced by the claim's id and owner; a stale claim changes nothing.
//! - Every statement that moves a claim out of `running` frees its permits in the same
//!   statement, from the rows it moved.
//! - An infrastructure fault never charges an attempt: the computed result is committed again
//!   under the same claim while the lease is trusted, else the job is given back uncharged.

#[doc(hidden)]
pub mod completer;
pub(crate) mod give_back;
pub(crate) mod group_commit;
pub(crate) mod infrastructure;
pub(crate) mod transition;
