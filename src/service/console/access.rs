//! Who a console request comes from, and the answers every page handler shares: a page, the
//! not-found page, the way to sign-in.
//!
//! Invariants this module keeps:
//! - A viewer is read with the connection that checked its session; that connection serves the
//!   page's own statements, so a page costs one checkout.
//! - A request without a live session goes to sign-in (clearing a cookie that no longer opens
//!   one); the operators' pages answer any other key's session exactly like a page that does not
//!   exist (`404`), never `403`, so they do not say that they exist.
//! - A job page or a job action is scoped to the job's owner: an owner's session reaches its own
//!   owner's jobs only; an operator's reaches any owner's, through the owner digest of the job's
//!   intake row ([`job_owner`]), which stays on the server.

use super::pages;
use super::session::{self, Viewer};
use crate::directory::KeyRef;
use crate::error::Error;
use crate::service::api_keys::Role;
use crate::service::conn::Conn;
use crate::service::problem::Problem;
use crate::service::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::Markup;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, IsolationLevel, Transaction};
use uuid::Uuid;

/// A page with `status`.
pub(super) fn page(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// The not-found page of `viewer` (another owner's job looks the same).
pub(super) fn not_found(viewer: &Viewer) -> Response {
    page(StatusCode::NOT_FOUND, pages::not_found(Some(shown(viewer))))
}

/// Where a request without a session goes: the sign-in form, which says that the session ended
/// when the request carried a session cookie that no longer opens one (expired, signed out, its
/// key revoked); that cookie is cleared.
pub(super) fn to_sign_in(headers: &HeaderMap) -> Response {
    if session::cookie(headers, session::SESSION_COOKIE).is_none() {
        return Redirect::to("/console/sign-in").into_response();
    }
    let mut response = Redirect::to("/console/sign-in?ended=1").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session::clear_cookie(session::SESSION_COOKIE),
    );
    response
}

/// The viewer of a request, if its session is valid and its key live, with the connection that
/// checked it: the page's own statements run on it (through `Conn::run`, so a page cut by the
/// request timeout never hands its connection on busy), and a page costs one checkout.
pub(super) async fn viewer(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(Viewer, Conn)>, Problem> {
    let session = session::cookie(headers, session::SESSION_COOKIE)
        .and_then(|value| session::verify_session(&state.secret, value, session::now()));
    let Some(session) = session else {
        return Ok(None);
    };
    let Some(cell) = state.cells.of_key(KeyRef::Id(session.key_id)).await? else {
        return Ok(None);
    };
    let mut conn = Conn::checkout(&cell.pool).await?;
    let viewer = conn
        .run(|c| session::viewer(&*c, &state.secret, headers))
        .await?;
    Ok(viewer.map(|viewer| (viewer, conn)))
}

/// The viewer of an operators' page, signed in with an operator key, and the connection that
/// checked its session. As an extractor it turns any other request away before the handler
/// runs: sign-in without a session, the not-found page for a key that is not an operator's.
pub(super) struct OperatorViewer(pub(super) Viewer, pub(super) Conn);

impl FromRequestParts<AppState> for OperatorViewer {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<OperatorViewer, Response> {
        let headers = &parts.headers;
        match viewer(state, headers).await {
            Err(problem) => Err(problem.into_response()),
            Ok(None) => Err(to_sign_in(headers)),
            Ok(Some((viewer, _))) if viewer.holder.role != Role::Operator => {
                Err(not_found(&viewer))
            }
            Ok(Some((viewer, conn))) => Ok(OperatorViewer(viewer, conn)),
        }
    }
}

/// The owner digest of job `$1`. Locks: none (a primary-key read of the intake).
const JOB_OWNER_SQL: &str = "SELECT owner_key FROM etl_job_intake WHERE id = $1";

/// The owner whose job `id` the viewer may open or act on: the viewer's own owner for an owner's
/// session (its reads then find only its jobs), the job's owner for an operator's (`None` when
/// there is no such job).
///
/// # Errors
/// Database errors.
pub(super) async fn job_owner(
    client: &impl GenericClient,
    viewer: &Viewer,
    id: Uuid,
) -> Result<Option<[u8; 32]>, Error> {
    if viewer.holder.role != Role::Operator {
        return Ok(Some(viewer.holder.owner_key));
    }
    let row = client
        .query_typed_opt(JOB_OWNER_SQL, &[(&id, Type::UUID)])
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let owner: Vec<u8> = row.try_get(0)?;
    Ok(<[u8; 32]>::try_from(owner).ok())
}

/// Opens a read-only snapshot on `client`: the reads of one page pipelined in it agree with one
/// another (a commit between them cannot show in one and not in the other).
///
/// # Errors
/// Database errors.
pub(super) async fn snapshot(
    client: &mut Client,
) -> Result<Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// What the header shows of a viewer: its role and its forms' token.
pub(super) fn shown(viewer: &Viewer) -> (Role, &str) {
    (viewer.holder.role, &viewer.csrf)
}
