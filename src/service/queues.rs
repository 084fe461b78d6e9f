//! The operators' queue resources: every queue (`GET /v1/queues`) and one (`GET
//! /v1/queues/{name}`), with its jobs by state, its oldest due job's age, its cap and the
//! permits held of it, and its pause.
//!
//! Invariants this module keeps:
//! - On an API serving every cell of a directory, `?cell=NAME` reads cell `NAME` instead of the
//!   operator key's own (a cell the directory does not list, or any cell on an API serving one,
//!   is `404 no_such_route`); the key is checked in its own cell first.
//! - Only an operator key (migration 0010) reads them. A request without a live key is
//!   `401 unauthorized`; a live key that is not an operator's is answered `404 no_such_route`,
//!   as if the route did not exist (as the console's operator pages answer it), before anything
//!   else is read.
//! - Aggregates only, from the per-queue sample the metrics take (`metrics::queues`): a queue's
//!   name is the only thing of a job's that is shown, never a job, an owner or a payload.
//! - The listing is bounded: at most [`QUEUES_SHOWN`](crate::service::metrics::QUEUES_SHOWN) queues, the deepest first, with
//!   `truncated` saying whether more were left out. A name that is not a queue's name, or a queue
//!   with neither live jobs nor settings, is `404 no_such_route`, and a name is only sent to the
//!   database once it is a valid queue name.

use super::caller::Caller;
use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::config::cell_name_ok;
use crate::service::api_keys::Role;
use crate::service::metrics::{listed_queues, sample_some_queues, QueueDepth};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An authenticated operator's request, with the connection that authenticated it (the handler's
/// read runs on it: one checkout per request).
pub(super) struct Operator(Conn);

impl FromRequestParts<AppState> for Operator {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Operator, Problem> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if caller.holder.role != Role::Operator {
            return Err(Problem::new(Code::NoSuchRoute));
        }
        let Query(aimed) = Query::<Aimed>::try_from_uri(&parts.uri)
            .map_err(|_| Problem::new(Code::QueryInvalid))?;
        let Some(name) = aimed.cell else {
            return Ok(Operator(caller.conn));
        };
        // Another cell of an API serving a directory's: its own pool, the caller's connection
        // given back first.
        drop(caller.conn);
        let cell = match cell_name_ok(&name) {
            true => state.cells.named(&name).await?,
            false => None,
        };
        let cell = cell.ok_or_else(|| Problem::new(Code::NoSuchRoute))?;
        Ok(Operator(Conn::checkout(&cell.pool).await?))
    }
}

/// The cell an operator's request is aimed at (`?cell=NAME`, on an API serving every cell of a
/// directory); none: the operator key's own.
#[derive(Debug, Deserialize)]
struct Aimed {
    /// The cell's name.
    cell: Option<String>,
}

/// One queue: its jobs by state, its oldest due job's age, its cap and pause.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct Queue {
    /// The queue's name.
    name: String,
    /// Pending jobs due now.
    pending_due: i64,
    /// Pending jobs not due yet (deferred, or waiting to retry).
    pending_deferred: i64,
    /// Running jobs.
    running: i64,
    /// Age of its oldest due job, in seconds, by the database's clock (0 when none is due).
    oldest_due_seconds: f64,
    /// Its cap on running jobs, if it has one.
    cap: Option<i32>,
    /// Permits of its cap held by running claims (0 without a cap).
    permits_held: i64,
    /// `permits_held / cap`, from 0 to 1 (above 1 only while a lowered cap drains); null without
    /// a cap.
    cap_usage: Option<f64>,
    /// Whether it is paused (replicas claim none of its jobs).
    paused: bool,
    /// Of its due jobs, those whose kind no live replica serving the queue runs: they wait for
    /// one that does (a replica counts as live for a minute after its last report).
    pending_unserved: i64,
    /// Its cap on running jobs of one concurrency key, if it has one.
    key_cap: Option<i32>,
    /// Key permits held by running claims (0 without a key cap).
    key_permits_held: i64,
}

impl From<QueueDepth> for Queue {
    fn from(q: QueueDepth) -> Queue {
        Queue {
            cap_usage: q
                .cap
                .map(|cap| q.permits_held as f64 / f64::from(cap.max(1))),
            name: q.queue,
            pending_due: q.due,
            pending_deferred: q.deferred,
            running: q.running,
            oldest_due_seconds: q.oldest_due_seconds,
            cap: q.cap,
            permits_held: q.permits_held,
            paused: q.paused,
            pending_unserved: q.unserved,
            key_cap: q.key_cap,
            key_permits_held: q.key_permits_held,
        }
    }
}

/// The queues with live jobs or settings.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct QueueList {
    /// At most 100 queues (`QUEUES_SHOWN`), the deepest (most live jobs) first, then by name.
    queues: Vec<Queue>,
    /// Whether more queues have live jobs or settings than are listed.
    truncated: bool,
}

/// Every queue with live jobs or settings, the deepest first (at most [`QUEUES_SHOWN`](crate::service::metrics::QUEUES_SHOWN)).
#[utoipa::path(
    get,
    path = "/v1/queues",
    tag = "operations",
    params(("cell" = Option<String>, Query, description = "On an API serving every cell of a directory: the cell to read (default: the operator key's own)")),
    responses(
        (status = 200, description = "The queues with live jobs or settings, the deepest first: at most 100, and `truncated` says whether more were left out", body = QueueList),
        (status = 400, description = "The query is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The key is not an operator's (to it the route does not exist), or no cell of that name is listed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn list(Operator(mut conn): Operator) -> Result<Json<QueueList>, Problem> {
    let (queues, truncated) = conn.run(|c| listed_queues(&*c)).await?;
    Ok(Json(QueueList {
        queues: queues.into_iter().map(Queue::from).collect(),
        truncated,
    }))
}

/// One queue.
#[utoipa::path(
    get,
    path = "/v1/queues/{name}",
    tag = "operations",
    params(
        ("name" = String, Path, description = "The queue's name"),
        ("cell" = Option<String>, Query, description = "On an API serving every cell of a directory: the cell to read (default: the operator key's own)"),
    ),
    responses(
        (status = 200, description = "The queue", body = Queue),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such queue (none with live jobs or settings), or the key is not an operator's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_queue(
    Operator(mut conn): Operator,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Queue>, Problem> {
    let no_such = || Problem::new(Code::NoSuchRoute);
    let Path(name) = name.map_err(|_| no_such())?;
    if !crate::queue::is_queue_name(&name) {
        return Err(no_such());
    }
    let sampled = conn
        .run(|c| sample_some_queues(&*c, 1, Some(&name)))
        .await?;
    sampled
        .into_iter()
        .next()
        .map(|q| Json(Queue::from(q)))
        .ok_or_else(no_such)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_usage_is_held_over_cap_and_null_without_a_cap() {
        let depth = QueueDepth {
            queue: "mail".to_owned(),
            cap: Some(4),
            permits_held: 1,
            ..QueueDepth::default()
        };
        let queue = Queue::from(depth.clone());
        assert_eq!((queue.name.as_str(), queue.cap_usage), ("mail", Some(0.25)));
        let uncapped = Queue::from(QueueDepth { cap: None, ..depth });
        assert_eq!(uncapped.cap_usage, None);
    }
}
