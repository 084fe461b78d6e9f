//! Who sends an API request: the holder of its bearer API key, looked up once for every route
//! ([`Caller`]), which the owner-scoped routes ([`Owner`](super::jobs::Owner)), the operators'
//! routes ([`Operator`](super::queues::Operator)) and the dead-letter routes build on.
//!
//! Invariants this module keeps:
//! - A request without a bearer key, or with one that is unknown or revoked, is `401
//!   unauthorized` before anything else is read; the key itself is only ever digested.
//! - The connection that looked the key up is the request's one checkout of the key owner's cell
//!   (see `cells`): the handler runs its statements on it. A routed API reads the directory
//!   first, on a connection of its own that goes back before this one is taken.

use super::cells::CellPool;
use super::conn::Conn;
use super::problem::Problem;
use super::AppState;
use crate::codes::Code;
use crate::directory::KeyRef;
use crate::service::api_keys::{self, KeyHolder};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use std::sync::Arc;

/// The holder of an authenticated request's key (its id, owner and role), with the connection
/// that looked it up and the cell it acts in.
pub(super) struct Caller {
    /// The key's holder.
    pub(super) holder: KeyHolder,
    /// The request's connection.
    pub(super) conn: Conn,
    /// The cell the request acts in.
    pub(super) cell: Arc<CellPool>,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Problem> {
        let key = bearer_key(&parts.headers)?;
        let digest = api_keys::key_digest(&state.secret, key);
        let cell = state
            .cells
            .of_key(KeyRef::Digest(&digest))
            .await?
            .ok_or_else(|| Problem::new(Code::Unauthorized))?;
        let mut conn = Conn::checkout(&cell.pool).await?;
        let holder = conn
            .run(|c| api_keys::holder_of_key(&*c, &state.secret, key))
            .await?
            .ok_or_else(|| Problem::new(Code::Unauthorized))?;
        Ok(Caller { holder, conn, cell })
    }
}

/// The API key of a request's `Authorization: Bearer` header, or `unauthorized` when there is
/// none (or an empty one).
pub(super) fn bearer_key(headers: &HeaderMap) -> Result<&str, Problem> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Problem::new(Code::Unauthorized))
}

/// The token of an `Authorization` value whose scheme is `Bearer`, in any case (RFC 9110 §11.1:
/// scheme names are case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}
