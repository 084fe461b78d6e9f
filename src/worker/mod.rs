//! The worker replica. This first version checks its configuration and waits for shutdown; the
//! claim loop, execution, heartbeats and recovery arrive with the lifecycle issue.

use crate::config::{DatabaseConfig, WorkerConfig};
use crate::db::Pool;
use crate::error::Error;
use crate::shutdown::{Shutdown, Stage};

/// Runs a replica until shutdown is requested.
///
/// # Errors
/// None yet.
pub async fn run(
    pool: Pool,
    _db: DatabaseConfig,
    _config: WorkerConfig,
    mut shutdown: Shutdown,
) -> Result<(), Error> {
    shutdown.reached(Stage::Draining).await;
    drop(pool);
    Ok(())
}
