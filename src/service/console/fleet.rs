//! The operators' pages of the console: the operator view, the queues, a queue's jobs and a
//! failure code's jobs.
//!
//! Invariants this module keeps:
//! - Every page is for operator keys only: without a session it redirects to sign-in, and to
//!   any other key it does not exist (`404`, the same page as a path that names nothing), before
//!   anything is read ([`OperatorViewer`]).
//! - A queue's name or a failure code that is not an identifier the schema could store names
//!   nothing (`404`) and is never sent to the database. Nor does a page echo a name a request
//!   made up: a queue with neither live jobs nor settings, and a code that is not the crate's
//!   and that no job of the window ended with, are `404` too.
//! - A page's reads run in one read-only snapshot, so a queue's counts and its jobs agree.

use super::access::{self, not_found, page, shown, OperatorViewer};
use super::{drill, fleet_pages, operator};
use crate::codes::Code;
use crate::error::Error;
use crate::service::cell_view::wait_for_cell;
use crate::service::cells::Cells;
use crate::service::metrics::{listed_queues, sample_some_queues};
use crate::service::problem::Problem;
use crate::service::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

/// The operator view.
pub(super) async fn operator_page(
    State(state): State<AppState>,
    OperatorViewer(viewer, mut conn): OperatorViewer,
) -> Result<Response, Problem> {
    let mut overview = conn.run(|c| operator::overview(&*c)).await?;
    drop(conn);
    if let Cells::Routed(routed) = &state.cells {
        overview.cells = Some(routed.figures(wait_for_cell(&state)).await?);
    }
    Ok(page(
        StatusCode::OK,
        fleet_pages::operator(shown(&viewer), &overview),
    ))
}

/// The queues: each with its jobs by state, cap usage and pause.
pub(super) async fn queues_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
) -> Result<Response, Problem> {
    let (queues, more) = conn.run(|c| listed_queues(&*c)).await?;
    Ok(page(
        StatusCode::OK,
        fleet_pages::queues(shown(&viewer), &queues, more),
    ))
}

/// One queue's figures and live jobs.
pub(super) async fn queue_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    if !crate::queue::is_queue_name(&name) {
        return Ok(not_found(&viewer));
    }
    let name = name.as_str();
    let (sample, jobs) = conn
        .run(|c| async move {
            let snapshot = access::snapshot(c).await?;
            let read = tokio::try_join!(
                sample_some_queues(&snapshot, 1, Some(name)),
                drill::queue_jobs(&snapshot, name)
            )?;
            snapshot.commit().await?;
            Ok::<_, Error>(read)
        })
        .await?;
    Ok(match sample.first() {
        Some(queue) => page(
            StatusCode::OK,
            fleet_pages::queue(shown(&viewer), queue, &jobs),
        ),
        None => not_found(&viewer),
    })
}

/// The newest jobs that ended with one failure code.
pub(super) async fn failure_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
    Path(code): Path<String>,
) -> Result<Response, Problem> {
    if !crate::names::is_identifier(&code, &[]) {
        return Ok(not_found(&viewer));
    }
    let now = chrono::Utc::now();
    let jobs = conn.run(|c| drill::code_jobs(&*c, &code, now)).await?;
    // A code is shown only when it is one of the crate's or some job ended with it: a page never
    // echoes what a request made up.
    let known = Code::parse(&code).is_some_and(Code::is_stored_failure);
    if !known && jobs.is_empty() {
        return Ok(not_found(&viewer));
    }
    Ok(page(
        StatusCode::OK,
        fleet_pages::failure(shown(&viewer), &code, &jobs),
    ))
}
