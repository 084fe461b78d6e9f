//! The maintenance stage: the replica's periodic roles, which look after every owner's jobs
//! rather than the replica's own. Recovery ([`rescuer`]) returns dead owners' and expired
//! leases' jobs; the refund ([`refund`]) gives back what recovery charged this replica while it
//! was only cut off; the scheduler ([`scheduler`]) fires every owner's due schedules; the
//! pruner ([`prune`]) deletes what is kept only for a time; the vacuum ([`vacuum`]) removes
//! the live table's dead row versions while the replica churns it.
//!
//! Invariants this stage keeps:
//! - Recovery judges an owner dead only on evidence: its locks gone and its beats silent
//!   (`liveness::beat`), or its leases expired; what it charged a live replica is refunded.
//! - Its roles use the liveness stage (sessions, beats, presence) and nothing above it.

#[doc(hidden)]
pub mod prune;
#[doc(hidden)]
pub mod refund;
#[doc(hidden)]
pub mod rescuer;
#[doc(hidden)]
pub mod scheduler;
#[doc(hidden)]
pub mod vacuum;

use crate::worker::shared::Shared;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Starts the stage's roles in `roles`, each until `stop`: recovery (`catch_up` asks the claim
/// loop to look again once it freed jobs), the refund, the scheduler, the pruner and the vacuum.
pub(crate) fn spawn(
    roles: &mut JoinSet<()>,
    shared: &Arc<Shared>,
    catch_up: &Arc<Notify>,
    stop: &CancellationToken,
) {
    roles.spawn(rescuer::run(
        Arc::clone(shared),
        Arc::clone(catch_up),
        stop.clone(),
    ));
    roles.spawn(refund::run(Arc::clone(shared), stop.clone()));
    roles.spawn(prune::run(Arc::clone(shared), stop.clone()));
    roles.spawn(scheduler::run(Arc::clone(shared), stop.clone()));
    roles.spawn(vacuum::run(Arc::clone(shared), stop.clone()));
}
