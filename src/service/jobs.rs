//! The job resources: submit (`POST /v1/etl-jobs`), the status monitor (`GET
//! /v1/etl-jobs/{id}`), its attempts with their diagnoses (`GET /v1/etl-jobs/{id}/attempts`),
//! the owner's listing (`GET /v1/etl-jobs`) and cancellation (`DELETE /v1/etl-jobs/{id}`).
//!
//! Invariants this module keeps:
//! - Authentication happens before anything else is looked at; every query is owner-scoped.
//! - A submission is validated completely before anything is written, then enqueued (with any
//!   replacement) in one transaction. With the process's notifier, that transaction skips the
//!   enqueue trigger's NOTIFY, and the notifier is signalled only after it committed.
//! - Responses carry only the job's own id, status fields, ledger summary and its attempts'
//!   diagnoses (metadata: phases, decisions, durations, type names, a kind's declared detail).
//! - A cancellation never waits for a commit that holds the job: its `202` says whether the job
//!   may still succeed (`may_still_succeed`), and after `true` the request is applied by a task
//!   of the process's own (`settle_deferred`), which runs its statements to their end (never
//!   cut, so its connection goes back to the pool idle).

use super::caller::Caller;
use super::cells::CellPool;
use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::dead_letters::Retain;
use crate::error::Error;
use crate::job::Diagnosis;
use crate::jobs::notifier;
use crate::jobs::state::JobState;
use crate::jobs::{self, Cancel, JobStatus};
use crate::kinds::etl::enqueue::{self, NewJob, MAX_ATTEMPTS_DEFAULT};
use crate::kinds::etl::request::{self, EtlRequest};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};
use uuid::Uuid;

/// The owner digest of an authenticated request (its [`Caller`]'s key's owner), and the cell it
/// acts in. It holds no connection: a handler checks one out once it has read its request.
pub(super) struct Owner(pub(super) [u8; 32], pub(super) Arc<CellPool>);

impl Owner {
    /// A connection of the owner's cell.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the pool cannot hand one out in time.
    pub(super) async fn checkout(&self) -> Result<Conn, Error> {
        Conn::checkout(&self.1.pool).await
    }
}

impl FromRequestParts<AppState> for Owner {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Owner, Problem> {
        let caller = Caller::from_request_parts(parts, state).await?;
        Ok(Owner(caller.holder.owner_key, caller.cell))
    }
}

/// The id of a job path, or `not_found`: a segment that does not decode (say `%FF`) names no job.
fn job_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Problem> {
    let Path(id) = path.map_err(|_| Problem::new(Code::NotFound))?;
    Uuid::parse_str(&id).map_err(|_| Problem::new(Code::NotFound))
}

/// The pattern of a string without U+0000 (PostgreSQL's `jsonb` cannot store one).
const NO_NUL: &str = r"^[^\u0000]*$";

/// Registers the request body as a component; its JSON Schema is `request_schemas`, which
/// `api::openapi` puts in place (utoipa's schema model cannot express all of it).
impl PartialSchema for EtlRequest {
    fn schema() -> RefOr<Schema> {
        RefOr::T(Schema::default())
    }
}

impl ToSchema for EtlRequest {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EtlRequest")
    }
}

/// The JSON Schemas of the request body, as the intake validator (`etl::request`) enforces it:
/// `EtlRequest`, and `JsonValue` (any JSON `jsonb` can store: no U+0000 in any string or name).
pub(super) fn request_schemas() -> [(&'static str, serde_json::Value); 2] {
    use crate::kinds::etl::transform::MAX_SPEC_FIELDS;
    let value = serde_json::json!({"$ref": "#/components/schemas/JsonValue"});
    let field =
        serde_json::json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": NO_NUL});
    let object = serde_json::json!({"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": value});
    let request = serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["dataset", "key", "records"],
        "properties": {
            "dataset": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,62}$"},
            "key": field,
            "records": {"type": "array", "items": object},
            "transform": {
                "type": ["object", "null"],
                "additionalProperties": false,
                "properties": {
                    "select": {"type": "array", "items": field, "maxItems": MAX_SPEC_FIELDS},
                    "required": {"type": "array", "items": field, "maxItems": MAX_SPEC_FIELDS},
                    "rename": {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": field,
                               "maxProperties": MAX_SPEC_FIELDS},
                    "cast": {"type": "object", "propertyNames": {"pattern": NO_NUL}, "maxProperties": MAX_SPEC_FIELDS, "additionalProperties": {
                        "type": "string",
                        "enum": ["string", "integer", "decimal", "boolean", "timestamp"]}},
                    "defaults": {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": value,
                                 "maxProperties": MAX_SPEC_FIELDS}
                }
            },
            "run_at": {"type": ["string", "null"], "format": "date-time"},
            "replaces": {"type": ["string", "null"], "format": "uuid"}
        }
    });
    let json_value = serde_json::json!({"anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": value},
        object
    ]});
    [("EtlRequest", request), ("JsonValue", json_value)]
}

/// The `Location` of job `id`'s status monitor.
fn location(id: Uuid) -> String {
    format!("/v1/etl-jobs/{id}")
}

/// `202 Accepted` pointing at the status monitor, with the job's status as the body.
fn accepted(status: JobStatus) -> Response {
    let id = status.id;
    accepted_with(id, &status)
}

/// `202 Accepted` pointing at job `id`'s status monitor, with `body`.
fn accepted_with(id: Uuid, body: &impl Serialize) -> Response {
    let mut response = (StatusCode::ACCEPTED, Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&location(id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `200 OK` with the job's status, and `Retry-After` while it is not over.
fn monitor(status: JobStatus) -> Response {
    let active = status.is_active();
    let mut response = Json(&status).into_response();
    if active {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// What a submission without an `Idempotency-Key` header is told.
const IDEMPOTENCY_KEY_MISSING: &str = "The Idempotency-Key header is required: a key of 1 to 255 \
     characters, the same on every retry of this submission";

/// What a submission whose `Idempotency-Key` is not visible ASCII is told.
const IDEMPOTENCY_KEY_NOT_ASCII: &str = "Idempotency-Key must be visible ASCII characters";

/// What a listing with a query parameter it does not take is told (the parameter itself is not
/// named: a response never echoes what the client sent).
const LIST_PARAMS_ONLY: &str = "The listing takes only the query parameters status, limit and \
     cursor, each at most once";

/// Submits an ETL job.
#[utoipa::path(
    post,
    path = "/v1/etl-jobs",
    tag = "jobs",
    request_body(content = EtlRequest, content_type = "application/json"),
    params(("Idempotency-Key" = String, Header, min_length = 1, max_length = 255, description = "Client key that makes the submission idempotent (1 to 255 characters)")),
    responses(
        (status = 202, description = "Accepted: the body is the job's status; Location is its status monitor", body = JobStatus,
         headers(("Location" = String, description = "The status monitor"), ("Retry-After" = u32, description = "Seconds before polling the monitor"))),
        (status = 400, description = "Malformed JSON, or a missing or invalid Idempotency-Key (the problem's detail says which)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The job to replace does not exist", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job to replace has already ended", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Schema violation, or idempotency key reused", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn submit(
    State(state): State<AppState>,
    owner: Owner,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Problem::new(Code::UnsupportedMediaType));
    }
    let body = body.map_err(|rejection| {
        Problem::new(if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Code::RequestTooLarge
        } else {
            Code::RequestMalformed
        })
    })?;
    let invalid_key = |detail| Problem::new(Code::IdempotencyKeyInvalid).because(detail);
    let key = headers
        .get("idempotency-key")
        .ok_or_else(|| invalid_key(IDEMPOTENCY_KEY_MISSING))?
        .to_str()
        .map_err(|_| invalid_key(IDEMPOTENCY_KEY_NOT_ASCII))?;
    let request = request::parse_bytes(&body, state.config.limits).map_err(Error::from)?;
    let retain = state.config.retain_payloads.zip(state.payload_key.as_ref());
    let job = NewJob {
        idempotency_key: key,
        request: &request,
        max_attempts: MAX_ATTEMPTS_DEFAULT,
        retain: retain.map(|(ttl, key)| Retain { key, ttl }),
    };
    let mut conn = owner.checkout().await?;
    let notifier = owner.1.notifier.as_ref();
    let (secret, owner, skip_notify) = (&state.secret, &owner.0, notifier.is_some());
    let (enqueued, status) = conn
        .run(|c| async move {
            let tx = c.transaction().await?;
            if skip_notify {
                notifier::skip_trigger_notify(&tx).await?;
            }
            let enqueued = enqueue::enqueue(&tx, secret, owner, job).await?;
            let status = jobs::status(&tx, owner, enqueued.id).await?;
            tx.commit().await?;
            Ok::<_, Error>((enqueued, status))
        })
        .await?;
    // Like the trigger: only a new job that is due now wakes a replica.
    let due = !enqueued.replayed && request.run_at.is_none_or(|at| at <= chrono::Utc::now());
    if let Some(notifier) = notifier.filter(|_| due) {
        notifier.signal();
    }
    status
        .map(accepted)
        .ok_or_else(|| Problem::new(Code::NotFound))
}

/// The status monitor of one job.
#[utoipa::path(
    get,
    path = "/v1/etl-jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = "The job id")),
    responses(
        (status = 200, description = "The job's status (Retry-After while pending or running)", body = JobStatus),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job for this owner", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_job(
    owner: Owner,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, Problem> {
    let id = job_id(id)?;
    let mut conn = owner.checkout().await?;
    conn.run(|c| jobs::status(&*c, &owner.0, id))
        .await?
        .map(monitor)
        .ok_or_else(|| Problem::new(Code::NotFound))
}

/// One attempt of a job that did not end it, as the attempts resource shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AttemptView {
    /// The attempt's number (a released attempt's number is used again by the next one).
    attempt: i32,
    /// When it started, canonical UTC.
    started_at: String,
    /// When it ended, canonical UTC.
    ended_at: String,
    /// `retried` (a transient failure), `recovered` (its lease expired or its replica stopped)
    /// or `released` (its replica shut down; not charged).
    #[schema(value_type = String)]
    ending: &'static str,
    /// When the job was due again, canonical UTC.
    due_at: String,
    /// Why it failed (metadata only: never an error message); absent for a released attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    diagnosis: Option<Diagnosis>,
}

/// The attempt that ended a job `failed`, with its diagnosis.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FailedAttemptView {
    /// The attempt's number.
    attempt: i32,
    /// Why it failed (metadata only: never an error message).
    diagnosis: Diagnosis,
}

/// A job's attempts that ended, with their diagnoses.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AttemptList {
    /// The attempts that did not end the job, oldest first.
    attempts: Vec<AttemptView>,
    /// The attempt that ended it `failed`; absent while it runs, once it succeeded or was
    /// cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<FailedAttemptView>,
}

impl From<jobs::Attempts> for AttemptList {
    fn from(attempts: jobs::Attempts) -> AttemptList {
        AttemptList {
            attempts: attempts
                .past
                .into_iter()
                .map(|a| AttemptView {
                    attempt: a.attempt,
                    started_at: a.started_at,
                    ended_at: a.ended_at,
                    ending: a.ending.as_str(),
                    due_at: a.due_at,
                    diagnosis: a.diagnosis,
                })
                .collect(),
            failed: attempts.last.map(|l| FailedAttemptView {
                attempt: l.attempt,
                diagnosis: l.diagnosis,
            }),
        }
    }
}

/// The attempts of one job that ended, each with its diagnosis.
#[utoipa::path(
    get,
    path = "/v1/etl-jobs/{id}/attempts",
    tag = "jobs",
    params(("id" = String, Path, description = "The job id")),
    responses(
        (status = 200, description = "The job's ended attempts, oldest first, with their diagnoses", body = AttemptList),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job for this owner", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_attempts(
    owner: Owner,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, Problem> {
    let id = job_id(id)?;
    let mut conn = owner.checkout().await?;
    let owner = &owner.0;
    let (status, attempts) = conn
        .run(|c| async move {
            tokio::try_join!(jobs::status(&*c, owner, id), jobs::attempts(&*c, owner, id))
        })
        .await?;
    match status {
        Some(_) => Ok(Json(AttemptList::from(attempts)).into_response()),
        None => Err(Problem::new(Code::NotFound)),
    }
}

/// Query parameters of the listing (read as text, validated by `list` with precise codes); any
/// other parameter is refused, so a misspelt filter (`?state=`) is not silently ignored.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListParams {
    /// Only jobs in this status.
    #[param(value_type = Option<JobState>, inline)]
    status: Option<String>,
    /// Page size, 1 to 100 (default 20).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<Uuid>)]
    cursor: Option<String>,
}

/// A page of the owner's jobs.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct JobList {
    /// Jobs, newest first.
    jobs: Vec<JobStatus>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<Uuid>,
}

/// Default page size of the listing.
const PAGE_DEFAULT: i64 = 20;
/// Largest page size of the listing.
const PAGE_MAX: i64 = 100;

/// The owner's jobs, newest first, with keyset pagination.
#[utoipa::path(
    get,
    path = "/v1/etl-jobs",
    tag = "jobs",
    params(ListParams),
    responses(
        (status = 200, description = "A page of jobs", body = JobList),
        (status = 400, description = "A query parameter is not valid, not one the listing takes, or repeated", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn list(
    owner: Owner,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<JobList>, Problem> {
    let invalid = |name: &str| Problem::new(Code::QueryInvalid).at(format!("/{name}"));
    let Query(params) =
        params.map_err(|_| Problem::new(Code::QueryInvalid).because(LIST_PARAMS_ONLY))?;
    let status = params
        .status
        .as_deref()
        .map(|s| JobState::parse(s).ok_or_else(|| invalid("status")))
        .transpose()?;
    let limit = match params.limit.as_deref() {
        None => PAGE_DEFAULT,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=PAGE_MAX).contains(l))
            .ok_or_else(|| invalid("limit"))?,
    };
    let cursor = match params.cursor.as_deref() {
        None => None,
        Some(c) => Some(Uuid::parse_str(c).map_err(|_| invalid("cursor"))?),
    };
    let mut conn = owner.checkout().await?;
    let status = status.map(JobState::as_str);
    let window = jobs::Window::default().after(cursor);
    let page = conn
        .run(|c| jobs::page(&*c, &owner.0, window, status, limit))
        .await?;
    Ok(Json(JobList {
        jobs: page.jobs,
        next_cursor: page.next,
    }))
}

/// The answer to a cancel of a running job: its status, and whether it may still succeed.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct CancelAccepted {
    /// The job's status after the request.
    #[serde(flatten)]
    status: JobStatus,
    /// `false`: the request is on the job, which will end `cancelled` without committing its
    /// effects. `true`: the job's commit was applying its effects, so the request is recorded
    /// and takes effect only if that commit does not end the job (it would then end `cancelled`
    /// instead of running again); the job may still succeed, or fail, with that commit: poll the
    /// monitor (its `cancel_requested` turns `true` once the request is on the job).
    may_still_succeed: bool,
}

/// How many waits for a committing job's row ([`settle_deferred`]) one API process runs at once:
/// each holds a connection of the API's pool for up to `lock_timeout`, so a burst of such cancels
/// never takes more than two from the requests; beyond that the rescuer passes apply them.
const SETTLING_MAX: usize = 2;

/// The permits of [`settle_deferred`]'s waits.
static SETTLING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(SETTLING_MAX);

/// After a [`Cancel::Deferred`] answer: on a connection of its own, waits (at most the session's
/// `lock_timeout`) for the commit that holds job `id`'s row and applies the recorded request
/// (`jobs::await_deferred`) as soon as it lets go: on the row of a job that still runs (so the
/// commit's retry or release, if it comes later, finds it there), or ending `cancelled` a job
/// that the retry or release gave back to `pending` first. Beyond
/// [`SETTLING_MAX`] waits at once, or when a wait fails, the request stays recorded and the
/// replicas' rescuer passes apply it.
pub(super) fn settle_deferred(pool: &crate::db::Pool, id: Uuid) {
    let Ok(permit) = SETTLING.try_acquire() else {
        return;
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let settled = async {
            let conn = crate::db::checkout_owned(&pool).await?;
            jobs::await_deferred(&*conn, id).await
        };
        if let Err(e) = settled.await {
            tracing::info!(code = %e.code(), "a deferred cancel is left to the rescuer passes");
        }
    });
}

/// Cancels a job: a pending one at once, a running one by request; never waits for a commit.
#[utoipa::path(
    delete,
    path = "/v1/etl-jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = "The job id")),
    responses(
        (status = 200, description = "Cancelled", body = JobStatus),
        (status = 202, description = "Running: cancel requested; may_still_succeed says whether the job's commit, under way, may still end it succeeded; poll the monitor", body = CancelAccepted,
         headers(("Location" = String, description = "The status monitor"), ("Retry-After" = u32, description = "Seconds before polling"))),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job for this owner", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job has already ended (job_status says how)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn cancel_job(
    owner: Owner,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, Problem> {
    let id = job_id(id)?;
    let mut conn = owner.checkout().await?;
    let owner = &owner.0;
    let (outcome, status) = conn
        .run(|c| async move {
            let outcome = jobs::cancel(&*c, owner, id, Code::Cancelled).await?;
            let status = match outcome {
                Cancel::Cancelled | Cancel::Requested | Cancel::Deferred => {
                    jobs::status(&*c, owner, id).await?
                }
                Cancel::AlreadyEnded(_) | Cancel::NotFound => None,
            };
            Ok::<_, Error>((outcome, status))
        })
        .await?;
    let status = || status.ok_or_else(|| Problem::new(Code::NotFound));
    let requested = |status, may_still_succeed| {
        let body = CancelAccepted {
            status,
            may_still_succeed,
        };
        accepted_with(id, &body)
    };
    match outcome {
        Cancel::Cancelled => Ok(monitor(status()?)),
        Cancel::Requested => Ok(requested(status()?, false)),
        Cancel::Deferred => {
            settle_deferred(conn.pool(), id);
            Ok(requested(status()?, true))
        }
        Cancel::AlreadyEnded(s) => Err(Problem::conflict(s)),
        Cancel::NotFound => Err(Problem::new(Code::NotFound)),
    }
}
