//! The owner's schedules of ETL loads: list (`GET /v1/schedules`), one (`GET
//! /v1/schedules/{name}`), create or replace (`PUT`), delete (`DELETE`), pause and resume
//! (`POST …/pause`, `…/resume`) and the latest fires (`GET …/fires`).
//!
//! Invariants this module keeps:
//! - Every route authenticates a bearer API key and acts only on the key owner's schedules; one
//!   of another owner answers exactly like one that does not exist (`404 not_found`).
//! - A schedule made here makes ETL loads: its `request` is validated as a submitted job's is
//!   (the same limits, the same codes, pointers under `/request`), and stored normalized; a
//!   request that names its own `run_at` or `replaces` is refused (a schedule decides when).
//! - A refusal writes nothing; no request value is ever echoed.

use super::jobs::Owner;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::config::ConfigError;
use crate::digest::Secret;
use crate::error::Error;
use crate::intake::{IntakeLimits, Rejection};
use crate::jobs::Jobs;
use crate::kinds::etl::load::EtlJob;
use crate::kinds::etl::request;
use crate::names::is_kind_name;
use crate::schedule::{Fire, Missed, Overlap, ScheduleInfo, ScheduleOptions, Schedules};
use crate::time::canonical_utc;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tokio_postgres::GenericClient;
use utoipa::ToSchema;
use uuid::Uuid;

/// How many fires `GET …/fires` shows, newest first.
pub(super) const FIRES_SHOWN: i64 = 50;

/// A schedule, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct ScheduleView {
    /// Its name, unique per owner.
    name: String,
    /// Its cron expression (5 or 6 fields, or an alias such as `@hourly`).
    cron: String,
    /// The IANA time zone it is read in.
    time_zone: String,
    /// The kind of the jobs it makes (`etl.load`, or a library kind).
    kind: String,
    /// The queue they wait in.
    queue: String,
    /// Their priority.
    priority: i16,
    /// Their attempt bound.
    max_attempts: i32,
    /// `coalesce`, `catch_up` or `skip`.
    missed: String,
    /// The catch-up bound (0 unless `missed` is `catch_up`).
    catch_up_limit: u16,
    /// `allow` or `skip`.
    overlap: String,
    /// Whether it is paused.
    paused: bool,
    /// Whether it was declared in an application's code.
    declared: bool,
    /// Its next fire (UTC).
    next_fire_at: String,
    /// Its last fire evaluated, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_fire_at: Option<String>,
    /// The job its last fire made, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_job_id: Option<Uuid>,
}

impl From<ScheduleInfo> for ScheduleView {
    fn from(s: ScheduleInfo) -> ScheduleView {
        let (missed, catch_up_limit) = match s.missed {
            Missed::Coalesce => ("coalesce", 0),
            Missed::CatchUp(n) => ("catch_up", n),
            Missed::Skip => ("skip", 0),
        };
        ScheduleView {
            name: s.name,
            cron: s.cron,
            time_zone: s.time_zone,
            kind: s.kind,
            queue: s.queue,
            priority: s.priority,
            max_attempts: s.max_attempts,
            missed: missed.to_owned(),
            catch_up_limit,
            overlap: match s.overlap {
                Overlap::Allow => "allow",
                Overlap::Skip => "skip",
            }
            .to_owned(),
            paused: s.paused,
            declared: s.declared,
            next_fire_at: canonical_utc(s.next_fire_at),
            last_fire_at: s.last_fire_at.map(canonical_utc),
            last_job_id: s.last_job_id,
        }
    }
}

/// The owner's schedules.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ScheduleList {
    /// By name.
    schedules: Vec<ScheduleView>,
}

/// A fire, as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FireView {
    /// The fire instant (UTC).
    fire_at: String,
    /// When a replica evaluated it (UTC, the database's clock); minus `fire_at`, its lateness.
    fired_at: String,
    /// The job it made, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    job_id: Option<Uuid>,
    /// `enqueued`, `missed` or `overlapped`.
    outcome: String,
}

/// A schedule's latest fires.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FireList {
    /// Newest first, at most [`FIRES_SHOWN`].
    fires: Vec<FireView>,
}

/// The body of `PUT /v1/schedules/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleBody {
    /// The cron expression.
    cron: String,
    /// The IANA time zone (default `UTC`).
    time_zone: Option<String>,
    /// The ETL request each fire enqueues (no `run_at`, no `replaces`).
    #[schema(value_type = Object)]
    request: serde_json::Value,
    /// `coalesce` (default), `catch_up` or `skip`.
    missed: Option<String>,
    /// The catch-up bound, 1 to 1,000 (with `missed: catch_up`; default 100).
    catch_up_limit: Option<u16>,
    /// `allow` (default) or `skip`.
    overlap: Option<String>,
    /// The jobs' attempt bound (default 5).
    max_attempts: Option<i32>,
}

/// A `schedule_invalid` refusal at `pointer`.
fn invalid(pointer: &str) -> Error {
    Error::from(Rejection::new(Code::ScheduleInvalid, pointer))
}

/// A schedule of ETL loads as a [`ScheduleBody`] defines it, validated.
struct Definition {
    /// Its cron expression.
    cron: String,
    /// Its IANA time zone, if not UTC.
    time_zone: Option<String>,
    /// The load each fire enqueues.
    job: EtlJob,
    /// Its missed-fire policy.
    missed: Missed,
    /// Its overlap policy.
    overlap: Overlap,
    /// Its jobs' attempt bound, if not the kind's.
    max_attempts: Option<i32>,
}

impl Definition {
    /// The definition in `body` (a [`ScheduleBody`]), its request checked under `limits`.
    ///
    /// # Errors
    /// [`Error::Rejected`] with `schedule_invalid` and a pointer to the field, or the request's
    /// own code with a pointer under `/request`.
    fn of(body: serde_json::Value, limits: IntakeLimits) -> Result<Definition, Error> {
        let body: ScheduleBody = serde_json::from_value(body).map_err(|_| invalid(""))?;
        let etl = request::parse(&body.request, limits).map_err(|r| Rejection {
            pointer: format!("/request{}", r.pointer),
            ..r
        })?;
        if etl.run_at.is_some() || etl.replaces.is_some() {
            return Err(invalid("/request"));
        }
        let missed = match (body.missed.as_deref(), body.catch_up_limit) {
            (None | Some("coalesce"), None) => Missed::Coalesce,
            (Some("catch_up"), limit) => Missed::CatchUp(limit.unwrap_or(100)),
            (Some("skip"), None) => Missed::Skip,
            _ => return Err(invalid("/missed")),
        };
        let overlap = match body.overlap.as_deref() {
            None | Some("allow") => Overlap::Allow,
            Some("skip") => Overlap::Skip,
            Some(_) => return Err(invalid("/overlap")),
        };
        Ok(Definition {
            cron: body.cron,
            time_zone: body.time_zone,
            job: EtlJob(etl.to_value()),
            missed,
            overlap,
            max_attempts: body.max_attempts,
        })
    }

    /// Stores it as `schedules`' schedule `name` on `client`, declared in configuration
    /// (`declared`) or put at run time.
    ///
    /// # Errors
    /// As [`Schedules::put`].
    async fn put(
        &self,
        client: &impl GenericClient,
        schedules: &Schedules,
        name: &str,
        declared: bool,
    ) -> Result<ScheduleInfo, Error> {
        let options = ScheduleOptions {
            time_zone: self.time_zone.as_deref(),
            max_attempts: self.max_attempts,
            missed: self.missed,
            overlap: self.overlap,
            ..ScheduleOptions::default()
        };
        if declared {
            schedules
                .declare(client, name, &self.cron, &self.job, options)
                .await
        } else {
            schedules
                .put(client, name, &self.cron, &self.job, options)
                .await
        }
    }
}

/// Creates or replaces `schedules`' schedule `name` of ETL loads from `body`, the JSON of a
/// `PUT /v1/schedules/{name}` body whose request is checked under `limits`, on `client`;
/// returns it as stored (the route, and `durable-etl schedules put` with the default limits).
///
/// # Errors
/// As the route: [`Error::Rejected`] with `schedule_invalid` and a pointer, or the request's own
/// code under `/request`, writing nothing; database errors.
pub async fn put_body(
    client: &impl GenericClient,
    schedules: &Schedules,
    name: &str,
    body: serde_json::Value,
    limits: IntakeLimits,
) -> Result<ScheduleInfo, Error> {
    let definition = Definition::of(body, limits)?;
    definition.put(client, schedules, name, false).await
}

/// `e`, a refusal of the schedules file's entry `at`, as the configuration error that names it
/// (other errors as they are).
fn refused(at: &str, e: Error) -> Error {
    match e {
        Error::Rejected(r) => {
            ConfigError::SchedulesFile(format!("{at}: {} at `{}`", r.code, r.pointer)).into()
        }
        other => other,
    }
}

/// Declares the schedules of ETL loads a configuration file lists (`durable-etl work
/// --schedules`), for their owners, in one transaction on `client`, with owner digests under
/// `secret`; returns how many. `text` is a JSON array of objects, each the body of
/// `PUT /v1/schedules/{name}` with two more members: `owner` (the principal, as an API key's)
/// and `name`. Declaring never
/// deletes a schedule the file does not name, and keeps the next fire of one whose expression
/// and zone are unchanged.
///
/// # Errors
/// [`ConfigError::SchedulesFile`] naming the entry (by position, and by name if it is one) and
/// what is wrong with it, never a value; nothing is written then. Database errors.
pub async fn declare_file(
    client: &mut tokio_postgres::Client,
    secret: &Secret,
    text: &str,
) -> Result<usize, Error> {
    let file = |what: String| Error::from(ConfigError::SchedulesFile(what));
    let entries: Vec<serde_json::Value> = serde_json::from_str(text)
        .map_err(|_| file("it is not a JSON array of schedules".to_owned()))?;
    let mut parsed = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let serde_json::Value::Object(mut body) = entry else {
            return Err(file(format!("entry {i} is not an object")));
        };
        let mut take = |member: &str| match body.remove(member) {
            Some(serde_json::Value::String(text)) => Ok(text),
            _ => Err(file(format!("entry {i} has no `{member}` string"))),
        };
        let (owner, name) = (take("owner")?, take("name")?);
        let at = match is_kind_name(&name) {
            true => format!("entry {i} (`{name}`)"),
            false => format!("entry {i}"),
        };
        let definition =
            Definition::of(body.into(), IntakeLimits::default()).map_err(|e| refused(&at, e))?;
        parsed.push((owner, name, definition, at));
    }
    let tx = client.transaction().await?;
    for (owner, name, definition, at) in &parsed {
        let schedules = Jobs::new(secret.clone(), owner).schedules();
        definition
            .put(&tx, &schedules, name, true)
            .await
            .map_err(|e| refused(at, e))?;
    }
    tx.commit().await?;
    Ok(parsed.len())
}

/// The owner's schedules.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules",
    responses(
        (status = 200, description = "The owner's schedules, by name", body = ScheduleList),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn list(owner: Owner) -> Result<Json<ScheduleList>, Problem> {
    let (schedules, mut conn) = (Schedules::of(owner.0), owner.checkout().await?);
    let schedules = conn.run(|c| schedules.list(&*c)).await?;
    Ok(Json(ScheduleList {
        schedules: schedules.into_iter().map(ScheduleView::from).collect(),
    }))
}

/// One of the owner's schedules.
#[utoipa::path(get, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 200, description = "The schedule", body = ScheduleView),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such schedule for this owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_schedule(
    owner: Owner,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, Problem> {
    let (schedules, mut conn) = (Schedules::of(owner.0), owner.checkout().await?);
    conn.run(|c| schedules.get(&*c, &name))
        .await?
        .map(|s| Json(s.into()))
        .ok_or_else(|| Problem::new(Code::NotFound))
}

/// Creates or replaces one of the owner's schedules of ETL loads.
#[utoipa::path(put, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name (as a kind's: lower case, digits, `_` and `.`)")),
    request_body(content = ScheduleBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The schedule as stored", body = ScheduleView),
        (status = 400, description = "Body is not valid JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The schedule or its request is not valid", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn put_schedule(
    State(state): State<AppState>,
    owner: Owner,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ScheduleView>, Problem> {
    let body = body.map_err(|rejection| {
        Problem::new(if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Code::RequestTooLarge
        } else {
            Code::RequestMalformed
        })
    })?;
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| Problem::new(Code::RequestMalformed))?;
    let (schedules, mut conn) = (Schedules::of(owner.0), owner.checkout().await?);
    let limits = state.config.limits;
    let stored = conn
        .run(|c| put_body(&*c, &schedules, &name, value, limits))
        .await?;
    Ok(Json(stored.into()))
}

/// Deletes one of the owner's schedules (the jobs it made stay).
#[utoipa::path(delete, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such schedule for this owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn delete_schedule(
    owner: Owner,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    let (schedules, mut conn) = (Schedules::of(owner.0), owner.checkout().await?);
    if conn.run(|c| schedules.delete(&*c, &name)).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(Problem::new(Code::NotFound))
    }
}

/// Pauses one of the owner's schedules.
#[utoipa::path(post, path = "/v1/schedules/{name}/pause", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 200, description = "The schedule, paused", body = ScheduleView),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such schedule for this owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn pause(owner: Owner, name: Path<String>) -> Result<Json<ScheduleView>, Problem> {
    switch(owner, name, true).await
}

/// Resumes one of the owner's schedules: its next fire is the first after now.
#[utoipa::path(post, path = "/v1/schedules/{name}/resume", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 200, description = "The schedule, resumed", body = ScheduleView),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such schedule for this owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn resume(
    owner: Owner,
    name: Path<String>,
) -> Result<Json<ScheduleView>, Problem> {
    switch(owner, name, false).await
}

/// Pauses (`paused`) or resumes schedule `name`; answers it as it then stands.
async fn switch(
    owner: Owner,
    Path(name): Path<String>,
    paused: bool,
) -> Result<Json<ScheduleView>, Problem> {
    let schedules = Schedules::of(owner.0);
    let mut conn = owner.checkout().await?;
    let found = conn
        .run(|c| async {
            let found = if paused {
                schedules.pause(&*c, &name).await?
            } else {
                schedules.resume(&*c, &name).await?
            };
            match found {
                true => schedules.get(&*c, &name).await,
                false => Ok(None),
            }
        })
        .await?;
    found
        .map(|s| Json(s.into()))
        .ok_or_else(|| Problem::new(Code::NotFound))
}

/// The latest fires of one of the owner's schedules, newest first.
#[utoipa::path(get, path = "/v1/schedules/{name}/fires", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 200, description = "Its latest fires", body = FireList),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such schedule for this owner", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn fires(
    owner: Owner,
    Path(name): Path<String>,
) -> Result<Json<FireList>, Problem> {
    let schedules = Schedules::of(owner.0);
    let mut conn = owner.checkout().await?;
    let fires: Option<Vec<Fire>> = conn
        .run(|c| async {
            match schedules.get(&*c, &name).await? {
                Some(_) => schedules.fires(&*c, &name, FIRES_SHOWN).await.map(Some),
                None => Ok::<_, Error>(None),
            }
        })
        .await?;
    let fires = fires.ok_or_else(|| Problem::new(Code::NotFound))?;
    Ok(Json(FireList {
        fires: fires
            .into_iter()
            .map(|f| FireView {
                fire_at: canonical_utc(f.fire_at),
                fired_at: canonical_utc(f.fired_at),
                job_id: f.job_id,
                outcome: f.outcome,
            })
            .collect(),
    }))
}
