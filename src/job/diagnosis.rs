//! What an attempt that failed records beside its code: its diagnosis. The phase it failed in,
//! the retry decision and its delay, how long it ran, the Rust type names of its error and of
//! that error's sources, and the structured detail its kind declared ([`Detail`]). Stored with
//! the attempt (`etl_job_attempts.diagnosis`, for a retried or recovered attempt) or with the
//! job's outcome (`etl_job_outcomes.diagnosis`, for a failed job), in the same fenced statement
//! that writes that row, and shown by the job's attempt history.
//!
//! Invariants this module keeps:
//! - A diagnosis holds metadata only: enumerated values, numbers, the names of Rust types, and
//!   the detail a kind declared, whose values the type system restricts to integers, booleans
//!   and `&'static str` tags. An error's `Display` or `Debug` text is never read: a type's name
//!   is taken from `std::any::type_name` where the error enters a [`JobError`], and every later
//!   link of its source chain is named only when it downcasts to a type this module knows
//!   ([`UNKNOWN_TYPE`] otherwise), with enumerated facts of its own (an I/O error's kind, a
//!   database error's SQLSTATE, this crate's stable code).
//! - Every part is bounded: at most [`MAX_CHAIN`] links, each name at most [`MAX_TYPE_NAME`]
//!   bytes, the detail at most [`MAX_DETAIL_FIELDS`] fields and [`MAX_DETAIL_BYTES`] bytes.
//!   Over a bound the excess is cut the same way every time (links and fields past the bound,
//!   in order), and the diagnosis says so (`chain_cut`, `detail_dropped`).
//!
//! [`JobError`]: crate::JobError

use std::error::Error as StdError;

mod chain;
mod detail;
mod record;

pub(crate) use chain::{chain_of, database_chain, Described};
pub use detail::{Detail, DetailValue, MAX_DETAIL_BYTES, MAX_DETAIL_FIELDS};
pub use record::{
    Chain, Decision, Diagnosis, ErrorLink, Phase, MAX_CHAIN, MAX_TYPE_NAME, UNKNOWN_TYPE,
};

/// The chain of an error that entered a `JobError` without this crate seeing its type (a
/// variant built directly): every link named by probing alone.
pub(crate) fn probed_chain(error: &(dyn StdError + 'static)) -> Chain {
    chain_of(None, error)
}

#[cfg(test)]
mod tests;
