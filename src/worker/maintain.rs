//! The maintenance stage: the replica's periodic roles, which look after every owner's jobs
//! rather than the replica's own. Recovery ([`rescuer`]) returns dead owners' and expired
//! leases' jobs; the refund ([`refund`]) gives back what recovery charged this replica while it
//! was only cut off.
//!
//! Invariants this stage keeps:
//! - Recovery judges an owner dead only on evidence: its locks gone and its beats silent
//!   (`liveness::beat`), or its leases expired; what it charged a live replica is refunded.
//! - Its roles use the liveness stage (sessions, beats, presence) and nothing above it.

#[doc(hidden)]
pub mod refund;
#[doc(hidden)]
pub mod rescuer;
