//! Operational endpoints: liveness, readiness, metrics.
//!
//! Invariants this module keeps:
//! - `/healthz` says only that the process serves; `/readyz` that the database answers and its
//!   schema is one this release supports (on an API serving a directory's cells: that the
//!   directory answers and is built, its keys' table included; each cell is checked when opened).
//! - `/metrics` of an API serving one cell adds the cell's shared figures; a routed API's shows
//!   its own counters only.
//! - `/metrics` series carry only fixed labels (status classes), never ids or request values.

use super::cells::Cells;
use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::schema;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use utoipa::ToSchema;

/// Responses served, by status class.
#[derive(Debug, Default)]
pub(super) struct ApiMetrics {
    /// 2xx responses.
    ok: AtomicU64,
    /// 4xx responses.
    client_errors: AtomicU64,
    /// 5xx responses.
    server_errors: AtomicU64,
}

impl ApiMetrics {
    /// Counts one response.
    pub(super) fn count(&self, status: StatusCode) {
        let counter = if status.is_server_error() {
            &self.server_errors
        } else if status.is_client_error() {
            &self.client_errors
        } else {
            &self.ok
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text of these counters.
    fn render(&self) -> String {
        let samples = [
            ("2xx", self.ok.load(Ordering::Relaxed)),
            ("4xx", self.client_errors.load(Ordering::Relaxed)),
            ("5xx", self.server_errors.load(Ordering::Relaxed)),
        ];
        let family = (
            "durable_etl_http_responses",
            "HTTP responses served, by status class.",
        );
        let mut out = String::new();
        crate::service::metrics::render_counter_family(&mut out, family, "class", &samples);
        out
    }
}

/// A health answer.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Health {
    /// `ok` or `ready`.
    status: &'static str,
}

/// Liveness: the process serves.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process serves", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the database answers and its schema is compatible (routed: the directory answers
/// and is built).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Database unavailable or schema incompatible", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, Problem> {
    let ready = match &state.cells {
        Cells::One(cell) => {
            let mut conn = Conn::checkout(&cell.pool).await?;
            conn.run(|c| schema::check_compatible(&*c)).await.map(drop)
        }
        // Routed: the directory answers, keys included (each cell is checked when opened).
        Cells::Routed(routed) => {
            let mut conn = Conn::checkout(routed.directory()).await?;
            conn.run(|c| crate::directory::check(&*c)).await
        }
    };
    match ready {
        Ok(_) => Ok(Json(Health { status: "ready" })),
        Err(e) => {
            tracing::warn!(code = %e.code(), "not ready");
            Err(Problem::new(crate::codes::Code::DatabaseUnavailable))
        }
    }
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut out = state.metrics.render();
    // The shared figures (queues, jobs) are a cell's: a routed API serves its own counters only.
    if let Cells::One(cell) = &state.cells {
        crate::service::metrics::render_shared(&mut out, &cell.pool).await;
    }
    (
        [(header::CONTENT_TYPE, crate::service::metrics::TEXT_FORMAT)],
        out,
    )
}
