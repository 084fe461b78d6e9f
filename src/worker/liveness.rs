//! The liveness stage: how a replica stays known alive and how the dead are recovered. The
//! heartbeat renews held leases ([`heartbeat`], over `held`); the rescuer recovers dead owners'
//! and expired leases' jobs ([`rescuer`]), judging owners by their alive locks (`alive`) and
//! their beats (`beat`); the
//! session LISTENs and holds the owner lock (`session`); presence says whether the replica
//! waits for work (`presence`); the reporter tells the console how the replica fares
//! (`reporter`).
//!
//! Invariants this stage keeps:
//! - A replica stops trusting a lease before the database expires it, and before recovery may
//!   judge it dead by its beats (`beat`); recovery judges an owner dead only on evidence (its
//!   locks gone and its beats silent, or its leases expired).

pub(crate) mod alive;
pub(crate) mod beat;
pub(crate) mod direct;
#[doc(hidden)]
pub mod heartbeat;
pub(crate) mod held;
pub(crate) mod presence;
#[doc(hidden)]
pub mod refund;
pub(crate) mod reporter;
#[doc(hidden)]
pub mod rescuer;
pub(crate) mod session;
pub(crate) mod sessions_kept;
