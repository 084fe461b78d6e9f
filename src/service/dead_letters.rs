//! The dead-letter resources: the open letters (`GET /v1/dead-letters`), their counts per queue
//! and code (`GET /v1/dead-letters/counts`), one letter (`GET /v1/dead-letters/{id}`), its
//! discard (`DELETE`) and replay (`POST …/{id}/replay`), and the bulk replay and discard of every
//! letter matching a filter (`POST /v1/dead-letters/replay`, `POST /v1/dead-letters/discard`).
//!
//! Invariants this module keeps:
//! - Every route authenticates a bearer API key first. An owner's key sees and acts on its own
//!   owner's letters only (another owner's answers as one that does not exist, `404
//!   not_found`); an operator's key sees and acts on every owner's, and may filter by owner.
//! - A replay records who asked as the key's id, never the owner.
//! - Every action an operator's key takes (a replay that makes a job, a discard that discards, a
//!   bulk replay or discard) writes one audit entry from source `api` ([`audit`]): in the
//!   action's transaction, but for a bulk replay's, which commits in chunks and is logged after
//!   its last. An owner's key acting on its own letters writes none, nor does a refusal.
//! - A replay's body, when sent, is validated as a submission's is, then accepted only when it
//!   is the failed job's request (its keyed fingerprint); nothing of it is echoed or stored but
//!   as the new job's payload.
//! - Answers carry metadata only: ids, queue, kind, stable code, attempts, times, counts.

use super::audit::{self, Action, Source};
use super::caller::Caller;
use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::dead_letters::{
    BulkReplay, DeadLetters, Letter, LetterCount, LetterCursor, LetterFilter, Replayed,
};
use crate::digest::DigestKind;
use crate::error::Error;
use crate::kinds::etl::request;
use crate::names::is_kind_name;
use crate::queue::is_queue_name;
use crate::service::api_keys::{KeyHolder, Role};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// A page's size unless the listing asks for another.
const PAGE_DEFAULT: i64 = 50;

/// The largest page the API serves.
const PAGE_LIMIT: i64 = 200;

/// The letters `holder` sees: its owner's, or every owner's for an operator (narrowed to
/// `owner`, a principal, when an operator names one), with the deployment's payload key.
fn letters_of(
    holder: &KeyHolder,
    state: &AppState,
    owner: Option<&str>,
) -> Result<DeadLetters, Problem> {
    let letters = match (holder.role, owner) {
        (Role::Operator, None) => DeadLetters::all_owners(state.secret.clone()),
        (Role::Operator, Some(owner)) => DeadLetters::all_owners(state.secret.clone())
            .narrowed_to(state.secret.digest(DigestKind::Principal, owner.as_bytes())),
        (_, Some(_)) => return Err(invalid("owner")),
        (_, None) => DeadLetters::of(state.secret.clone(), holder.owner_key),
    };
    Ok(match &state.payload_key {
        Some(key) => letters.with_key(key.clone()),
        None => letters,
    })
}

/// A refused query parameter or filter member `name`.
fn invalid(name: &str) -> Problem {
    Problem::new(Code::QueryInvalid).at(format!("/{name}"))
}

/// A dead letter, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct LetterView {
    /// The failed job's id (the letter's own).
    job_id: Uuid,
    /// The queue it waited in.
    queue: String,
    /// Its kind.
    kind: String,
    /// Its stable failure code.
    code: String,
    /// The attempts it was charged.
    attempts: i32,
    /// When it failed (RFC 3339).
    failed_at: DateTime<Utc>,
    /// The job its replay made, once replayed.
    replayed_job_id: Option<Uuid>,
    /// When it was replayed.
    replayed_at: Option<DateTime<Utc>>,
    /// Whether its payload is retained (sealed), so it replays without the body.
    retained: bool,
}

impl From<Letter> for LetterView {
    fn from(l: Letter) -> LetterView {
        LetterView {
            job_id: l.job_id,
            queue: l.queue,
            kind: l.kind,
            code: l.code,
            attempts: l.attempts,
            failed_at: l.failed_at,
            replayed_job_id: l.replayed_job_id,
            replayed_at: l.replayed_at,
            retained: l.retained,
        }
    }
}

/// A page of open letters, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct LetterList {
    /// The letters.
    letters: Vec<LetterView>,
    /// The `cursor` of the next page, when older letters follow.
    next_cursor: Option<String>,
}

/// Open letters of one queue with one code.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct CountView {
    /// The queue.
    queue: String,
    /// The failure code.
    code: String,
    /// How many open letters.
    count: i64,
}

impl From<LetterCount> for CountView {
    fn from(c: LetterCount) -> CountView {
        CountView {
            queue: c.queue,
            code: c.code,
            count: c.count,
        }
    }
}

/// The open letters counted per queue and code.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct CountList {
    /// Per queue and code, the largest first (at most 200 pairs).
    counts: Vec<CountView>,
    /// All of them.
    total: i64,
}

/// What a replay of one letter made.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct ReplayView {
    /// The replayed letter.
    letter: Uuid,
    /// The job its replay made (its owner's: its status is `GET /v1/etl-jobs/{job_id}`).
    job_id: Uuid,
    /// Whether this request made it (`false`: an earlier replay had).
    made: bool,
}

/// What a bulk replay did.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct BulkReplayView {
    /// Letters replayed by this request (one new job each).
    made: u64,
    /// Matching letters left open: no payload retained (replay each with its body).
    not_retained: u64,
    /// Matching letters left open: their payload was sealed under a key no longer held.
    unreadable: u64,
}

impl From<BulkReplay> for BulkReplayView {
    fn from(b: BulkReplay) -> BulkReplayView {
        BulkReplayView {
            made: b.made,
            not_retained: b.not_retained,
            unreadable: b.unreadable,
        }
    }
}

/// What a bulk discard did.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct DiscardView {
    /// Letters discarded.
    discarded: u64,
}

/// The filter of a listing, a count or a bulk action (text, validated by [`Filter::parse`]).
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct Filter {
    /// Only letters of this queue.
    queue: Option<String>,
    /// Only letters of this kind.
    kind: Option<String>,
    /// Only letters with this failure code.
    code: Option<String>,
    /// Only letters that failed at or after this instant (RFC 3339).
    since: Option<String>,
    /// Only letters that failed before this instant (RFC 3339).
    until: Option<String>,
    /// Only letters of this owner (a principal; operators' keys only).
    owner: Option<String>,
    /// Page size, 1 to 200 (default 50); listings only.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 200)]
    #[schema(value_type = Option<i64>)]
    limit: Option<String>,
    /// The `next_cursor` of the previous page; listings only.
    cursor: Option<String>,
}

impl Filter {
    /// The filter's letters, validated: a queue or kind that is not a name, a code that is not
    /// an identifier or an instant that is not RFC 3339 is `query_invalid` at its member.
    fn parse(&self) -> Result<LetterFilter<'_>, Problem> {
        let instant = |value: &Option<String>, name: &str| {
            value
                .as_deref()
                .map(|v| {
                    DateTime::parse_from_rfc3339(v)
                        .map(|t| t.with_timezone(&Utc))
                        .map_err(|_| invalid(name))
                })
                .transpose()
        };
        Ok(LetterFilter {
            queue: checked(&self.queue, "queue", is_queue_name)?,
            kind: checked(&self.kind, "kind", is_kind_name)?,
            code: checked(&self.code, "code", |c| crate::names::is_identifier(c, &[]))?,
            since: instant(&self.since, "since")?,
            until: instant(&self.until, "until")?,
        })
    }

    /// The page size asked for.
    fn limit(&self) -> Result<i64, Problem> {
        match self.limit.as_deref() {
            None => Ok(PAGE_DEFAULT),
            Some(l) => l
                .parse::<i64>()
                .ok()
                .filter(|l| (1..=PAGE_LIMIT).contains(l))
                .ok_or_else(|| invalid("limit")),
        }
    }

    /// The cursor asked for.
    fn cursor(&self) -> Result<Option<LetterCursor>, Problem> {
        self.cursor
            .as_deref()
            .map(|c| LetterCursor::parse(c).ok_or_else(|| invalid("cursor")))
            .transpose()
    }
}

/// `value`, unless `ok` refuses it: then `query_invalid` at `name`.
fn checked<'a>(
    value: &'a Option<String>,
    name: &str,
    ok: fn(&str) -> bool,
) -> Result<Option<&'a str>, Problem> {
    match value.as_deref() {
        Some(v) if !ok(v) => Err(invalid(name)),
        v => Ok(v),
    }
}

/// The filter of a listing's query, or `query_invalid`.
fn query(params: Result<Query<Filter>, QueryRejection>) -> Result<Filter, Problem> {
    params
        .map(|Query(f)| f)
        .map_err(|_| Problem::new(Code::QueryInvalid).because(FILTER_ONLY))
}

/// What a request with a filter member it does not take is told.
const FILTER_ONLY: &str = "The filter takes only queue, kind, code, since, until and owner \
     (operators), and listings limit and cursor, each at most once";

/// What a bulk action without a body is told.
const FILTER_REQUIRED: &str = "A bulk action takes its filter as a JSON body; {} takes every \
     open letter the key sees";

/// The letter id of a path, or `404 not_found`.
fn letter_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Problem> {
    let Path(id) = path.map_err(|_| Problem::new(Code::NotFound))?;
    Uuid::parse_str(&id).map_err(|_| Problem::new(Code::NotFound))
}

/// The open dead letters, newest first.
#[utoipa::path(get, path = "/v1/dead-letters", tag = "dead-letters",
    params(Filter),
    responses(
        (status = 200, description = "A page of open letters, newest first", body = LetterList),
        (status = 400, description = "A query parameter is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Caller {
        holder, mut conn, ..
    }: Caller,
    params: Result<Query<Filter>, QueryRejection>,
) -> Result<Json<LetterList>, Problem> {
    let params = query(params)?;
    let (filter, limit, cursor) = (params.parse()?, params.limit()?, params.cursor()?);
    let letters = letters_of(&holder, &state, params.owner.as_deref())?;
    let page = conn
        .run(|c| letters.list(&*c, &filter, cursor, limit))
        .await?;
    Ok(Json(LetterList {
        letters: page.letters.into_iter().map(LetterView::from).collect(),
        next_cursor: page.next.map(|c| c.token()),
    }))
}

/// The open dead letters counted per queue and code.
#[utoipa::path(get, path = "/v1/dead-letters/counts", tag = "dead-letters",
    params(Filter),
    responses(
        (status = 200, description = "Open letters per queue and code", body = CountList),
        (status = 400, description = "A query parameter is not valid, or is a listing's (limit, cursor)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn counts(
    State(state): State<AppState>,
    Caller {
        holder, mut conn, ..
    }: Caller,
    params: Result<Query<Filter>, QueryRejection>,
) -> Result<Json<CountList>, Problem> {
    let params = query(params)?;
    if params.limit.is_some() || params.cursor.is_some() {
        return Err(Problem::new(Code::QueryInvalid).because(FILTER_ONLY));
    }
    let filter = params.parse()?;
    let letters = letters_of(&holder, &state, params.owner.as_deref())?;
    let counts = conn.run(|c| letters.counts(&*c, &filter)).await?;
    Ok(Json(CountList {
        total: counts.iter().map(|c| c.count).sum(),
        counts: counts.into_iter().map(CountView::from).collect(),
    }))
}

/// One dead letter, open or replayed.
#[utoipa::path(get, path = "/v1/dead-letters/{id}", tag = "dead-letters",
    params(("id" = Uuid, Path, description = "The failed job's id")),
    responses(
        (status = 200, description = "The letter", body = LetterView),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such letter for this key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn get_letter(
    State(state): State<AppState>,
    Caller {
        holder, mut conn, ..
    }: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<LetterView>, Problem> {
    let id = letter_id(id)?;
    let letters = letters_of(&holder, &state, None)?;
    conn.run(|c| letters.get(&*c, id))
        .await?
        .map(|l| Json(l.into()))
        .ok_or_else(|| Problem::new(Code::NotFound))
}

/// Discards one open dead letter (its retained payload with it; the job's outcome stays).
#[utoipa::path(delete, path = "/v1/dead-letters/{id}", tag = "dead-letters",
    params(("id" = Uuid, Path, description = "The failed job's id")),
    responses(
        (status = 204, description = "Discarded"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such open letter for this key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn discard_letter(
    State(state): State<AppState>,
    Caller {
        holder, mut conn, ..
    }: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, Problem> {
    let id = letter_id(id)?;
    let letters = letters_of(&holder, &state, None)?;
    let discarded = discard_audited(&mut conn, &letters, id, &holder, Source::Api).await?;
    if discarded {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem::new(Code::NotFound))
    }
}

/// Replays one dead letter once: with a body, the failed job's request sent again (accepted
/// only when it is that request); without one, from its retained payload. Answers `202
/// Accepted` with the new job's status monitor in `Location`, whichever replay made it.
#[utoipa::path(post, path = "/v1/dead-letters/{id}/replay", tag = "dead-letters",
    params(("id" = Uuid, Path, description = "The failed job's id")),
    request_body(content = Option<crate::kinds::etl::request::EtlRequest>, content_type = "application/json",
        description = "The failed job's request, sent again; leave the body empty to replay its retained payload"),
    responses(
        (status = 202, description = "Replayed: the new job's monitor is in Location", body = ReplayView),
        (status = 400, description = "Body is not valid JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such letter for this key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No body, and no payload retained or readable (payload_not_retained, payload_unreadable)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body is not the failed job's request (replay_body_mismatch), or not a valid request", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn replay_letter(
    State(state): State<AppState>,
    Caller {
        holder, mut conn, ..
    }: Caller,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let id = letter_id(id)?;
    let body = body.map_err(body_refused)?;
    let payload = if body.is_empty() {
        None
    } else {
        let request = request::parse_bytes(&body, state.config.limits).map_err(Error::from)?;
        Some(request.to_value())
    };
    let letters = letters_of(&holder, &state, None)?;
    let payload = payload.as_ref();
    let done = replay_audited(&mut conn, &letters, id, &holder, Source::Api, payload).await?;
    let mut response = (
        StatusCode::ACCEPTED,
        Json(ReplayView {
            letter: id,
            job_id: done.job_id,
            made: done.made,
        }),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/etl-jobs/{}", done.job_id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// The problem of a body that could not be read: `request_too_large` over the body limit, else
/// `request_malformed`.
fn body_refused(rejection: BytesRejection) -> Problem {
    Problem::new(if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Code::RequestTooLarge
    } else {
        Code::RequestMalformed
    })
}

/// The filter of a bulk action's JSON body (`{}`: every open letter the key sees). A bulk
/// action always names its filter: a missing or empty body is `request_malformed`, never "all".
fn body_filter(body: Result<Bytes, BytesRejection>) -> Result<Filter, Problem> {
    let body = body.map_err(body_refused)?;
    if body.is_empty() {
        return Err(Problem::new(Code::RequestMalformed).because(FILTER_REQUIRED));
    }
    let filter: Filter = serde_json::from_slice(&body)
        .map_err(|_| Problem::new(Code::RequestInvalid).because(FILTER_ONLY))?;
    if filter.limit.is_some() || filter.cursor.is_some() {
        return Err(Problem::new(Code::RequestInvalid).because(FILTER_ONLY));
    }
    Ok(filter)
}

/// Replays every open letter matching the filter whose payload is retained, each once; says
/// how many it made and how many it left, and why.
#[utoipa::path(post, path = "/v1/dead-letters/replay", tag = "dead-letters",
    request_body(content = Filter, content_type = "application/json",
        description = "Which letters: queue, kind, code, since, until, owner (operators); `{}`: all"),
    responses(
        (status = 200, description = "What the replay did", body = BulkReplayView),
        (status = 400, description = "A filter member is not valid, or the body is missing or not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body is not a filter (request_invalid)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn replay_matching(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    bulk(&state, caller, body, Bulk::Replay).await
}

/// Discards every open letter matching the filter.
#[utoipa::path(post, path = "/v1/dead-letters/discard", tag = "dead-letters",
    request_body(content = Filter, content_type = "application/json",
        description = "Which letters: queue, kind, code, since, until, owner (operators); `{}`: all"),
    responses(
        (status = 200, description = "How many were discarded", body = DiscardView),
        (status = 400, description = "A filter member is not valid, or the body is missing or not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body is not a filter (request_invalid)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Database unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub(super) async fn discard_matching(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    bulk(&state, caller, body, Bulk::Discard).await
}

/// A bulk action over the open letters matching a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bulk {
    /// Replays those whose payload is retained.
    Replay,
    /// Discards them.
    Discard,
}

/// What a bulk action did.
pub(super) enum BulkDone {
    /// The replay's counts.
    Replayed(BulkReplay),
    /// How many letters were discarded.
    Discarded(u64),
}

/// Who asked for a replay, as the letter records it: the key's id, with where it asked from
/// (`key:` for the API, `console:` for the console), never its owner.
pub(super) fn asked_by(by: &KeyHolder, source: Source) -> String {
    match source {
        Source::Api => format!("key:{}", by.id),
        Source::Console => format!("console:{}", by.id),
    }
}

/// Discards the open letter `id` of `letters` on `conn`, as the key of `by` from `source`,
/// with its audit entry ([`audit::record`]) in the same transaction when it was discarded.
/// Returns whether it was.
///
/// # Errors
/// Database errors.
pub(super) async fn discard_audited(
    conn: &mut Conn,
    letters: &DeadLetters,
    id: Uuid,
    by: &KeyHolder,
    source: Source,
) -> Result<bool, Error> {
    conn.run(|c| async move {
        let tx = c.transaction().await?;
        let discarded = letters.discard(&tx, id).await?;
        if discarded {
            let target = id.to_string();
            audit::record(&tx, by, source, Action::LetterDiscard, &target, 1).await?;
        }
        tx.commit().await?;
        Ok::<_, Error>(discarded)
    })
    .await
}

/// Replays the letter `id` of `letters` on `conn` (from `body`, or its retained payload), as
/// the key of `by` from `source`, with its audit entry ([`audit::record`]) in the same
/// transaction when this replay made the job (the replay runs in a savepoint).
///
/// # Errors
/// As [`DeadLetters::replay`]: `not_found`, `payload_not_retained`, `payload_unreadable`,
/// `replay_body_mismatch`; database errors. Nothing is written then.
pub(super) async fn replay_audited(
    conn: &mut Conn,
    letters: &DeadLetters,
    id: Uuid,
    by: &KeyHolder,
    source: Source,
    body: Option<&serde_json::Value>,
) -> Result<Replayed, Error> {
    let asked = asked_by(by, source);
    let asked = asked.as_str();
    conn.run(|c| async move {
        let mut tx = c.transaction().await?;
        let done = letters.replay(&mut tx, id, asked, body).await?;
        if done.made {
            let target = id.to_string();
            audit::record(&tx, by, source, Action::LetterReplay, &target, 1).await?;
        }
        tx.commit().await?;
        Ok::<_, Error>(done)
    })
    .await
}

/// Takes bulk action `what` on the open `letters` matching `filter` on `conn`, as the key of
/// `by` from `source`, and hands its audit entry (`target`, the filter in words) to
/// [`audit::record`]: a discard's in its transaction, a replay's (which commits chunk by chunk)
/// after its last chunk.
///
/// # Errors
/// As the action: database errors.
pub(super) async fn act_in_bulk(
    conn: &mut Conn,
    letters: &DeadLetters,
    filter: &LetterFilter<'_>,
    by: &KeyHolder,
    source: Source,
    target: &str,
    what: Bulk,
) -> Result<BulkDone, Error> {
    Ok(match what {
        Bulk::Replay => {
            let asked = asked_by(by, source);
            let done = conn
                .run(|c| letters.replay_matching(c, filter, &asked))
                .await?;
            let (action, made) = (Action::LettersReplay, done.made);
            conn.run(|c| audit::record(&*c, by, source, action, target, made))
                .await?;
            BulkDone::Replayed(done)
        }
        Bulk::Discard => {
            let discarded = conn
                .run(|c| async move {
                    let tx = c.transaction().await?;
                    let n = letters.discard_matching(&tx, filter).await?;
                    audit::record(&tx, by, source, Action::LettersDiscard, target, n).await?;
                    tx.commit().await?;
                    Ok::<_, Error>(n)
                })
                .await?;
            BulkDone::Discarded(discarded)
        }
    })
}

/// Takes bulk action `what` on the letters of `caller` that match the filter of `body`, with
/// its audit entry from the API, and answers what it did.
async fn bulk(
    state: &AppState,
    Caller {
        holder, mut conn, ..
    }: Caller,
    body: Result<Bytes, BytesRejection>,
    what: Bulk,
) -> Result<Response, Problem> {
    let params = body_filter(body)?;
    let filter = params.parse()?;
    let letters = letters_of(&holder, state, params.owner.as_deref())?;
    let target = audit::filter_target(&filter, params.owner.is_some());
    let done = act_in_bulk(
        &mut conn,
        &letters,
        &filter,
        &holder,
        Source::Api,
        &target,
        what,
    )
    .await?;
    Ok(match done {
        BulkDone::Replayed(done) => Json(BulkReplayView::from(done)).into_response(),
        BulkDone::Discarded(discarded) => Json(DiscardView { discarded }).into_response(),
    })
}
