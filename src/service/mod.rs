//! The shipped HTTP service (`durable-etl serve`, the `service` feature): the owner-scoped API
//! that submits, monitors, lists and cancels ETL jobs with RFC 9110 `202 Accepted`
//! status-monitor semantics, the operator's web console, API keys, and Prometheus metrics.
//! [`app`] builds its router.
//!
//! Invariants this module keeps:
//! - Every job route authenticates a bearer API key and acts only on the key owner's jobs; a job
//!   of another owner answers exactly like a job that does not exist (`404`).
//! - The queue routes (`queues`) serve operator keys only, aggregates only; to any other live
//!   key they do not exist (`404 no_such_route`).
//! - Every action an operator's key takes, through the API or the console, writes one entry to
//!   the audit log (`audit`) with the key's id and its source; an owner's key acting on its own
//!   owner's jobs and letters writes none.
//! - Accepting a job answers `202` with `Location` (the status monitor) and `Retry-After`; the
//!   monitor answers `200` with the job's status, and `Retry-After` while it is not over.
//! - Errors are RFC 9457 problems with stable codes (see `problem`); no request value, SQL or
//!   internal error text is ever echoed.
//! - Request time, body size and concurrency are bounded by layers (tower-http's timeout and
//!   body limit, tower's concurrency limit); what those layers answer themselves becomes the
//!   same problem as everything else. The OpenAPI document is generated from the same handlers
//!   that serve the routes.

pub mod api_keys;
mod audit;
mod caller;
mod cell_view;
mod cells;
mod conn;
mod console;
mod dead_letters;
mod jobs;
#[doc(hidden)]
pub mod metrics;
mod ops;
#[doc(hidden)]
pub mod problem;
mod queues;
#[doc(hidden)]
pub mod schedules;

use crate::codes::Code;
use crate::config::{ApiConfig, DatabaseConfig};
use crate::db::Pool;
use crate::dead_letters::PayloadKey;
use crate::digest::Secret;
use crate::error::Error;
use crate::jobs::notifier::Notifier;
use crate::shutdown::{Shutdown, Stage};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::handler::Handler;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use cells::{CellPool, Cells, Routed};
use problem::Problem;
use std::sync::Arc;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The cell (or the directory's cells) it serves.
    cells: Cells,
    /// The digest secret.
    secret: Secret,
    /// The API configuration.
    config: ApiConfig,
    /// Response counters for `/metrics`.
    metrics: Arc<ops::ApiMetrics>,
    /// The key retained payloads are sealed under and opened with (`None` only for a key id
    /// the configuration's validation refuses).
    payload_key: Option<PayloadKey>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

impl AppState {
    /// The state of an API serving `pool` with `secret` and `config`.
    pub fn new(pool: Pool, secret: Secret, config: ApiConfig) -> AppState {
        let cell = CellPool::new(pool, None);
        AppState::serving(Cells::One(Arc::new(cell)), secret, config)
    }

    /// The state of an API serving every cell of the directory `directory` connects to (its
    /// configuration `base`): each request acts in the cell of its key's owner, whose pool is
    /// opened (from `base`, pointed at the cell) the first time a request needs it, with a
    /// notifier of its own. Its keys are those `api-keys create --directory` recorded.
    pub fn routed(
        directory: Pool,
        base: DatabaseConfig,
        secret: Secret,
        config: ApiConfig,
    ) -> AppState {
        let routed = Routed::new(directory, base);
        AppState::serving(Cells::Routed(Arc::new(routed)), secret, config)
    }

    /// The state of an API serving `cells`.
    fn serving(cells: Cells, secret: Secret, config: ApiConfig) -> AppState {
        AppState {
            payload_key: PayloadKey::derive(&secret, &config.payload_key_id),
            cells,
            secret,
            config,
            metrics: Arc::default(),
        }
    }

    /// This state with submissions waking the replicas through `notifier` (one coalesced NOTIFY
    /// after their commits) instead of the enqueue trigger's NOTIFY inside each transaction. A
    /// routed state is returned as it is: each of its cells has a notifier of its own.
    pub fn with_notifier(self, notifier: Notifier) -> AppState {
        let cells = match self.cells {
            Cells::One(cell) => {
                Cells::One(Arc::new(CellPool::new(cell.pool.clone(), Some(notifier))))
            }
            routed @ Cells::Routed(_) => routed,
        };
        AppState { cells, ..self }
    }
}

/// The OpenAPI document, generated from the handlers' `#[utoipa::path]` attributes. A test
/// checks that every documented operation is routed, and that every route is documented.
#[derive(OpenApi)]
#[openapi(
    info(title = "durable-etl", description = "Owner-scoped ETL jobs with 202 Accepted status monitors."),
    paths(jobs::submit, jobs::list, cell_view::list, jobs::get_job, jobs::cancel_job, jobs::get_attempts, ops::healthz, ops::readyz, ops::metrics,
          queues::list, queues::get_queue, schedules::list, schedules::get_schedule,
          schedules::put_schedule, schedules::delete_schedule, schedules::pause, schedules::resume,
          schedules::fires, dead_letters::list, dead_letters::counts, dead_letters::get_letter,
          dead_letters::discard_letter, dead_letters::replay_letter, dead_letters::replay_matching,
          dead_letters::discard_matching),
    components(schemas(crate::jobs::JobStatus, crate::jobs::JobFailure, jobs::AttemptList,
                       jobs::AttemptView, jobs::FailedAttemptView, crate::job::Diagnosis,
                       crate::job::diagnosis::ErrorLink, crate::job::diagnosis::Phase,
                       crate::job::diagnosis::Decision,
                       problem::Problem, cell_view::CellView, cell_view::CellList, jobs::JobList, jobs::CancelAccepted, ops::Health, crate::kinds::etl::request::EtlRequest,
                       queues::Queue, queues::QueueList, schedules::ScheduleView,
                       schedules::ScheduleList, schedules::ScheduleBody, schedules::FireView,
                       schedules::FireList, dead_letters::LetterView, dead_letters::LetterList,
                       dead_letters::CountView, dead_letters::CountList, dead_letters::ReplayView,
                       dead_letters::BulkReplayView, dead_letters::DiscardView, dead_letters::Filter)),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

/// Adds the bearer security scheme.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The routes, each served by the handler its OpenAPI operation documents. The one route that
/// reads a body refuses one over `body_limit` bytes: at once when its `Content-Length` says so,
/// else when the body read crosses the limit (the handler answers that rejection itself).
fn routes(body_limit: usize) -> Router<AppState> {
    let submit = jobs::submit.layer(RequestBodyLimitLayer::new(body_limit));
    let put_schedule = schedules::put_schedule.layer(RequestBodyLimitLayer::new(body_limit));
    let replay = dead_letters::replay_letter.layer(RequestBodyLimitLayer::new(body_limit));
    let replay_matching =
        dead_letters::replay_matching.layer(RequestBodyLimitLayer::new(body_limit));
    let discard_matching =
        dead_letters::discard_matching.layer(RequestBodyLimitLayer::new(body_limit));
    Router::new()
        .route("/v1/etl-jobs", get(jobs::list).post(submit))
        .route(
            "/v1/etl-jobs/{id}",
            get(jobs::get_job).delete(jobs::cancel_job),
        )
        .route("/v1/etl-jobs/{id}/attempts", get(jobs::get_attempts))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/v1/cells", get(cell_view::list))
        .route("/v1/queues", get(queues::list))
        .route("/v1/queues/{name}", get(queues::get_queue))
        .route("/v1/schedules", get(schedules::list))
        .route(
            "/v1/schedules/{name}",
            get(schedules::get_schedule)
                .put(put_schedule)
                .delete(schedules::delete_schedule),
        )
        .route("/v1/schedules/{name}/pause", post(schedules::pause))
        .route("/v1/schedules/{name}/resume", post(schedules::resume))
        .route("/v1/schedules/{name}/fires", get(schedules::fires))
        .route("/v1/dead-letters", get(dead_letters::list))
        .route("/v1/dead-letters/counts", get(dead_letters::counts))
        .route("/v1/dead-letters/replay", post(replay_matching))
        .route("/v1/dead-letters/discard", post(discard_matching))
        .route(
            "/v1/dead-letters/{id}",
            get(dead_letters::get_letter).delete(dead_letters::discard_letter),
        )
        .route("/v1/dead-letters/{id}/replay", post(replay))
        .merge(console::routes())
}

/// The OpenAPI 3.1 document of the API, as served at `/openapi.json`.
pub fn openapi() -> serde_json::Value {
    document(ApiDoc::openapi())
}

/// The JSON of `doc`, with the request-body schemas utoipa's model cannot express put in place.
fn document(doc: utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut json = serde_json::to_value(doc).unwrap_or_default();
    for (name, schema) in jobs::request_schemas() {
        json["components"]["schemas"][name] = schema;
    }
    json
}

/// The application: every route with its layers, over `state`.
pub fn app(state: AppState) -> Router {
    let router = routes(state.config.limits.max_bytes);
    let doc = Arc::new(openapi());
    let timeout = state.config.request_timeout;
    let concurrency = state.config.max_concurrency;
    router
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = Arc::clone(&doc);
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        // The service's root leads to the console, which signs a visitor in.
        .route(
            "/",
            get(|| async { axum::response::Redirect::to("/console") }),
        )
        .fallback(|| async { Problem::new(Code::NoSuchRoute) })
        // axum adds the `Allow` header to this fallback's answer.
        .method_not_allowed_fallback(|| async { Problem::new(Code::MethodNotAllowed) })
        // The submit route's `RequestBodyLimitLayer` is the one body limit; axum's own default
        // (2 MiB, applied by the body extractor) would otherwise cap a larger `--max-bytes`.
        .layer(DefaultBodyLimit::disable())
        // Answers a bare 503 once a request has taken `request_timeout`, dropping its handler.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            timeout,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), answered))
        .layer(ConcurrencyLimitLayer::new(concurrency))
        .with_state(state)
}

/// Turns the bare answers of the timeout and body-limit layers into problems, and counts every
/// response by status class (timeouts included).
async fn answered(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let response = as_problem(next.run(request).await);
    state.metrics.count(response.status());
    response
}

/// `response`, or the problem it stands for when a layer answered it without one: a 503 is the
/// timeout layer's (every handler's 503 is a problem already), a 413 the body limit's.
fn as_problem(response: Response) -> Response {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/problem+json");
    match response.status() {
        StatusCode::SERVICE_UNAVAILABLE if !is_problem => {
            Problem::new(Code::RequestTimeout).into_response()
        }
        StatusCode::PAYLOAD_TOO_LARGE if !is_problem => {
            Problem::new(Code::RequestTooLarge).into_response()
        }
        _ => response,
    }
}

/// The web console's address on a server listening on `listen`: on this host's loopback when
/// it listens on every interface.
fn console_url(listen: std::net::SocketAddr) -> String {
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_owned(),
        ip if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    format!("http://{host}:{}/console", listen.port())
}

/// Serves the API of `state` on its `listen` address until `shutdown` asks it to drain.
///
/// # Errors
/// [`Error::Config`] when the configuration is invalid; [`Error::Listen`] when the address
/// cannot be bound.
pub async fn serve(state: AppState, mut shutdown: Shutdown) -> Result<(), Error> {
    state.config.validate()?;
    let address = state.config.listen;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Listen { address, source })?;
    tracing::info!(
        listen = %state.config.listen,
        console = %console_url(address),
        "serving"
    );
    let app = app(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.reached(Stage::Draining).await })
        .await
        .map_err(|_| Error::Unavailable(None))?;
    tracing::info!("stopped serving");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{console_url, AppState, Cells};
    use crate::config::ApiConfig;
    use crate::jobs::notifier::Notifier;
    use crate::test_db::TestDb;

    #[tokio::test]
    async fn a_notifier_is_the_one_cells_and_a_routed_state_keeps_its_cells() {
        let db = TestDb::migrated().await;
        let pool = crate::db::connect_pool(&db.config, "api").await.unwrap();
        let secret = crate::Secret::new("service-test-secret-0123").unwrap();
        let config = ApiConfig::default();
        let notifier = || Notifier::start(&db.config).unwrap();
        let one = AppState::new(pool.clone(), secret.clone(), config.clone());
        let Cells::One(cell) = &one.with_notifier(notifier()).cells else {
            panic!("one cell");
        };
        assert!(cell.notifier.is_some());
        // A routed state's cells each start a notifier of their own when opened (see `cells`);
        // one given to the state is not theirs.
        let routed = AppState::routed(pool, db.config.clone(), secret, config);
        let Cells::Routed(before) = &routed.cells else {
            panic!("routed");
        };
        let before = std::sync::Arc::clone(before);
        let Cells::Routed(after) = &routed.with_notifier(notifier()).cells else {
            panic!("still routed");
        };
        assert!(std::sync::Arc::ptr_eq(&before, after));
    }

    #[test]
    fn the_console_url_names_a_host_a_browser_can_open() {
        let url = |listen: &str| console_url(listen.parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(url("0.0.0.0:8080"), "http://127.0.0.1:8080/console");
        assert_eq!(url("[::]:8080"), "http://[::1]:8080/console");
        assert_eq!(url("10.1.2.3:80"), "http://10.1.2.3:80/console");
        assert_eq!(url("[fe80::1]:80"), "http://[fe80::1]:80/console");
    }
}
