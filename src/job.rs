//! The contract a kind implements: a [`Job`] is a Rust type whose value is the payload; a
//! [`Perform`] computes its effects with no connection held; its [`Apply`] writes them inside the
//! fenced transaction that records its success; a [`Registry`] maps kinds to what runs them.
//!
//! ## Quick start
//! A kind of your own, enqueued with a domain write in one transaction, run by a worker
//! (`examples/quick_start.rs`, run by CI):
//!
//! ```no_run
#![doc = include_str!("../examples/quick_start.rs")]
//! ```
//!
//! Invariants this module keeps:
//! - A kind's name ([`Job::KIND`]) is what is stored with its jobs and matched to its handler;
//!   its payload is the value serialized by `serde`.
//! - A typed kind sees only its own types: the untyped contract underneath (`handler`) is the
//!   worker's, not the user's.

pub mod diagnosis;
#[doc(hidden)]
pub mod handler;
mod kind;
mod perform;

pub use diagnosis::{Detail, Diagnosis};
pub use handler::{JobContext, JobError, LeaseLost, Registry, RETRY_AFTER_MAX};
pub use kind::Job;
pub use perform::{Apply, Perform};
