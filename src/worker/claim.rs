//! The claim stage: what a replica takes and when. The claim statements and the claim sessions
//! ([`claimer`]), the claim loop (`producer`) with its buffer of jobs claimed ahead
//! (`prefetch`), its shares per queue (`queues`) and the permits its completions freed
//! (`freed`), and the claims sent outside the loop's own state (`dispatch`).
//!
//! Invariants this stage keeps:
//! - Every job a replica runs was claimed by one statement that gave it a fresh claim id and this
//!   replica's owner id, for a queue the replica serves and a kind it registered, within its
//!   queue's cap and its key's ([`claimer`]).
//! - A replica never holds more jobs than its slots and its prefetch allow (`producer`,
//!   `prefetch`).

#[doc(hidden)]
pub mod claimer;
pub(crate) mod dispatch;
pub(crate) mod freed;
pub(crate) mod prefetch;
pub(crate) mod producer;
pub(crate) mod queues;
