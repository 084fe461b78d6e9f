//! Shutdown: one signal source that the worker and the HTTP server both watch.
//!
//! Invariants this module keeps:
//! - The stage only moves forward: `Running` → `Draining` → `Immediate`.
//! - The first SIGTERM or SIGINT asks for a graceful drain; a second one asks for an immediate stop
//!   (the grace period shortens to zero).

use tokio::sync::watch;

/// How far shutdown has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// No shutdown was asked for.
    Running,
    /// Stop taking work; let running work finish within the grace period.
    Draining,
    /// Stop now: the grace period is over.
    Immediate,
}

/// A receiver of shutdown requests. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// The stage, as last published by the trigger.
    rx: watch::Receiver<Stage>,
}

/// The sending side of a [`Shutdown`].
#[derive(Debug)]
pub struct Trigger {
    /// Publishes the stage.
    tx: watch::Sender<Stage>,
}

impl Trigger {
    /// Moves shutdown forward to `stage`; a request to move backwards is ignored.
    pub fn request(&self, stage: Stage) {
        self.tx.send_if_modified(|current| {
            let forward = stage > *current;
            if forward {
                *current = stage;
            }
            forward
        });
    }
}

/// A trigger and the shutdown it controls (for tests and embedding applications).
pub fn manual() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(Stage::Running);
    (Trigger { tx }, Shutdown { rx })
}

impl Shutdown {
    /// The current stage.
    pub fn stage(&self) -> Stage {
        *self.rx.borrow()
    }

    /// Resolves once the stage is at least `stage` (at once if it already is, or if every trigger
    /// is gone).
    pub async fn reached(&mut self, stage: Stage) {
        // An error means the trigger is gone; nobody can ask for more, so stop waiting.
        let _ = self.rx.wait_for(|current| *current >= stage).await;
    }

    /// A shutdown that follows this one and that the returned trigger can also move forward on
    /// its own: what one part of a process uses to stop the others (the replicas of the other
    /// cells, when one cell's stops with an error) while a signal still stops them all. Call it
    /// inside a tokio runtime.
    pub fn child(&self) -> (std::sync::Arc<Trigger>, Shutdown) {
        let (trigger, child) = manual();
        let trigger = std::sync::Arc::new(trigger);
        let (mut parent, forward) = (self.clone(), std::sync::Arc::clone(&trigger));
        tokio::spawn(async move {
            for stage in [Stage::Draining, Stage::Immediate] {
                parent.reached(stage).await;
                // `reached` also returns once the parent's triggers are gone: that asks nothing.
                if parent.stage() < stage {
                    return;
                }
                forward.request(stage);
            }
        });
        (trigger, child)
    }
}

/// A shutdown driven by SIGTERM and SIGINT: the first signal drains, the second stops at once.
pub fn signals() -> Shutdown {
    let (trigger, shutdown) = manual();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: draining");
        trigger.request(Stage::Draining);
        wait_for_signal().await;
        tracing::info!("second shutdown signal: stopping now");
        trigger.request(Stage::Immediate);
    });
    shutdown
}

/// Resolves at the next SIGTERM or SIGINT.
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers nothing can ask for shutdown but a kill; wait forever.
        _ => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stages_only_move_forward() {
        let (trigger, mut shutdown) = manual();
        assert_eq!(shutdown.stage(), Stage::Running);
        trigger.request(Stage::Immediate);
        trigger.request(Stage::Draining);
        assert_eq!(shutdown.stage(), Stage::Immediate);
        shutdown.reached(Stage::Draining).await;
        drop(trigger);
        shutdown.reached(Stage::Immediate).await;
    }

    #[tokio::test]
    async fn a_child_follows_its_parent_and_stops_alone_on_its_own_trigger() {
        let (parent_trigger, parent) = manual();
        let (trigger, mut child) = parent.child();
        parent_trigger.request(Stage::Draining);
        child.reached(Stage::Draining).await;
        parent_trigger.request(Stage::Immediate);
        child.reached(Stage::Immediate).await;
        // Its own trigger moves it, not the parent.
        let (_parent_trigger, parent) = manual();
        let (trigger_2, mut alone) = parent.child();
        trigger_2.request(Stage::Draining);
        alone.reached(Stage::Draining).await;
        assert_eq!(parent.stage(), Stage::Running);
        // A parent whose trigger is gone asks nothing of the child.
        let (gone, parent) = manual();
        let (_kept, quiet) = parent.child();
        drop(gone);
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(quiet.stage(), Stage::Running);
        drop(trigger);
    }

    #[tokio::test]
    async fn a_dropped_trigger_releases_waiters() {
        let (trigger, mut shutdown) = manual();
        drop(trigger);
        shutdown.reached(Stage::Draining).await;
        assert_eq!(shutdown.stage(), Stage::Running);
    }
}
