//! The console's dead letters: the page that lists, filters, counts and pages them, and the
//! forms that replay or discard one letter or every letter matching a filter.
//!
//! Invariants this module keeps:
//! - An owner's session sees and acts on its own owner's letters only; another owner's letter
//!   answers like one that does not exist (`404`). An operator's sees and acts on every owner's,
//!   and may narrow them to one owner.
//! - An operator's owner filter is read once as a principal and answered at once with a redirect
//!   to the same filter by the owner's digest (`owner_key`), so no page, link or form carries a
//!   principal.
//! - A filter value that is not one (a queue or kind that is not a name, a code that is not an
//!   identifier, a time that is not one) is never sent to the database nor echoed: the page
//!   answers `400` with an empty form and a hint.
//! - Every action is a `POST` carrying the session's token, refused (`403`) before anything is
//!   read without it. The first `POST` only reads (the letter, or how many letters match) and
//!   asks to confirm; only a `POST` with `confirm=yes` acts.
//! - A replay records who asked as `console:<key id>`, the signed-in key's id, never an owner.
//! - Every action that acts hands its audit entry to [`crate::service::audit::record`]
//!   (written for an operator's key only), in the action's own transaction but for a bulk
//!   replay's, which commits in chunks and is logged after its last.

use super::access::{self, not_found, page, shown, to_sign_in, viewer};
use super::letter_forms::{Chosen, FilterFields};
use super::pages::CONFIRMED;
use super::{form_viewer, letter_pages};
use crate::codes::Code;
use crate::dead_letters::{DeadLetters, LetterCursor};
use crate::digest::DigestKind;
use crate::error::Error;
use crate::service::api_keys::Role;
use crate::service::audit::Source;
use crate::service::conn::Conn;
use crate::service::dead_letters::{self, act_in_bulk, Bulk, BulkDone};
use crate::service::problem::Problem;
use crate::service::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use uuid::Uuid;

use super::session::Viewer;

/// Letters per page of the list.
const PAGE_SIZE: i64 = 50;

/// The page's query: the filter, where the page starts, and what the action before did.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PageQuery {
    /// The filter.
    #[serde(flatten)]
    filter: FilterFields,
    /// The cursor of the page (empty: the newest letters).
    #[serde(default)]
    after: String,
    /// What the action that led here did: `replayed` or `discarded` (empty: none).
    #[serde(default)]
    done: String,
    /// How many letters it took.
    #[serde(default)]
    n: String,
    /// How many matching letters a bulk replay left (no payload retained, or unreadable).
    #[serde(default)]
    left: String,
}

/// The letters `viewer` sees: its owner's, or every owner's for an operator, narrowed to the
/// owner `chosen` names; with the deployment's payload key.
pub(super) fn letters_of(
    state: &AppState,
    viewer: &Viewer,
    owner: Option<[u8; 32]>,
) -> DeadLetters {
    let letters = match viewer.holder.role {
        Role::Operator => {
            let all = DeadLetters::all_owners(state.secret.clone());
            match owner {
                Some(owner) => all.narrowed_to(owner),
                None => all,
            }
        }
        Role::Owner => DeadLetters::of(state.secret.clone(), viewer.holder.owner_key),
    };
    match &state.payload_key {
        Some(key) => letters.with_key(key.clone()),
        None => letters,
    }
}

/// What the action that led to the page did, parsed from its query.
fn done(query: &PageQuery) -> Option<letter_pages::Done> {
    let n = query.n.parse().ok()?;
    let left = query.left.parse().unwrap_or(0);
    match query.done.as_str() {
        "replayed" => Some(letter_pages::Done::Replayed { n, left }),
        "discarded" => Some(letter_pages::Done::Discarded { n }),
        _ => None,
    }
}

/// The dead-letter page: the filter form, the counts per queue and code, a page of the open
/// letters matching the filter (newest first), and the bulk actions.
pub(super) async fn letters_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let Some((viewer, mut conn)) = viewer(&state, &headers).await? else {
        return Ok(to_sign_in(&headers));
    };
    let Ok(Query(query)) = query else {
        return Ok(not_found(&viewer));
    };
    let role = viewer.holder.role;
    let digest = |p: &str| state.secret.digest(DigestKind::Principal, p.as_bytes());
    let after = match query.after.trim() {
        "" => Ok(None),
        token => LetterCursor::parse(token).map(Some).ok_or(()),
    };
    let (Ok(chosen), Ok(after)) = (Chosen::parse(&query.filter, role, digest), after) else {
        let view = letter_pages::ListView {
            bad_filter: true,
            ..letter_pages::ListView::default()
        };
        return Ok(page(
            StatusCode::BAD_REQUEST,
            letter_pages::letters(shown(&viewer), &view),
        ));
    };
    if !query.filter.owner.trim().is_empty() {
        return Ok(
            Redirect::to(&format!("/console/dead-letters?{}", chosen.query())).into_response(),
        );
    }
    let letters = letters_of(&state, &viewer, chosen.owner);
    let filter = chosen.filter();
    let (counts, listed) = conn
        .run(|c| async move {
            let snapshot = access::snapshot(c).await?;
            let read = tokio::try_join!(
                letters.counts(&snapshot, &filter),
                letters.list(&snapshot, &filter, after, PAGE_SIZE)
            )?;
            snapshot.commit().await?;
            Ok::<_, Error>(read)
        })
        .await?;
    let view = letter_pages::ListView {
        chosen: chosen.clone(),
        counts: &counts,
        letters: &listed.letters,
        next: listed.next.map(|c| c.token()),
        done: done(&query),
        bad_filter: false,
        can_replay: state.payload_key.is_some(),
    };
    Ok(page(
        StatusCode::OK,
        letter_pages::letters(shown(&viewer), &view),
    ))
}

/// A bulk action's form: the session's token, whether it is the confirmation, and the filter.
#[derive(Debug, Deserialize)]
pub(super) struct BulkForm {
    /// The session's anti-forgery token.
    csrf: String,
    /// [`CONFIRMED`] on the confirmation's `POST` (empty: show the preview).
    #[serde(default)]
    confirm: String,
    /// The letters it takes.
    #[serde(flatten)]
    filter: FilterFields,
}

/// A one-letter action's form: the session's token and whether it is the confirmation.
#[derive(Debug, Deserialize)]
pub(super) struct OneForm {
    /// The session's anti-forgery token.
    csrf: String,
    /// [`CONFIRMED`] on the confirmation's `POST` (empty: show the preview).
    #[serde(default)]
    confirm: String,
}

/// Replays every open letter matching the form's filter whose payload is retained: the first
/// `POST` shows how many it takes and leaves, the confirmed one does it.
pub(super) async fn replay_matching(
    state: State<AppState>,
    headers: HeaderMap,
    form: Form<BulkForm>,
) -> Result<Response, Problem> {
    bulk(state, headers, form, Bulk::Replay).await
}

/// Discards every open letter matching the form's filter: the first `POST` shows how many, the
/// confirmed one does it.
pub(super) async fn discard_matching(
    state: State<AppState>,
    headers: HeaderMap,
    form: Form<BulkForm>,
) -> Result<Response, Problem> {
    bulk(state, headers, form, Bulk::Discard).await
}

/// A bulk action `what` on the letters the form's filter takes (see [`replay_matching`] and
/// [`discard_matching`]).
async fn bulk(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
    what: Bulk,
) -> Result<Response, Problem> {
    let (viewer, mut conn) = match form_viewer(&state, &headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(refused),
    };
    let digest = |p: &str| state.secret.digest(DigestKind::Principal, p.as_bytes());
    let Ok(chosen) = Chosen::parse(&form.filter, viewer.holder.role, digest) else {
        return Ok(not_found(&viewer));
    };
    let letters = letters_of(&state, &viewer, chosen.owner);
    if what == Bulk::Replay && state.payload_key.is_none() {
        return Ok(not_found(&viewer));
    }
    let filter = chosen.filter();
    let back = format!("/console/dead-letters?{}", chosen.query());
    if form.confirm != CONFIRMED {
        let preview = match what {
            Bulk::Replay => {
                let preview = conn.run(|c| letters.replay_preview(&*c, &filter)).await?;
                letter_pages::Preview::Replay(preview)
            }
            Bulk::Discard => {
                let counts = conn.run(|c| letters.counts(&*c, &filter)).await?;
                letter_pages::Preview::Discard(counts.iter().map(|c| c.count).sum())
            }
        };
        let confirm = letter_pages::bulk_confirm(&chosen, &preview, &back);
        return Ok(page(
            StatusCode::OK,
            super::pages::confirm(shown(&viewer), &confirm),
        ));
    }
    let (by, summary) = (&viewer.holder, chosen.summary());
    let done = act_in_bulk(
        &mut conn,
        &letters,
        &filter,
        by,
        Source::Console,
        &summary,
        what,
    )
    .await?;
    let done = match done {
        BulkDone::Replayed(done) => format!(
            "done=replayed&n={}&left={}",
            done.made,
            done.not_retained + done.unreadable
        ),
        BulkDone::Discarded(n) => format!("done=discarded&n={n}"),
    };
    let sep = if chosen.query().is_empty() { "" } else { "&" };
    Ok(Redirect::to(&format!("{back}{sep}{done}")).into_response())
}

/// The viewer of a one-letter form, its connection, the letter's id (from the path `id`) and
/// the letters the viewer sees; or the answer that refuses the form: no session or no valid
/// token (`403`), or a path that is no letter id (`404`).
async fn one_letter(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    form: &OneForm,
) -> Result<Result<(Viewer, Conn, Uuid, DeadLetters), Response>, Problem> {
    let (viewer, conn) = match form_viewer(state, headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(Err(refused)),
    };
    let Ok(id) = Uuid::parse_str(id) else {
        return Ok(Err(not_found(&viewer)));
    };
    let letters = letters_of(state, &viewer, None);
    Ok(Ok((viewer, conn, id, letters)))
}

/// Replays one letter from its retained payload: the first `POST` says what it makes, the
/// confirmed one makes it and opens the new job's page. A letter replayed before opens the job
/// its replay made; one whose payload was not retained says how to replay it through the API.
pub(super) async fn replay_one(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<OneForm>,
) -> Result<Response, Problem> {
    let (viewer, mut conn, id, letters) = match one_letter(&state, &headers, &id, &form).await? {
        Ok(found) => found,
        Err(refused) => return Ok(refused),
    };
    let Some(letter) = conn.run(|c| letters.get(&*c, id)).await? else {
        return Ok(not_found(&viewer));
    };
    if let Some(made) = letter.replayed_job_id {
        return Ok(Redirect::to(&format!("/console/jobs/{made}")).into_response());
    }
    if !letter.retained {
        return Ok(page(
            StatusCode::CONFLICT,
            letter_pages::not_retained(shown(&viewer), id),
        ));
    }
    if form.confirm != CONFIRMED {
        let confirm = letter_pages::one_confirm(&letter, Bulk::Replay);
        return Ok(page(
            StatusCode::OK,
            super::pages::confirm(shown(&viewer), &confirm),
        ));
    }
    let by = &viewer.holder;
    let replayed =
        dead_letters::replay_audited(&mut conn, &letters, id, by, Source::Console, None).await;
    match replayed {
        Ok(done) => Ok(Redirect::to(&format!("/console/jobs/{}", done.job_id)).into_response()),
        Err(Error::Rejected(r)) if r.code == Code::NotFound => Ok(not_found(&viewer)),
        Err(Error::Rejected(r))
            if r.code == Code::PayloadNotRetained || r.code == Code::PayloadUnreadable =>
        {
            Ok(page(
                StatusCode::CONFLICT,
                letter_pages::not_retained(shown(&viewer), id),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// Discards one open letter (its retained payload with it; the job's outcome stays): the first
/// `POST` asks to confirm, the confirmed one discards it and opens the list.
pub(super) async fn discard_one(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<OneForm>,
) -> Result<Response, Problem> {
    let (viewer, mut conn, id, letters) = match one_letter(&state, &headers, &id, &form).await? {
        Ok(found) => found,
        Err(refused) => return Ok(refused),
    };
    if form.confirm != CONFIRMED {
        let letter = conn.run(|c| letters.get(&*c, id)).await?;
        return Ok(match letter.filter(|l| l.replayed_job_id.is_none()) {
            Some(letter) => page(
                StatusCode::OK,
                super::pages::confirm(
                    shown(&viewer),
                    &letter_pages::one_confirm(&letter, Bulk::Discard),
                ),
            ),
            None => not_found(&viewer),
        });
    }
    let by = &viewer.holder;
    let discarded =
        dead_letters::discard_audited(&mut conn, &letters, id, by, Source::Console).await?;
    Ok(if discarded {
        Redirect::to("/console/dead-letters?done=discarded&n=1").into_response()
    } else {
        not_found(&viewer)
    })
}
