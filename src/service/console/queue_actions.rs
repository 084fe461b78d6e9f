//! The operators' queue controls: pause and resume a queue, set or lift its cap and its key cap,
//! each from a form on the queue's page.
//!
//! Invariants this module keeps:
//! - Every control is a `POST` carrying the session's token (refused, `403`, before anything is
//!   read without it), for operator keys only: any other key's session is answered like a page
//!   that does not exist (`404`).
//! - A control acts only on a queue the console shows (one with live jobs or settings); any
//!   other name, or one that is not a queue's, is `404` and is never written.
//! - The setting and its audit entry are written in one transaction; the setting's own statement
//!   ([`crate::queue`]) wakes the replicas at its commit.

use super::access::{not_found, page};
use super::form_viewer;
use super::pages::layout;
use crate::error::Error;
use crate::queue::{self, CAP_RANGE};
use crate::service::api_keys::Role;
use crate::service::audit::{self, Action, Source};
use crate::service::conn::Conn;
use crate::service::metrics::sample_some_queues;
use crate::service::problem::Problem;
use crate::service::AppState;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;
use serde::Deserialize;

use super::session::Viewer;

/// A control's form: the session's token and, for a cap, its new value (empty: lift it).
#[derive(Debug, Deserialize)]
pub(super) struct ControlForm {
    /// The session's anti-forgery token.
    csrf: String,
    /// The new cap (empty: none).
    #[serde(default)]
    cap: String,
}

/// What a control sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    /// Pauses the queue.
    Pause,
    /// Resumes it.
    Resume,
    /// Sets or lifts its cap.
    Cap,
    /// Sets or lifts its key cap.
    KeyCap,
}

/// The operator of a control's form with its connection, or the answer that refuses it.
async fn operator_form(
    state: &AppState,
    headers: &HeaderMap,
    token: &str,
) -> Result<Result<(Viewer, Conn), Response>, Problem> {
    Ok(match form_viewer(state, headers, token).await? {
        Ok((viewer, conn)) if viewer.holder.role == Role::Operator => Ok((viewer, conn)),
        Ok((viewer, _)) => Err(not_found(&viewer)),
        Err(refused) => Err(refused),
    })
}

/// A cap as a form sends it: `Ok(None)` when empty, `Err` when not a cap.
fn cap_field(value: &str) -> Result<Option<i32>, ()> {
    match value.trim() {
        "" => Ok(None),
        v => v
            .parse::<i32>()
            .ok()
            .filter(|c| CAP_RANGE.contains(c))
            .map(Some)
            .ok_or(()),
    }
}

/// Applies control `control` (`pause`, `resume`, `cap`, `key-cap`) to queue `name`.
pub(super) async fn apply(
    state: State<AppState>,
    headers: HeaderMap,
    Path((name, control)): Path<(String, String)>,
    form: Form<ControlForm>,
) -> Result<Response, Problem> {
    let what = match control.as_str() {
        "pause" => Control::Pause,
        "resume" => Control::Resume,
        "cap" => Control::Cap,
        "key-cap" => Control::KeyCap,
        _ => return Ok(StatusCode::NOT_FOUND.into_response()),
    };
    control_queue(state, headers, name, form, what).await
}

/// Applies `what` to queue `name` with its audit entry, then shows the queue's page again.
async fn control_queue(
    State(state): State<AppState>,
    headers: HeaderMap,
    name: String,
    Form(form): Form<ControlForm>,
    what: Control,
) -> Result<Response, Problem> {
    let (viewer, mut conn) = match operator_form(&state, &headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(refused),
    };
    if !queue::is_queue_name(&name) {
        return Ok(not_found(&viewer));
    }
    let Ok(cap) = cap_field(&form.cap) else {
        return Ok(page(
            StatusCode::BAD_REQUEST,
            layout(
                "Queue",
                Some(super::access::shown(&viewer)),
                html! {
                    h1 { "Not a cap" }
                    p.error role="alert" { "A cap is a whole number from " (CAP_RANGE.start()) " to " (CAP_RANGE.end()) "; leave it empty to lift it." }
                    p { a href={ "/console/queues/" (name) } { "Back to the queue" } }
                },
            ),
        ));
    };
    let name = name.as_str();
    let by_key = &viewer.holder;
    let (action, target) = match what {
        Control::Pause => (Action::QueuePause, name.to_owned()),
        Control::Resume => (Action::QueueResume, name.to_owned()),
        Control::Cap => (Action::QueueCap, capped(name, "cap", cap)),
        Control::KeyCap => (Action::QueueKeyCap, capped(name, "key_cap", cap)),
    };
    let target = target.as_str();
    let shown = conn
        .run(|c| async move {
            let tx = c.transaction().await?;
            if sample_some_queues(&tx, 1, Some(name)).await?.is_empty() {
                return Ok::<_, Error>(false);
            }
            match what {
                Control::Pause => queue::set_paused(&tx, name, true).await?,
                Control::Resume => queue::set_paused(&tx, name, false).await?,
                Control::Cap => queue::set_cap(&tx, name, cap).await?,
                Control::KeyCap => queue::set_key_cap(&tx, name, cap).await?,
            }
            audit::record(&tx, by_key, Source::Console, action, target, 1).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await?;
    Ok(if shown {
        Redirect::to(&format!("/console/queues/{name}")).into_response()
    } else {
        not_found(&viewer)
    })
}

/// An audit target for queue `name`'s `setting` set to `cap` (`none`: lifted).
fn capped(name: &str, setting: &str, cap: Option<i32>) -> String {
    match cap {
        Some(cap) => format!("{name} {setting}={cap}"),
        None => format!("{name} {setting}=none"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_field_is_empty_or_a_cap() {
        assert_eq!(cap_field(""), Ok(None));
        assert_eq!(cap_field(" 4 "), Ok(Some(4)));
        for bad in ["0", "10001", "-1", "x", "4.5"] {
            assert_eq!(cap_field(bad), Err(()), "{bad}");
        }
        assert_eq!(capped("mail", "cap", Some(3)), "mail cap=3");
        assert_eq!(capped("mail", "key_cap", None), "mail key_cap=none");
    }
}
