//! Console sessions: an API key exchanged at sign-in for a short-lived signed cookie, and the
//! anti-forgery tokens of the console's forms.
//!
//! Invariants this module keeps:
//! - The session cookie holds the key's id, a random session id and an expiry, signed with
//!   HMAC-SHA-256 under `DURABLE_ETL_SECRET` (its own domain label); never the key, the owner or
//!   anything the key could be found from. It is `HttpOnly`, `SameSite=Strict`, `Secure` and
//!   scoped to `/console`, and lives [`SESSION_LIFETIME`].
//! - Every request reads the key again by id, and whether its session was signed out, in one
//!   pipelined round trip: revoking the key ends its sessions at once, and signing out ends that
//!   session on the server (`etl_console_ended_sessions`, migration 0015), so a copy of its
//!   cookie is refused like an expired one. The table stays bounded: each sign-out deletes the
//!   rows past their cookie's expiry, after which the cookie is refused anyway.
//! - Every state-changing form carries a token derived from the session cookie (its own label),
//!   which a page of another site cannot read; the sign-in form carries one derived from a nonce
//!   cookie set with the form (so another site cannot sign a browser into its own key).
//! - Signatures and tokens are compared in constant time.

use crate::digest::{DigestKind, Secret};
use crate::error::Error;
use crate::service::api_keys::{self, KeyHolder};
use axum::http::{header, HeaderMap, HeaderValue};
use chrono::{DateTime, Utc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "detl_session";

/// The sign-in form's nonce cookie's name.
pub(crate) const SIGN_IN_COOKIE: &str = "detl_sign_in";

/// How long a session lasts after sign-in.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// How long a sign-in form may be submitted after it was served.
pub(crate) const SIGN_IN_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Whether session `$1` was signed out.
///
/// Locks: none (a primary-key read).
const ENDED_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM etl_console_ended_sessions WHERE session_id = $1)";

/// Ends session `$1`, whose cookie expires at `$2`, and deletes the rows of sessions whose cookie
/// has expired (refused anyway): the table holds only sign-outs of the last [`SESSION_LIFETIME`].
///
/// Locks: the new row's; the deleted rows' (expired sessions nobody reads any more).
const END_SQL: &str = "
WITH purged AS (
    DELETE FROM etl_console_ended_sessions WHERE expires_at < now()
)
INSERT INTO etl_console_ended_sessions (session_id, expires_at)
VALUES ($1, $2)
    ON CONFLICT (session_id) DO NOTHING";

/// What a valid session cookie says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    /// The key it was signed in with.
    pub(crate) key_id: Uuid,
    /// The session's own id (random, one per sign-in).
    pub(crate) id: Uuid,
    /// When its cookie expires, in Unix seconds.
    pub(crate) expires: u64,
}

/// A signed-in viewer: the key's holder, its session, and the token its forms carry.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    /// Who the session acts for.
    pub(crate) holder: KeyHolder,
    /// The session, for signing out.
    pub(crate) session: Session,
    /// The anti-forgery token of this session's forms.
    pub(crate) csrf: String,
}

impl Viewer {
    /// Whether `token` is this session's anti-forgery token.
    pub(crate) fn accepts(&self, token: &str) -> bool {
        same(token, &self.csrf)
    }
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The signature of `payload` under `secret`, in hex.
fn signature(secret: &Secret, kind: DigestKind, payload: &str) -> String {
    hex::encode(secret.digest(kind, payload.as_bytes()))
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

/// The value of the cookie of `session`.
pub(crate) fn session_value(secret: &Secret, session: Session) -> String {
    let payload = format!(
        "{}.{}.{}",
        session.key_id,
        session.id.simple(),
        session.expires
    );
    let mac = signature(secret, DigestKind::ConsoleSession, &payload);
    format!("{payload}.{mac}")
}

/// A new session's cookie value for key `key_id`.
pub(crate) fn new_session(secret: &Secret, key_id: Uuid) -> String {
    let session = Session {
        key_id,
        id: Uuid::new_v4(),
        expires: now() + SESSION_LIFETIME.as_secs(),
    };
    session_value(secret, session)
}

/// The session of a cookie `value` whose signature holds and that has not expired at `now`
/// (Unix seconds). A cookie of the format before sessions had ids is refused.
pub(crate) fn verify_session(secret: &Secret, value: &str, now: u64) -> Option<Session> {
    let (payload, mac) = value.rsplit_once('.')?;
    if !same(mac, &signature(secret, DigestKind::ConsoleSession, payload)) {
        return None;
    }
    let mut parts = payload.split('.');
    let (key_id, id, expires) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let session = Session {
        key_id: Uuid::parse_str(key_id).ok()?,
        id: Uuid::parse_str(id).ok()?,
        expires: expires.parse().ok()?,
    };
    (now < session.expires).then_some(session)
}

/// The anti-forgery token of forms bound to `value` (a session cookie, or a sign-in nonce).
pub(crate) fn csrf_token(secret: &Secret, value: &str) -> String {
    signature(secret, DigestKind::ConsoleCsrf, value)
}

/// Whether `token` is the anti-forgery token of forms bound to `value`.
pub(crate) fn csrf_ok(secret: &Secret, value: &str, token: &str) -> bool {
    same(token, &csrf_token(secret, value))
}

/// A sign-in nonce: random, with the time it was made, so that a stale form is refused.
pub(crate) fn new_sign_in_nonce() -> String {
    format!("{}.{}", Uuid::new_v4().simple(), now())
}

/// Whether the sign-in nonce `value` was made less than [`SIGN_IN_LIFETIME`] before `now`.
pub(crate) fn sign_in_nonce_fresh(value: &str, now: u64) -> bool {
    value
        .split_once('.')
        .and_then(|(_, made)| made.parse::<u64>().ok())
        .is_some_and(|made| made <= now && now - made < SIGN_IN_LIFETIME.as_secs())
}

/// The value of cookie `name` in `headers`, if sent.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value that sets cookie `name` to `value` for `max_age`.
pub(crate) fn set_cookie(name: &str, value: &str, max_age: Duration) -> HeaderValue {
    let cookie = format!(
        "{name}={value}; Path=/console; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        max_age.as_secs()
    );
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A `Set-Cookie` value that removes cookie `name`.
pub(crate) fn clear_cookie(name: &str) -> HeaderValue {
    set_cookie(name, "", Duration::ZERO)
}

/// The viewer of a request whose session cookie is valid, whose session was not signed out and
/// whose key is still live.
///
/// # Errors
/// Database errors.
pub(crate) async fn viewer(
    client: &impl GenericClient,
    secret: &Secret,
    headers: &HeaderMap,
) -> Result<Option<Viewer>, Error> {
    let Some(value) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    let Some(session) = verify_session(secret, value, now()) else {
        return Ok(None);
    };
    // Both reads are pipelined on the one connection: one round trip.
    let ended = async {
        let row = client
            .query_typed_one(ENDED_SQL, &[(&session.id, Type::UUID)])
            .await?;
        Ok::<bool, Error>(row.get(0))
    };
    let (holder, ended) = tokio::try_join!(api_keys::holder_of_id(client, session.key_id), ended)?;
    Ok(holder.filter(|_| !ended).map(|holder| Viewer {
        holder,
        session,
        csrf: csrf_token(secret, value),
    }))
}

/// Ends `session` on the server: its cookie is refused from now on, wherever it was copied to.
///
/// # Errors
/// Database errors.
pub(crate) async fn end(client: &impl GenericClient, session: Session) -> Result<(), Error> {
    let expires = i64::try_from(session.expires)
        .ok()
        .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0))
        .unwrap_or_else(|| Utc::now() + SESSION_LIFETIME);
    client
        .execute_typed(
            END_SQL,
            &[(&session.id, Type::UUID), (&expires, Type::TIMESTAMPTZ)],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test secret.
    fn secret() -> Secret {
        Secret::new("0123456789abcdef-console").unwrap_or_else(|| unreachable!())
    }

    #[test]
    fn a_session_verifies_until_it_expires_and_never_once_altered() {
        let session = Session {
            key_id: Uuid::now_v7(),
            id: Uuid::new_v4(),
            expires: 1_000,
        };
        let value = session_value(&secret(), session);
        assert_eq!(verify_session(&secret(), &value, 999), Some(session));
        assert_eq!(verify_session(&secret(), &value, 1_000), None, "expired");
        let other = Secret::new("another-secret-of-16").unwrap_or_else(|| unreachable!());
        assert_eq!(verify_session(&other, &value, 999), None, "another secret");
        let later = value.replace(".1000.", ".9000.");
        assert_eq!(
            verify_session(&secret(), &later, 999),
            None,
            "expiry changed"
        );
        for broken in ["", "x", "a.b", "a.b.c", &value[..value.len() - 1]] {
            assert_eq!(verify_session(&secret(), broken, 999), None, "{broken}");
        }
        // A cookie of the format without a session id, however well signed, is refused.
        let payload = format!("{}.1000", session.key_id);
        let old = format!(
            "{payload}.{}",
            signature(&secret(), DigestKind::ConsoleSession, &payload)
        );
        assert_eq!(verify_session(&secret(), &old, 999), None);
        let other = new_session(&secret(), session.key_id);
        assert_ne!(
            verify_session(&secret(), &other, now()).map(|s| s.id),
            Some(session.id),
            "each sign-in is a session of its own"
        );
    }

    #[test]
    fn tokens_are_bound_to_their_cookie() {
        let token = csrf_token(&secret(), "cookie-a");
        assert!(csrf_ok(&secret(), "cookie-a", &token));
        assert!(!csrf_ok(&secret(), "cookie-b", &token));
        assert!(!csrf_ok(&secret(), "cookie-a", ""));
        assert_ne!(
            csrf_token(&secret(), "x"),
            signature(&secret(), DigestKind::ConsoleSession, "x"),
            "a session signature is never a valid token"
        );
    }

    #[test]
    fn sign_in_nonces_go_stale() {
        let nonce = format!("abc.{}", 1_000);
        assert!(sign_in_nonce_fresh(&nonce, 1_000));
        assert!(sign_in_nonce_fresh(&nonce, 1_599));
        assert!(!sign_in_nonce_fresh(&nonce, 1_600));
        assert!(!sign_in_nonce_fresh(&nonce, 999), "made in the future");
        assert!(!sign_in_nonce_fresh("abc", 1_000));
        assert!(sign_in_nonce_fresh(&new_sign_in_nonce(), now()));
    }

    #[test]
    fn cookies_are_read_by_name_and_set_strict() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; detl_session=v"),
        );
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("v"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "c"), None);
        let set = set_cookie("n", "v", Duration::from_secs(60));
        assert_eq!(
            set.to_str().unwrap_or_default(),
            "n=v; Path=/console; Max-Age=60; HttpOnly; Secure; SameSite=Strict"
        );
        assert!(clear_cookie("n")
            .to_str()
            .unwrap_or_default()
            .contains("Max-Age=0"));
    }
}
