//! The console's pages, as compile-time checked `maud` templates.
//!
//! Invariants this module keeps:
//! - Every value is escaped by the template engine; nothing is inserted unescaped.
//! - Every instant is shown relative to now, with the absolute UTC instant kept in its `<time>`
//!   element ([`when`]).
//! - A page shows a job's id, status, times, attempt counts, stored failure code (with its meaning),
//!   its attempts' diagnoses (metadata: `diagnosis`) and ledger summary only: never a payload, a principal, an idempotency key, SQL or an error
//!   message, and never an API key (the sign-in form posts it in the body, and no page echoes it).
//! - Forms are labelled, headings go in order (one `h1` per page), and every page works without
//!   JavaScript (the live-refresh script only swaps in a fresh `main`).

use super::{diagnosis, when};
use crate::codes::Code;
use crate::dead_letters::Letter;
use crate::jobs::state::JobState;
use crate::jobs::{AttemptEnding, JobStatus, LastAttempt, PastAttempt};
use crate::service::api_keys::Role;
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

/// How often a job list refreshes itself, in seconds (with the live-refresh script).
const LIST_REFRESH: u32 = 5;

/// How often the page of a job still to run or running refreshes itself, in seconds.
const JOB_REFRESH: u32 = 2;

/// The page skeleton: title, stylesheet, live-refresh script, header (with navigation and
/// sign-out for a viewer) and `content`, with no live refresh.
pub(crate) fn layout(title: &str, viewer: Option<(Role, &str)>, content: Markup) -> Markup {
    live_layout(title, viewer, None, content)
}

/// [`layout`], refreshing its `main` every `refresh` seconds when given (the script reads
/// `data-refresh`; without the script the page is as it was served).
pub(super) fn live_layout(
    title: &str,
    viewer: Option<(Role, &str)>,
    refresh: Option<u32>,
    content: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · durable-etl" }
                link rel="stylesheet" href="/console/console.css";
                script src="/console/console.js" defer {}
            }
            body {
                header {
                    span.brand { "durable-etl" }
                    @if let Some((role, csrf)) = viewer {
                        nav aria-label="Console" {
                            a href="/console/jobs" { "Jobs" }
                            a href="/console/schedules" { "Schedules" }
                            a href="/console/dead-letters" { "Dead letters" }
                            @if role == Role::Operator {
                                a href="/console/operator" { "Operator" }
                                a href="/console/queues" { "Queues" }
                                a href="/console/operator/schedules" { "All schedules" }
                                a href="/console/operator/audit" { "Audit" }
                            }
                        }
                        form.inline method="post" action="/console/sign-out" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main data-refresh=[refresh] { (content) }
            }
        }
    }
}

/// What the sign-in form says above its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignInMessage {
    /// The key given was not accepted.
    Refused,
    /// The viewer's session ended (expired, signed out, its key revoked).
    Ended,
}

/// The sign-in page; `refused` after a key that was not accepted.
pub(crate) fn sign_in(csrf: &str, message: Option<SignInMessage>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @match message {
                Some(SignInMessage::Refused) => {
                    p.error role="alert" { "That key was not accepted. Check it and try again." }
                }
                Some(SignInMessage::Ended) => {
                    p.error role="alert" {
                        "Your session has ended (it expired after 30 minutes, was signed out, or its key was revoked). Sign in again."
                    }
                }
                None => {}
            }
            form method="post" action="/console/sign-in" {
                input type="hidden" name="csrf" value=(csrf);
                p {
                    label for="api_key" { "API key" }
                    input id="api_key" name="api_key" type="password" required
                          autocomplete="off" autofocus size="40";
                }
                button type="submit" { "Sign in" }
            }
            p { "Your key is exchanged for a session cookie of 30 minutes; it is never stored in the browser." }
        },
    )
}

/// The filters and paging position of the job list.
#[derive(Debug, Default)]
pub(crate) struct ListView<'a> {
    /// The status filter, if any.
    pub(crate) status: Option<JobState>,
    /// Only jobs submitted from this time, if given.
    pub(crate) from: Option<DateTime<Utc>>,
    /// Only jobs submitted before this time, if given.
    pub(crate) to: Option<DateTime<Utc>>,
    /// Whether a submission time given was not a time (the list is then not read).
    pub(crate) bad_time: bool,
    /// The jobs of the page, newest first.
    pub(crate) jobs: &'a [JobStatus],
    /// The id to page from for the next page, when there is one.
    pub(crate) next: Option<uuid::Uuid>,
}

/// The list's query for the page after job `next`, keeping the filters. Every part is an id, a
/// status or a formatted time: nothing needs escaping beyond what the template does.
fn next_page(view: &ListView<'_>, next: uuid::Uuid) -> String {
    let mut query = format!("/console/jobs?after={next}");
    if let Some(status) = view.status {
        query.push_str(&format!("&status={}", status.as_str()));
    }
    if let Some(from) = view.from {
        query.push_str(&format!("&from={}", when::field_time(from)));
    }
    if let Some(to) = view.to {
        query.push_str(&format!("&to={}", when::field_time(to)));
    }
    query
}

/// The owner's job list.
pub(crate) fn jobs(viewer: (Role, &str), view: &ListView<'_>) -> Markup {
    let filter = view.status.map(JobState::as_str);
    let from = view.from.map(when::field_time).unwrap_or_default();
    let to = view.to.map(when::field_time).unwrap_or_default();
    live_layout(
        "Jobs",
        Some(viewer),
        (!view.bad_time).then_some(LIST_REFRESH),
        html! {
            h1 { "Jobs" }
            form.filters method="get" action="/console/jobs" {
                div {
                    label for="status" { "Status" }
                    select id="status" name="status" {
                        option value="" selected[filter.is_none()] { "any" }
                        @for state in JobState::ALL {
                            option value=(state.as_str()) selected[filter == Some(state.as_str())] {
                                (state.as_str())
                            }
                        }
                    }
                }
                div {
                    label for="from" { "Submitted from (UTC)" }
                    input id="from" name="from" type="datetime-local" step="1" value=(from);
                }
                div {
                    label for="to" { "Submitted before (UTC)" }
                    input id="to" name="to" type="datetime-local" step="1" value=(to);
                }
                div {
                    label for="id" { "Job id" }
                    input id="id" name="id" type="text" size="38" pattern="[0-9a-fA-F-]{32,36}";
                }
                button type="submit" { "Show" }
            }
            @if view.bad_time {
                p.error role="alert" { "Write times as 2026-12-01T07:30 (UTC)." }
            } @else if view.jobs.is_empty() {
                p.empty { "No jobs match." }
            } @else {
                table {
                    thead { tr { th { "Job" } th { "Kind" } th { "Queue" } th { "Priority" } th { "Status" } th { "Attempts" } th { "Accepted" } th { "Finished" } } }
                    tbody {
                        @for job in view.jobs {
                            tr {
                                td { a.id href={ "/console/jobs/" (job.id) } { (job.id) } }
                                td { code { (job.kind) } }
                                td { code { (job.queue) } }
                                td { (job.priority) }
                                td { (status(job.status)) }
                                td { (job.attempts) " of " (job.max_attempts) }
                                td { (when::at_text(&job.created_at)) }
                                td { @if let Some(finished) = &job.finished_at { (when::at_text(finished)) } }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = view.next {
                p.pager {
                    a href=(next_page(view, next)) { "Older jobs" }
                }
            }
        },
    )
}

/// A status, styled by its kind.
pub(super) fn status(state: JobState) -> Markup {
    html! { span class={ "status status-" (state.as_str()) } { (state.as_str()) } }
}

/// What a stored failure code means, for the job page.
pub(crate) fn meaning(code: &str) -> &'static str {
    match Code::parse(code) {
        Some(Code::InvalidPayload) => "The job's request failed validation when it ran.",
        Some(Code::RecordInvalid) => {
            "A record could not be transformed; its index is shown, never its value."
        }
        Some(Code::AttemptsExhausted) => {
            "A transient failure recurred until every attempt was spent."
        }
        Some(Code::LeaseExpiredExhausted) => {
            "Its worker died or froze on the last permitted attempt."
        }
        Some(Code::HandlerPanicked) => "The handler panicked.",
        Some(Code::HandlerFailed) => "The handler reported a permanent failure.",
        Some(Code::ExecutionTimeout) => "The handler ran past the execution timeout.",
        Some(Code::TransientDatabase) => {
            "A transient database error, on the last permitted attempt."
        }
        Some(Code::Cancelled) => "Cancelled by its owner.",
        Some(Code::Replaced) => "Cancelled because its owner submitted a replacement.",
        Some(Code::UnknownKind) => "No replica knows how to run its kind.",
        _ => "See docs/retries-and-failure-codes.md.",
    }
}

/// What ended an attempt that did not end its job, and what came next, for the timeline.
fn ended(attempt: &PastAttempt) -> Markup {
    let (what, next) = match attempt.ending {
        AttemptEnding::Retried => ("failed transiently", "retry scheduled at"),
        AttemptEnding::Recovered => (
            "recovered after its lease expired or its replica stopped",
            "due again at",
        ),
        AttemptEnding::Released => (
            "released as its replica shut down (not charged)",
            "due again at",
        ),
    };
    html! {
        li { "Attempt " (attempt.attempt) " started " (when::at_text(&attempt.started_at)) }
        li {
            "Attempt " (attempt.attempt) " " (what) " " (when::at_text(&attempt.ended_at)) "; "
            (next) " " (when::at_text(&attempt.due_at))
            @if let Some(diagnosis) = &attempt.diagnosis { br; (diagnosis::line(diagnosis)) }
        }
    }
}

/// The job's timeline: accepted, each past attempt's start and end (with the retry's scheduled
/// time), the attempt its status shows (unless that is the last past one: a job waiting to retry
/// keeps its last attempt's start), when it is due while it waits, and when it finished.
fn timeline(job: &JobStatus, attempts: &[PastAttempt]) -> Markup {
    let last_past = attempts.last().map(|a| a.started_at.as_str());
    let current = job
        .started_at
        .as_deref()
        .filter(|started| Some(*started) != last_past);
    html! {
        ol.timeline {
            li { "Accepted " (when::at_text(&job.created_at)) }
            @for attempt in attempts { (ended(attempt)) }
            @if job.status == JobState::Pending {
                li { "Due " (when::at_text(&job.run_at)) }
            }
            @if let Some(started) = current {
                li { "Attempt " (job.attempts) " started " (when::at_text(started)) }
            }
            @if let Some(finished) = &job.finished_at {
                li { "Finished " (status(job.status)) " " (when::at_text(finished)) }
            }
        }
    }
}

/// What a job's page shows beside its status: its past attempts and its replacements.
#[derive(Debug)]
pub(crate) struct JobHistory<'a> {
    /// The attempts that did not end it, oldest first.
    pub(crate) attempts: &'a [PastAttempt],
    /// The attempt that ended it `failed`, with its diagnosis.
    pub(crate) last: Option<&'a LastAttempt>,
    /// The jobs submitted to replace it, oldest first.
    pub(crate) replaced_by: &'a [uuid::Uuid],
    /// Whether the viewer's cancel was just recorded while the job's commit held it (the page
    /// says that the job may still succeed).
    pub(crate) cancel_deferred: bool,
    /// The job's dead letter, when it ended `failed` and the letter was not discarded.
    pub(crate) letter: Option<&'a Letter>,
    /// Whether the job is the viewer's own owner's (an operator may open any owner's job: what
    /// its kind recorded is shown to its owner only).
    pub(crate) own: bool,
}

/// What the page of a job says after a cancel recorded while the job's commit held it.
pub(crate) const CANCEL_DEFERRED: &str = "Cancel recorded while the job was committing its \
     effects: it takes effect only if that commit does not end the job, which may still succeed.";

/// One job's page: its facts, its timeline, its outcome, and a Cancel button while it may be
/// cancelled.
pub(crate) fn job(viewer: (Role, &str), job: &JobStatus, history: &JobHistory<'_>) -> Markup {
    let csrf = viewer.1;
    live_layout(
        "Job",
        Some(viewer),
        job.is_active().then_some(JOB_REFRESH),
        html! {
            h1 { "Job " span.id { (job.id) } }
            @if history.cancel_deferred {
                p.notice role="status" { (CANCEL_DEFERRED) }
            }
            dl.facts {
                dt { "Status" } dd { (status(job.status)) @if job.cancel_requested { " (cancel requested)" } }
                dt { "Attempts" } dd { (job.attempts) " of " (job.max_attempts) }
                dt { "Kind" } dd { code { (job.kind) } }
                dt { "Queue" } dd { code { (job.queue) } " at priority " (job.priority) }
                @if let Some(replaced) = job.replaces {
                    dt { "Replaces" } dd { a.id href={ "/console/jobs/" (replaced) } { (replaced) } }
                }
                @for replacement in history.replaced_by {
                    dt { "Replaced by" } dd { a.id href={ "/console/jobs/" (replacement) } { (replacement) } }
                }
            }
            h2 { "Timeline" }
            (timeline(job, history.attempts))
            @if let Some(failure) = &job.failure {
                h2 { "Failure" }
                p {
                    code { (failure.code) } " — " (meaning(&failure.code))
                    @if let Some(index) = failure.record_index { " (record " (index) ")" }
                }
                @if let Some(last) = history.last {
                    p { "Attempt " (last.attempt) ": " (diagnosis::line(&last.diagnosis)) }
                }
            }
            @if let Some(letter) = history.letter {
                (letter_section(letter, csrf))
            }
            @if let (Some(result), true) = (&job.result, history.own) {
                h2 { "Result" }
                (recorded(result))
            }
            @if job.is_active() && !job.cancel_requested {
                form method="post" action={ "/console/jobs/" (job.id) "/cancel" } {
                    input type="hidden" name="csrf" value=(csrf);
                    button.danger type="submit" { "Cancel job…" }
                }
            }
        },
    )
}

/// What a confirmation's form sends to say that the viewer confirmed the action.
pub(crate) const CONFIRMED: &str = "yes";

/// A confirmation: what an action will do, and the form that does it.
#[derive(Debug)]
pub(crate) struct Confirm {
    /// The page's heading.
    pub(crate) title: String,
    /// What the action will do, with the counts read for it.
    pub(crate) what: Markup,
    /// Where the confirmed form posts.
    pub(crate) action: String,
    /// The form's hidden fields (besides the token), `confirm=yes` among them.
    pub(crate) fields: Vec<(&'static str, String)>,
    /// The confirming button's text.
    pub(crate) button: String,
    /// Whether the action destroys something (its button is styled so).
    pub(crate) danger: bool,
    /// Where "Go back" leads.
    pub(crate) back: String,
}

/// A confirmation page: what the action will do, a button that does it, and a way back.
pub(crate) fn confirm(viewer: (Role, &str), confirm: &Confirm) -> Markup {
    let csrf = viewer.1;
    layout(
        &confirm.title,
        Some(viewer),
        html! {
            h1 { (confirm.title) }
            (confirm.what)
            form method="post" action=(confirm.action) {
                input type="hidden" name="csrf" value=(csrf);
                @for (name, value) in &confirm.fields {
                    input type="hidden" name=(name) value=(value);
                }
                button #confirm type="submit" class=[confirm.danger.then_some("danger")] { (confirm.button) }
                " "
                a href=(confirm.back) { "Go back" }
            }
        },
    )
}

/// The confirmation of cancelling job `id`.
pub(crate) fn cancel_confirm(id: uuid::Uuid) -> Confirm {
    Confirm {
        title: "Cancel job".to_owned(),
        what: html! {
            p { "This will cancel job " span.id { (id) } ": a pending job ends cancelled; a running one is asked to stop, and its effects are not committed." }
        },
        action: format!("/console/jobs/{id}/cancel"),
        fields: vec![("confirm", CONFIRMED.to_owned())],
        button: "Cancel the job".to_owned(),
        danger: true,
        back: format!("/console/jobs/{id}"),
    }
}

/// The dead-letter section of a failed job's page: the letter's state and the forms that act on
/// it (with `csrf`), or where its replay went.
pub(crate) fn letter_section(letter: &Letter, csrf: &str) -> Markup {
    let id = letter.job_id;
    html! {
        h2 { "Dead letter" }
        @if let Some(made) = letter.replayed_job_id {
            p {
                "Replayed "
                @if let Some(at) = letter.replayed_at { (when::at(at)) " " }
                "as job " a.id href={ "/console/jobs/" (made) } { (made) } "."
            }
        } @else {
            @if letter.retained {
                p { "Its payload is retained (sealed), so it can be replayed as it is." }
                form.inline method="post" action={ "/console/dead-letters/" (id) "/replay" } {
                    input type="hidden" name="csrf" value=(csrf);
                    button type="submit" { "Replay…" }
                }
                " "
            } @else {
                p {
                    "Its payload was not retained: replay it by sending the job's request again through the API, "
                    code { "POST /v1/dead-letters/" (id) "/replay" } "."
                }
            }
            form.inline method="post" action={ "/console/dead-letters/" (id) "/discard" } {
                input type="hidden" name="csrf" value=(csrf);
                button.danger type="submit" { "Discard…" }
            }
        }
    }
}

/// A page for what is not there (or not the viewer's: the two look alike).
pub(crate) fn not_found(viewer: Option<(Role, &str)>) -> Markup {
    layout(
        "Not found",
        viewer,
        html! {
            h1 { "Not found" }
            p { "There is no such page, or no such job of yours." }
            p { a href="/console/jobs" { "Back to your jobs" } }
        },
    )
}

/// A page for a form that came without a valid token (expired, or sent from another site).
pub(crate) fn forbidden() -> Markup {
    layout(
        "Refused",
        None,
        html! {
            h1 { "Refused" }
            p { "This form was expired or did not come from the console. Go back, reload the page and try again." }
        },
    )
}

/// What a job's kind recorded (its `result`): each field of an object as a fact, in name order,
/// its name spaced (`rows_inserted` → "rows inserted"); any other document as compact JSON.
fn recorded(result: &serde_json::Value) -> Markup {
    match result.as_object() {
        Some(fields) => html! {
            dl.facts {
                @for (name, value) in fields {
                    dt { (name.replace('_', " ")) }
                    dd {
                        @match value {
                            serde_json::Value::String(text) => code { (text) },
                            other => (other.to_string()),
                        }
                    }
                }
            }
        },
        None => html! { p { code { (result.to_string()) } } },
    }
}
