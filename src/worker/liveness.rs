//! The liveness stage: how a replica stays known alive. The heartbeat renews held leases
//! ([`heartbeat`], over `held`); every connection holds the owner's alive lock (`alive`) and the
//! session beats (`beat`), which is what recovery (`worker::maintain`) judges owners by; the
//! session LISTENs and holds the owner lock (`session`); presence says whether the replica
//! waits for work (`presence`); the reporter tells the console how the replica fares
//! (`reporter`), and once a minute how the backlog does (`backlog`); on Citus, the replica
//! watches that its node still holds its cell (`placement`).
//!
//! Invariants this stage keeps:
//! - A replica stops trusting a lease before the database expires it, and before recovery may
//!   judge it dead by its beats (`beat`).

pub(crate) mod alive;
pub(crate) mod backlog;
pub(crate) mod beat;
pub(crate) mod direct;
#[doc(hidden)]
pub mod heartbeat;
pub(crate) mod held;
pub(crate) mod placement;
pub(crate) mod presence;
pub(crate) mod reporter;
pub(crate) mod session;
pub(crate) mod sessions_kept;
