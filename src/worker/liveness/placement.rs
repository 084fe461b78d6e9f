//! Where the replica's cell lives: on Citus, a role asks Citus's metadata, once a
//! [`PLACEMENT_CHECK`], whether the node the replica is connected to still holds the cell, and
//! stops the claim loop ([`Shared::moved`]) once it does not.
//!
//! Invariants this role keeps:
//! - A replica whose cell moved to another node stops claiming within a [`PLACEMENT_CHECK`] of
//!   the move's end, busy or idle (its claims and commits already fail on the node fence,
//!   `db::citus`, and an idle replica would otherwise hear of no job again: wakes are sent on the
//!   node that holds the cell).
//! - It runs only for a cell found on a Citus node at start; elsewhere it does nothing.

use crate::db;
use crate::db::citus::{locate, Placement};
use crate::worker::shared::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a replica of a cell on Citus asks where its cell lives.
pub(crate) const PLACEMENT_CHECK: Duration = Duration::from_secs(1);

/// Asks, every [`PLACEMENT_CHECK`] until `stop`, whether the cell still lives on the replica's
/// node; tells the claim loop once it moved ([`Shared::moved`]), and ends. A failed check
/// (a lost connection, say) is tried again at the next.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let Some(cell) = shared.citus_cell.clone() else {
        return;
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PLACEMENT_CHECK) => {}
        }
        let placement = async {
            let conn = db::checkout(&shared.pool).await?;
            db::bounded(shared.statement_bound, locate(&*conn, &cell)).await
        };
        match placement.await {
            Ok(Placement::Elsewhere { .. }) => {
                shared.moved.notify_one();
                return;
            }
            Ok(Placement::Here | Placement::Plain) => {}
            Err(e) => tracing::warn!(code = %e.code(), "checking where the cell lives failed"),
        }
    }
}
