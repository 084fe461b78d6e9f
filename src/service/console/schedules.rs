//! The console's schedule pages: the viewer's schedules (`/console/schedules`) with pause and
//! resume, one schedule with its latest fires, their lateness and the jobs they made
//! (`/console/schedules/{name}`), and for operators every owner's schedules
//! (`/console/operator/schedules`).
//!
//! Invariants this module keeps:
//! - A viewer sees and changes only their own owner's schedules; another owner's is the same
//!   `404` as one that does not exist. A change is a form that needs the session's token.
//! - The operators' page is for operator keys only ([`OperatorViewer`]) and changes nothing; it
//!   shows every owner's schedules without saying whose they are, and links to none of their
//!   jobs (a job's page is its owner's).
//! - A page shows a schedule's name, expression, zone, policies, state and fires, and links to
//!   the jobs it made: never its arguments (a job's payload), an owner or a key.

use super::access::{not_found, page, shown, to_sign_in, viewer, OperatorViewer};
use super::pages::live_layout;
use super::when;
use super::{form_viewer, Token};
use crate::error::Error;
use crate::schedule::{Fire, Missed, Overlap, ScheduleInfo, Schedules};
use crate::service::problem::Problem;
use crate::service::AppState;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use chrono::{DateTime, Utc};
use maud::{html, Markup};
use tokio_postgres::Row;

/// How many fires a schedule's page shows, newest first.
const FIRES_SHOWN: i64 = 20;

/// How often the pages refresh themselves, in seconds.
const REFRESH: u32 = 5;

/// The viewer's schedules.
pub(super) async fn schedules_page(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let Some((viewer, mut conn)) = viewer(&state, &headers).await? else {
        return Ok(to_sign_in(&headers));
    };
    let schedules = Schedules::of(viewer.holder.owner_key);
    let list = conn.run(|c| schedules.list(&*c)).await?;
    let (role, csrf) = shown(&viewer);
    let body = html! {
        h1 { "Schedules" }
        @if list.is_empty() {
            p { "No schedules. Create them with the library or " code { "PUT /v1/schedules/{name}" } "." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Name" } th scope="col" { "Cron" } th scope="col" { "Zone" }
                    th scope="col" { "Next fire" } th scope="col" { "Last fire" }
                    th scope="col" { "State" } th scope="col" { span.visually-hidden { "Action" } }
                } }
                tbody {
                    @for s in &list {
                        tr {
                            td { a href={ "/console/schedules/" (s.name) } { (s.name) } }
                            td { code { (s.cron) } }
                            td { (s.time_zone) }
                            td { (when::at(s.next_fire_at)) }
                            td { @match s.last_fire_at { Some(at) => (when::at(at)), None => "never" } }
                            td { (if s.paused { "paused" } else { "active" }) }
                            td { (switch(&s.name, s.paused, csrf)) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(
        StatusCode::OK,
        live_layout("Schedules", Some((role, csrf)), Some(REFRESH), body),
    ))
}

/// One of the viewer's schedules, with its latest fires.
pub(super) async fn schedule_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    let Some((viewer, mut conn)) = viewer(&state, &headers).await? else {
        return Ok(to_sign_in(&headers));
    };
    let schedules = Schedules::of(viewer.holder.owner_key);
    let found = conn
        .run(|c| async {
            match schedules.get(&*c, &name).await? {
                Some(s) => {
                    Ok::<_, Error>(Some((s, schedules.fires(&*c, &name, FIRES_SHOWN).await?)))
                }
                None => Ok(None),
            }
        })
        .await?;
    let Some((schedule, fires)) = found else {
        return Ok(not_found(&viewer));
    };
    let (role, csrf) = shown(&viewer);
    Ok(page(
        StatusCode::OK,
        live_layout(
            "Schedule",
            Some((role, csrf)),
            Some(REFRESH),
            facts(&schedule, &fires, csrf),
        ),
    ))
}

/// A schedule's facts, its pause or resume button, and its fires.
fn facts(s: &ScheduleInfo, fires: &[Fire], csrf: &str) -> Markup {
    let missed = match s.missed {
        Missed::Coalesce => "coalesce".to_owned(),
        Missed::CatchUp(n) => format!("catch up (at most {n})"),
        Missed::Skip => "skip".to_owned(),
    };
    html! {
        h1 { "Schedule " span.id { (s.name) } }
        dl.facts {
            dt { "Cron" } dd { code { (s.cron) } " in " (s.time_zone) }
            dt { "Makes" } dd { code { (s.kind) } " in " code { (s.queue) } " at priority " (s.priority) }
            dt { "Missed fires" } dd { (missed) }
            dt { "Overlap" } dd { (match s.overlap { Overlap::Allow => "allowed", Overlap::Skip => "skipped" }) }
            dt { "State" } dd { (if s.paused { "paused" } else { "active" }) @if s.declared { " (declared in code)" } }
            dt { "Next fire" } dd { (when::at(s.next_fire_at)) }
        }
        (switch(&s.name, s.paused, csrf))
        h2 { "Fires" }
        @if fires.is_empty() {
            p { "No fire yet." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Fire" } th scope="col" { "Lateness" }
                    th scope="col" { "Outcome" } th scope="col" { "Job" }
                } }
                tbody {
                    @for f in fires {
                        tr {
                            td { (when::at(f.fire_at)) }
                            td { (lateness(f.fired_at, f.fire_at)) }
                            td { (f.outcome) }
                            td { @if let Some(id) = f.job_id { a href={ "/console/jobs/" (id) } { (id) } } }
                        }
                    }
                }
            }
        }
    }
}

/// How late a fire evaluated at `fired_at` was for its instant `fire_at`: `12 ms`, `1.4 s`.
fn lateness(fired_at: DateTime<Utc>, fire_at: DateTime<Utc>) -> String {
    let ms = (fired_at - fire_at).num_milliseconds().max(0);
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// How many schedules the operators' page shows: overdue ones first, then by next fire.
const ALL_SHOWN: i64 = 200;

/// How late an unpaused schedule's next fire may be before the operators' page calls it
/// overdue: no replica is firing it.
const OVERDUE_AFTER: &str = "5 seconds";

/// Every owner's schedules (at most `$1`), overdue first, then by next fire; with the outcome
/// and lateness of each one's last fire and whether it is overdue. Locks: none; one lookup of
/// the fires' primary key per schedule shown.
const ALL_SQL: &str = "
SELECT s.name, s.kind, s.queue, s.cron, s.time_zone, s.paused, s.next_fire_at, s.last_fire_at,
       f.outcome, f.fired_at,
       NOT s.paused AND s.next_fire_at < clock_timestamp() - $2::text::interval AS overdue
  FROM etl_schedules s
  LEFT JOIN etl_schedule_fires f
         ON (f.owner_key, f.name, f.fire_at) = (s.owner_key, s.name, s.last_fire_at)
 ORDER BY overdue DESC, s.paused, s.next_fire_at, s.name
 LIMIT $1";

/// The operators' counts of schedules: all, paused, and overdue. Locks: none.
const COUNTS_SQL: &str = "
SELECT count(*), count(*) FILTER (WHERE paused),
       count(*) FILTER (WHERE NOT paused
                          AND next_fire_at < clock_timestamp() - $1::text::interval)
  FROM etl_schedules";

/// Every owner's schedules, for operators: how many, paused and overdue, and the first
/// [`ALL_SHOWN`] with their last fire.
pub(super) async fn all_schedules_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
) -> Result<Response, Problem> {
    let (counts, rows) = conn
        .run(|c| async {
            let counts = c.query_one(COUNTS_SQL, &[&OVERDUE_AFTER]).await?;
            let rows = c.query(ALL_SQL, &[&ALL_SHOWN, &OVERDUE_AFTER]).await?;
            Ok::<_, Error>((counts, rows))
        })
        .await?;
    let (all, paused, overdue): (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    let body = html! {
        h1 { "All schedules" }
        p {
            (all) " schedules of every owner, " (paused) " paused, " (overdue) " overdue (a next fire more than "
            (OVERDUE_AFTER) " past: no replica is firing it)."
        }
        @if rows.is_empty() {
            p { "No schedules." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Name" } th scope="col" { "Makes" } th scope="col" { "Cron" }
                    th scope="col" { "Next fire" } th scope="col" { "Last fire" }
                    th scope="col" { "Lateness" } th scope="col" { "State" }
                } }
                tbody { @for row in &rows { (all_row(row)) } }
            }
            @if all > ALL_SHOWN {
                p { "Only the first " (ALL_SHOWN) " are shown: overdue ones, then by next fire." }
            }
        }
    };
    Ok(page(
        StatusCode::OK,
        live_layout("All schedules", Some(shown(&viewer)), Some(REFRESH), body),
    ))
}

/// One row of [`ALL_SQL`] as a table row.
fn all_row(row: &Row) -> Markup {
    let last_fire: Option<DateTime<Utc>> = row.get(7);
    let outcome: Option<&str> = row.get(8);
    let fired_at: Option<DateTime<Utc>> = row.get(9);
    let state = match (row.get::<_, bool>(5), row.get::<_, bool>(10)) {
        (true, _) => "paused",
        (false, true) => "overdue",
        (false, false) => "active",
    };
    html! {
        tr {
            td { (row.get::<_, &str>(0)) }
            td { code { (row.get::<_, &str>(1)) } " in " code { (row.get::<_, &str>(2)) } }
            td { code { (row.get::<_, &str>(3)) } " " (row.get::<_, &str>(4)) }
            td { (when::at(row.get(6))) }
            td {
                @match last_fire { Some(at) => (when::at(at)), None => "never" }
                @if let Some(outcome) = outcome { " (" (outcome) ")" }
            }
            td { @if let (Some(fired), Some(fire)) = (fired_at, last_fire) { (lateness(fired, fire)) } }
            td { (state) }
        }
    }
}

/// The form that pauses schedule `name` (or resumes it, when `paused`).
fn switch(name: &str, paused: bool, csrf: &str) -> Markup {
    let (action, label) = if paused {
        ("resume", "Resume")
    } else {
        ("pause", "Pause")
    };
    html! {
        form.inline method="post" action={ "/console/schedules/" (name) "/" (action) } {
            input type="hidden" name="csrf" value=(csrf);
            button type="submit" { (label) " " span.visually-hidden { (name) } }
        }
    }
}

/// Pauses one of the viewer's schedules, then shows the list.
pub(super) async fn pause(
    state: State<AppState>,
    headers: HeaderMap,
    name: Path<String>,
    form: Form<Token>,
) -> Result<Response, Problem> {
    change(state, headers, name, form, true).await
}

/// Resumes one of the viewer's schedules, then shows the list.
pub(super) async fn resume(
    state: State<AppState>,
    headers: HeaderMap,
    name: Path<String>,
    form: Form<Token>,
) -> Result<Response, Problem> {
    change(state, headers, name, form, false).await
}

/// Pauses (`pause`) or resumes schedule `name` for the viewer of a form with a valid token.
async fn change(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<Token>,
    pause: bool,
) -> Result<Response, Problem> {
    let (viewer, mut conn) = match form_viewer(&state, &headers, &form.csrf).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => return Ok(refused),
    };
    let schedules = Schedules::of(viewer.holder.owner_key);
    let found = conn
        .run(|c| async {
            if pause {
                schedules.pause(&*c, &name).await
            } else {
                schedules.resume(&*c, &name).await
            }
        })
        .await?;
    Ok(if found {
        Redirect::to("/console/schedules").into_response()
    } else {
        not_found(&viewer)
    })
}
