//! The run stage: one claimed job's attempt. The executor ([`executor`]) runs its compute phase
//! under the handler guard (`worker::guard`) while it holds a slot ([`slots`]), and hands it to
//! the complete stage for its transition, with the retry delay policy ([`retry`]).
//!
//! Invariants this stage keeps:
//! - No connection or transaction is held while a handler computes.
//! - Every attempt ends in exactly one fenced transition, or is abandoned when its lease is lost.

pub(crate) mod executor;
pub(crate) mod retry;
pub(crate) mod slots;
