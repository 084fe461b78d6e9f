//! A replica on a task of its own, stopped through its handle: what an application that embeds a
//! worker needs without wiring a [`crate::shutdown`] signal itself.
//!
//! Invariants this module keeps:
//! - [`Replica::stop`] drains as a signal does (no new claims, running jobs get the grace period,
//!   the rest are released) and returns only once the replica has stopped and closed its
//!   connections.

use crate::error::Error;
use crate::shutdown::{self, Stage, Trigger};
use crate::worker::Worker;
use tokio::task::JoinHandle;

/// A replica running on its own task (see [`Worker::spawn`]).
#[derive(Debug)]
pub struct Replica {
    /// Asks the replica to drain.
    trigger: Trigger,
    /// The replica's run.
    task: JoinHandle<Result<(), Error>>,
}

impl Worker {
    /// Runs the replica on a task of its own; [`Replica::stop`] drains and stops it. Dropping the
    /// handle leaves it running until the process ends.
    pub fn spawn(self) -> Replica {
        let (trigger, until) = shutdown::manual();
        Replica {
            trigger,
            task: tokio::spawn(self.run(until)),
        }
    }
}

impl Replica {
    /// Drains the replica (as the first shutdown signal does) and waits until it has stopped.
    ///
    /// # Errors
    /// What [`Worker::run`] ended with; [`Error::Internal`] if its task panicked.
    pub async fn stop(self) -> Result<(), Error> {
        self.trigger.request(Stage::Draining);
        self.task.await.map_err(|_| Error::Internal)?
    }
}
