//! The operators' view of the cells of an API serving a directory's (`serve --directory`):
//! `GET /v1/cells`, and the wait the console's operator page gives each cell too.
//!
//! Invariants this module keeps:
//! - Operator keys only; to any other key, and on an API serving one cell, the route does not
//!   exist (`404 no_such_route`).
//! - Each cell is read on its own pool, all at once, each given at most half the request
//!   timeout: a cell that is down or slow is shown unreachable (`up: false`), and never holds
//!   the others back. Aggregates only: never a job, an owner or a payload.

use super::cells::{CellFigures, Cells};
use super::problem::Problem;
use super::queues::Operator;
use super::AppState;
use crate::codes::Code;
use axum::extract::State;
use axum::Json;
use serde::Serialize;
use std::time::Duration;
use utoipa::ToSchema;

/// How long the operators' view waits for one cell's figures: half the request timeout.
pub(super) fn wait_for_cell(state: &AppState) -> Duration {
    state.config.request_timeout / 2
}

/// One cell, as `GET /v1/cells` answers it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CellView {
    /// Its name (its schema).
    name: String,
    /// Whether new owners are placed in it.
    open: bool,
    /// How many owners it holds.
    owners: i64,
    /// Whether its figures could be read (its server answered in time).
    up: bool,
    /// Pending jobs due now (null when not `up`).
    pending_due: Option<i64>,
    /// Pending jobs not due yet (null when not `up`).
    pending_deferred: Option<i64>,
    /// Running jobs (null when not `up`).
    running: Option<i64>,
    /// Age of its oldest due job, in seconds, by its database's clock (0 when none is due; null
    /// when not `up`).
    oldest_due_seconds: Option<f64>,
}

impl From<CellFigures> for CellView {
    fn from(f: CellFigures) -> CellView {
        let s = f.sample.as_ref();
        CellView {
            name: f.cell.name,
            open: f.cell.open,
            owners: f.cell.owners,
            up: s.is_some(),
            pending_due: s.map(|s| s.due),
            pending_deferred: s.map(|s| s.deferred),
            running: s.map(|s| s.running),
            oldest_due_seconds: s.map(|s| s.oldest_due_seconds),
        }
    }
}

/// The cells an API serves.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CellList {
    /// Every cell the directory lists, by name.
    cells: Vec<CellView>,
}

/// Every cell of a routed API (`serve --directory`), with its active jobs: for operators.
#[utoipa::path(
    get,
    path = "/v1/cells",
    tag = "operations",
    responses(
        (status = 200, description = "Every cell the directory lists, by name, with its active jobs by state (null for a cell that did not answer in time)", body = CellList),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The key is not an operator's, or the API serves one cell: to it the route does not exist", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Directory unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    operator: Operator,
) -> Result<Json<CellList>, Problem> {
    drop(operator);
    let Cells::Routed(routed) = &state.cells else {
        return Err(Problem::new(Code::NoSuchRoute));
    };
    let figures = routed.figures(wait_for_cell(&state)).await?;
    Ok(Json(CellList {
        cells: figures.into_iter().map(CellView::from).collect(),
    }))
}
