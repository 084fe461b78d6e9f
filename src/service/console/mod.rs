//! The web console (`/console`): server-rendered pages for owners, over the same owner scoping as
//! the JSON API.
//!
//! Invariants this module keeps:
//! - Every page but sign-in needs a session ([`session`]) that was not signed out; without one, a
//!   page redirects to sign-in and a form is refused. An owner sees exactly the jobs the API
//!   would show that owner's key, and another owner's job answers like one that does not exist
//!   (`404`).
//! - Every state-changing request is a `POST` carrying the session's anti-forgery token; a
//!   missing or wrong token is refused (`403`) before anything is read or written.
//! - Every answer carries a strict Content-Security-Policy (no inline script or style, nothing
//!   from another origin, no framing), `nosniff`, `no-referrer` and `no-store`.
//! - No page carries an API key, a payload, a principal, an idempotency key, SQL or an error
//!   message ([`pages`]); the API key travels once, in the sign-in form's body.
//! - The operators' pages ([`fleet`]: the operator view, the queues, the drill-downs from a queue
//!   or a failure code) exist for operator keys only, and show aggregates and job metadata
//!   ([`drill`]), never a job's contents or its owner.
//! - The one script (`console.js`, from this origin) only refreshes pages that ask for it; every
//!   page reads and works the same without it.

mod access;
mod audit;
mod charts;
mod diagnosis;
mod drill;
mod fleet;
mod fleet_pages;
mod letter_forms;
mod letter_pages;
mod letters;
mod operator;
mod pages;
mod queue_actions;
mod schedules;
pub(crate) mod session;
mod when;

use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::directory::KeyRef;
use crate::error::Error;
use crate::jobs::state::JobState;
use crate::jobs::{self, Cancel};
use crate::service::api_keys::{self, KeyHolder};
use crate::service::audit as audit_log;
use access::{not_found, page, shown, to_sign_in, viewer};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use session::Viewer;
use uuid::Uuid;

/// The largest form body a console route reads, in bytes (an API key and a token fit many
/// times over); a larger one is refused with `413` before it is read whole.
const FORM_LIMIT: usize = 8 * 1024;

/// Jobs per page of the list.
const PAGE_SIZE: i64 = 50;

/// The console's stylesheet.
const STYLESHEET: &str = include_str!("console.css");

/// The console's one script: live refresh of the pages that ask for it (`data-refresh`).
const SCRIPT: &str = include_str!("console.js");

/// The Content-Security-Policy of every console answer: only this origin's stylesheet and
/// script, fetches (the live refresh) and forms to this origin only, never framed.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                   base-uri 'none'";

/// The console's routes.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/jobs") }))
        .route("/console/sign-in", get(sign_in_page).post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/jobs", get(job_list))
        .route("/console/jobs/{id}", get(job_page))
        .route("/console/jobs/{id}/cancel", post(cancel))
        .route("/console/dead-letters", get(letters::letters_page))
        .route(
            "/console/dead-letters/replay",
            post(letters::replay_matching),
        )
        .route(
            "/console/dead-letters/discard",
            post(letters::discard_matching),
        )
        .route(
            "/console/dead-letters/{id}/replay",
            post(letters::replay_one),
        )
        .route(
            "/console/dead-letters/{id}/discard",
            post(letters::discard_one),
        )
        .route("/console/schedules", get(schedules::schedules_page))
        .route("/console/schedules/{name}", get(schedules::schedule_page))
        .route("/console/schedules/{name}/pause", post(schedules::pause))
        .route("/console/schedules/{name}/resume", post(schedules::resume))
        .route("/console/operator", get(fleet::operator_page))
        .route("/console/operator/audit", get(audit::audit_page))
        .route(
            "/console/operator/schedules",
            get(schedules::all_schedules_page),
        )
        .route("/console/queues", get(fleet::queues_page))
        .route("/console/queues/{name}", get(fleet::queue_page))
        .route(
            "/console/queues/{name}/{control}",
            post(queue_actions::apply),
        )
        .route("/console/failures/{code}", get(fleet::failure_page))
        .route("/console/console.css", get(stylesheet))
        .route("/console/console.js", get(script))
        // The app lifts axum's default body limit for the API's own; a console form is small.
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(axum::middleware::map_response(secured))
}

/// Adds the console's security headers to `response`.
async fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// A static asset of `content_type` (cacheable: it holds nothing of anyone's).
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// The stylesheet.
async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", STYLESHEET)
}

/// The live-refresh script.
async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The sign-in page's query: `ended=1` after a session that ended.
#[derive(Deserialize)]
struct SignInQuery {
    /// Whether the viewer came from a session that ended.
    ended: Option<u8>,
}

/// The sign-in form, with a fresh nonce cookie that its token is bound to (and, after a session
/// that ended, a message saying so).
async fn sign_in_page(
    State(state): State<AppState>,
    query: Result<Query<SignInQuery>, QueryRejection>,
) -> Response {
    let ended = query.is_ok_and(|q| q.ended == Some(1));
    let message = ended.then_some(pages::SignInMessage::Ended);
    sign_in_form(&state, message)
}

/// The sign-in form, with `message` (a key that was not accepted, a session that ended).
fn sign_in_form(state: &AppState, message: Option<pages::SignInMessage>) -> Response {
    let nonce = session::new_sign_in_nonce();
    let token = session::csrf_token(&state.secret, &nonce);
    let status = if message == Some(pages::SignInMessage::Refused) {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    let cookie = session::set_cookie(session::SIGN_IN_COOKIE, &nonce, session::SIGN_IN_LIFETIME);
    let mut response = page(status, pages::sign_in(&token, message));
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    response
}

/// The sign-in form's fields.
#[derive(Deserialize)]
struct SignIn {
    /// The API key.
    api_key: String,
    /// The form's token.
    pub(super) csrf: String,
}

/// Exchanges an API key for a session cookie. The form must carry the token of the nonce cookie
/// set with it, still fresh.
async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Result<Response, Problem> {
    let nonce = session::cookie(&headers, session::SIGN_IN_COOKIE).unwrap_or_default();
    if !session::sign_in_nonce_fresh(nonce, session::now())
        || !session::csrf_ok(&state.secret, nonce, &form.csrf)
    {
        return Ok(page(StatusCode::FORBIDDEN, pages::forbidden()));
    }
    let key = form.api_key.trim();
    let digest = api_keys::key_digest(&state.secret, key);
    let Some(cell) = state.cells.of_key(KeyRef::Digest(&digest)).await? else {
        return Ok(sign_in_form(&state, Some(pages::SignInMessage::Refused)));
    };
    let mut conn = Conn::checkout(&cell.pool).await?;
    let Some(KeyHolder { id, .. }) = conn
        .run(|c| api_keys::holder_of_key(&*c, &state.secret, key))
        .await?
    else {
        return Ok(sign_in_form(&state, Some(pages::SignInMessage::Refused)));
    };
    let value = session::new_session(&state.secret, id);
    let mut response = Redirect::to("/console/jobs").into_response();
    let headers = response.headers_mut();
    headers.append(
        header::SET_COOKIE,
        session::set_cookie(session::SESSION_COOKIE, &value, session::SESSION_LIFETIME),
    );
    headers.append(
        header::SET_COOKIE,
        session::clear_cookie(session::SIGN_IN_COOKIE),
    );
    Ok(response)
}

/// A form that only carries its token.
#[derive(Deserialize)]
pub(super) struct Token {
    /// The session's anti-forgery token.
    csrf: String,
}

/// The viewer of a state-changing form, or the answer that refuses it: no session (sign-in) or
/// no valid token (`403`).
pub(super) async fn form_viewer(
    state: &AppState,
    headers: &HeaderMap,
    token: &str,
) -> Result<Result<(Viewer, Conn), Response>, Problem> {
    Ok(match viewer(state, headers).await? {
        Some((viewer, conn)) if viewer.accepts(token) => Ok((viewer, conn)),
        _ => Err(page(StatusCode::FORBIDDEN, pages::forbidden())),
    })
}

/// Ends the session on the server (a copy of its cookie is refused from then on) and removes its
/// cookie; the key stays live (revoke it to end every session).
async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<Token>,
) -> Result<Response, Problem> {
    let (viewer, mut conn) = match form_viewer(&state, &headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(refused),
    };
    let ended = viewer.session;
    conn.run(|c| session::end(&*c, ended)).await?;
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session::clear_cookie(session::SESSION_COOKIE),
    );
    Ok(response)
}

/// The job list's query.
#[derive(Deserialize)]
struct ListQuery {
    /// A status to show only (empty: any).
    #[serde(default)]
    status: String,
    /// Show jobs older than this one (the next page).
    after: Option<Uuid>,
    /// Go to this job (empty: none).
    #[serde(default)]
    id: String,
    /// Only jobs submitted from this time, UTC, as a `datetime-local` field sends it (empty:
    /// open).
    #[serde(default)]
    from: String,
    /// Only jobs submitted before this time, UTC (empty: open).
    #[serde(default)]
    to: String,
}

/// The viewer's jobs, newest first, a page at a time, optionally of one status and submitted
/// between two times; a job id goes to that job's page, and a time that is not one answers `400`
/// with the form and a hint.
async fn job_list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let Some((viewer, mut conn)) = viewer(&state, &headers).await? else {
        return Ok(to_sign_in(&headers));
    };
    let Ok(Query(query)) = query else {
        return Ok(not_found(&viewer));
    };
    if !query.id.trim().is_empty() {
        return Ok(match Uuid::parse_str(query.id.trim()) {
            Ok(id) => Redirect::to(&format!("/console/jobs/{id}")).into_response(),
            Err(_) => not_found(&viewer),
        });
    }
    let status = JobState::parse(&query.status);
    let (Ok(from), Ok(to)) = (when::utc_field(&query.from), when::utc_field(&query.to)) else {
        let view = pages::ListView {
            status,
            bad_time: true,
            ..Default::default()
        };
        return Ok(page(
            StatusCode::BAD_REQUEST,
            pages::jobs(shown(&viewer), &view),
        ));
    };
    let window = jobs::Window::submitted(from, to).after(query.after);
    let owner = &viewer.holder.owner_key;
    let status_filter = status.map(JobState::as_str);
    let listed = conn
        .run(|c| jobs::page(&*c, owner, window, status_filter, PAGE_SIZE))
        .await?;
    let view = pages::ListView {
        status,
        from,
        to,
        jobs: &listed.jobs,
        next: listed.next,
        bad_time: false,
    };
    Ok(page(StatusCode::OK, pages::jobs(shown(&viewer), &view)))
}

/// The query of a job's page: `cancel=deferred` right after a cancel recorded while the job's
/// commit held it. Any other query is ignored.
#[derive(Debug, Deserialize)]
struct JobNotice {
    /// What the cancel that led here was answered, if one did.
    cancel: Option<String>,
}

/// The value of [`JobNotice::cancel`] after a [`Cancel::Deferred`].
const DEFERRED: &str = "deferred";

/// One job of the viewer's: `404` when it is not theirs or does not exist.
async fn job_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    notice: Result<Query<JobNotice>, QueryRejection>,
) -> Result<Response, Problem> {
    let cancel_deferred = notice.is_ok_and(|Query(n)| n.cancel.as_deref() == Some(DEFERRED));
    let Some((viewer, mut conn)) = viewer(&state, &headers).await? else {
        return Ok(to_sign_in(&headers));
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return Ok(not_found(&viewer));
    };
    let Some(owner) = conn.run(|c| access::job_owner(&*c, &viewer, id)).await? else {
        return Ok(not_found(&viewer));
    };
    let owner = &owner;
    let letters = crate::dead_letters::DeadLetters::of(state.secret.clone(), *owner);
    let letters = &letters;
    // One snapshot for the reads (a retry committing between them would otherwise show an
    // attempt the status does not count): they are pipelined between its BEGIN and COMMIT.
    let (job, attempts, replaced_by, letter) = conn
        .run(|c| async move {
            let snapshot = access::snapshot(c).await?;
            let read = tokio::try_join!(
                jobs::status(&snapshot, owner, id),
                jobs::attempts(&snapshot, owner, id),
                jobs::replaced_by(&snapshot, owner, id),
                letters.get(&snapshot, id)
            )?;
            snapshot.commit().await?;
            Ok::<_, Error>(read)
        })
        .await?;
    Ok(match job {
        Some(job) => {
            let history = pages::JobHistory {
                attempts: &attempts.past,
                last: attempts.last.as_ref(),
                replaced_by: &replaced_by,
                cancel_deferred,
                letter: letter.as_ref(),
                own: *owner == viewer.holder.owner_key,
            };
            page(StatusCode::OK, pages::job(shown(&viewer), &job, &history))
        }
        None => not_found(&viewer),
    })
}

/// A form that carries its token and whether it is an action's confirmation.
#[derive(Deserialize)]
pub(super) struct Confirmed {
    /// The session's anti-forgery token.
    csrf: String,
    /// `yes` on the confirmation's `POST` (empty: ask to confirm).
    #[serde(default)]
    confirm: String,
}

/// Cancels one of the viewer's jobs (any owner's for an operator), with the API's semantics (a
/// pending job ends `cancelled`, a running one gets a cancel request, recorded for later while
/// its commit holds it), then shows its page again (saying so when the request was recorded for
/// later). The first `POST` asks to confirm; only the confirmed one cancels.
async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Confirmed>,
) -> Result<Response, Problem> {
    let (viewer, mut conn) = match form_viewer(&state, &headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(refused),
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return Ok(not_found(&viewer));
    };
    let Some(owner) = conn.run(|c| access::job_owner(&*c, &viewer, id)).await? else {
        return Ok(not_found(&viewer));
    };
    let owner = &owner;
    if form.confirm != pages::CONFIRMED {
        let job = conn.run(|c| jobs::status(&*c, owner, id)).await?;
        return Ok(match job {
            Some(_) => page(
                StatusCode::OK,
                pages::confirm(shown(&viewer), &pages::cancel_confirm(id)),
            ),
            None => not_found(&viewer),
        });
    }
    let by_key = &viewer.holder;
    // The cancel and its audit entry commit together (written for an operator's key only).
    let done = conn
        .run(|c| async move {
            let tx = c.transaction().await?;
            let done = jobs::cancel(&tx, owner, id, Code::Cancelled).await?;
            if matches!(
                done,
                Cancel::Cancelled | Cancel::Requested | Cancel::Deferred
            ) {
                let (action, target) = (audit_log::Action::JobCancel, id.to_string());
                audit_log::record(&tx, by_key, audit_log::Source::Console, action, &target, 1)
                    .await?;
            }
            tx.commit().await?;
            Ok::<_, Error>(done)
        })
        .await?;
    Ok(match done {
        Cancel::NotFound => not_found(&viewer),
        Cancel::Cancelled | Cancel::Requested | Cancel::AlreadyEnded(_) => {
            Redirect::to(&format!("/console/jobs/{id}")).into_response()
        }
        Cancel::Deferred => {
            super::jobs::settle_deferred(conn.pool(), id);
            Redirect::to(&format!("/console/jobs/{id}?cancel={DEFERRED}")).into_response()
        }
    })
}
