//! The dead-letter pages, as `maud` templates: the list with its filters, counts and bulk
//! actions, the confirmations of an action, and what a letter without a retained payload needs.
//!
//! Invariants this module keeps:
//! - A letter shows its job id (linked to the job's page), queue, kind, stable code (with its
//!   meaning), attempts, failure time and whether its payload is retained: never a payload, an
//!   owner, a principal or an error message.
//! - Every link and hidden field is built from a validated filter ([`Chosen::fields`]: names,
//!   identifiers, formatted times, an owner's digest in hex) or an id: nothing in a query needs
//!   escaping, and the template escapes every value anyway.
//! - An action's first form only previews it; its confirmation form says what it will do, with
//!   the count read for the preview, and carries `confirm=yes`.

use super::letter_forms::Chosen;
use super::pages::{layout, meaning, Confirm, CONFIRMED};
use super::when::{self, field_time};
use crate::dead_letters::{Letter, LetterCount, ReplayPreview};
use crate::service::api_keys::Role;
use crate::service::dead_letters::Bulk;
use maud::{html, Markup};
use uuid::Uuid;

/// What the action that led to the list did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// A bulk or one-letter replay: letters replayed, and matching letters it left.
    Replayed {
        /// Letters replayed.
        n: u64,
        /// Matching letters left open (no payload retained, or unreadable).
        left: u64,
    },
    /// A discard: letters discarded.
    Discarded {
        /// Letters discarded.
        n: u64,
    },
}

/// What the list page shows.
#[derive(Debug, Default)]
pub(crate) struct ListView<'a> {
    /// The filter.
    pub(crate) chosen: Chosen,
    /// The matching letters per queue and code.
    pub(crate) counts: &'a [LetterCount],
    /// A page of them, newest first.
    pub(crate) letters: &'a [Letter],
    /// The cursor of the next page, when older letters follow.
    pub(crate) next: Option<String>,
    /// What the action that led here did.
    pub(crate) done: Option<Done>,
    /// Whether a filter value was not one (nothing was read).
    pub(crate) bad_filter: bool,
    /// Whether the deployment can open retained payloads (a bulk replay is offered).
    pub(crate) can_replay: bool,
}

/// `n` with `one` or `many` after it: `1 letter`, `3 letters`.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The filter's hidden fields, for the bulk forms.
fn hidden(chosen: &Chosen) -> Markup {
    html! {
        @for (name, value) in chosen.fields() {
            input type="hidden" name=(name) value=(value);
        }
    }
}

/// The query of the page after `next`, keeping the filter.
fn next_page(chosen: &Chosen, next: &str) -> String {
    let query = chosen.query();
    if query.is_empty() {
        format!("/console/dead-letters?after={next}")
    } else {
        format!("/console/dead-letters?{query}&after={next}")
    }
}

/// The filter form (an operator's has an owner field, which the page answers with the owner's
/// digest, never echoing the principal).
fn filter_form(role: Role, chosen: &Chosen) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    html! {
        form.filters method="get" action="/console/dead-letters" {
            div {
                label for="queue" { "Queue" }
                input id="queue" name="queue" type="text" size="12" value=(value(&chosen.queue));
            }
            div {
                label for="kind" { "Kind" }
                input id="kind" name="kind" type="text" size="14" value=(value(&chosen.kind));
            }
            div {
                label for="code" { "Code" }
                input id="code" name="code" type="text" size="16" value=(value(&chosen.code));
            }
            div {
                label for="since" { "Failed from (UTC)" }
                input id="since" name="since" type="datetime-local" step="1"
                      value=(chosen.since.map(field_time).unwrap_or_default());
            }
            div {
                label for="until" { "Failed before (UTC)" }
                input id="until" name="until" type="datetime-local" step="1"
                      value=(chosen.until.map(field_time).unwrap_or_default());
            }
            @if role == Role::Operator {
                div {
                    label for="owner" { "Owner" }
                    input id="owner" name="owner" type="text" size="14" autocomplete="off";
                }
                @if let Some(owner) = chosen.owner {
                    input type="hidden" name="owner_key" value=(hex::encode(owner));
                }
            }
            button type="submit" { "Show" }
        }
        @if chosen.owner.is_some() {
            p.notice { "Showing one owner's letters. " a href="/console/dead-letters" { "Show every owner's" } }
        }
    }
}

/// The counts per queue and code, each pair linked to its letters.
fn count_table(counts: &[LetterCount]) -> Markup {
    let total: i64 = counts.iter().map(|c| c.count).sum();
    let total = u64::try_from(total).unwrap_or(0);
    html! {
        h2 { "Counts" }
        p { (counted(total, "open letter matches", "open letters match")) "." }
        @if !counts.is_empty() {
            table {
                thead { tr { th { "Queue" } th { "Code" } th { "Letters" } } }
                tbody {
                    @for count in counts {
                        tr {
                            td { code { (count.queue) } }
                            td { a href={ "/console/dead-letters?queue=" (count.queue) "&code=" (count.code) } { code { (count.code) } } }
                            td { (count.count) }
                        }
                    }
                }
            }
        }
    }
}

/// The table of a page of letters.
fn letter_table(letters: &[Letter]) -> Markup {
    html! {
        table {
            thead { tr { th { "Failed" } th { "Kind" } th { "Queue" } th { "Code" } th { "Attempts" } th { "Retained" } th { "Job" } } }
            tbody {
                @for letter in letters {
                    tr {
                        td { (when::at(letter.failed_at)) }
                        td { code { (letter.kind) } }
                        td { code { (letter.queue) } }
                        td { code title=(meaning(&letter.code)) { (letter.code) } }
                        td { (letter.attempts) }
                        td { @if letter.retained { "yes" } @else { "no" } }
                        td { a.id href={ "/console/jobs/" (letter.job_id) } { (letter.job_id) } }
                    }
                }
            }
        }
    }
}

/// What the action that led here did, in words.
fn done_notice(done: Done) -> Markup {
    html! {
        p.notice role="status" {
            @match done {
                Done::Replayed { n, left } => {
                    "Replayed " (counted(n, "letter", "letters")) "."
                    @if left > 0 {
                        " " (counted(left, "matching letter was", "matching letters were"))
                        " left open: no payload retained (replay each through the API with its request) or sealed under a key no longer held."
                    }
                }
                Done::Discarded { n } => { "Discarded " (counted(n, "letter", "letters")) "." }
            }
        }
    }
}

/// The dead-letter page.
pub(crate) fn letters(viewer: (Role, &str), view: &ListView<'_>) -> Markup {
    let (role, csrf) = viewer;
    let chosen = &view.chosen;
    layout(
        "Dead letters",
        Some(viewer),
        html! {
            h1 { "Dead letters" }
            p {
                "Jobs that ended failed, until replayed or discarded. "
                @if role == Role::Operator { "Every owner's letters." } @else { "Your letters." }
            }
            @if let Some(done) = view.done { (done_notice(done)) }
            (filter_form(role, chosen))
            @if view.bad_filter {
                p.error role="alert" {
                    "A filter is not valid: queues and kinds are names such as mail, codes such as handler_failed, times such as 2026-12-01T07:30 (UTC)."
                }
            } @else {
                (count_table(view.counts))
                h2 { "Letters" }
                @if view.letters.is_empty() {
                    p.empty { "No open letter matches." }
                } @else {
                    (letter_table(view.letters))
                    @if let Some(next) = &view.next {
                        p.pager { a href=(next_page(chosen, next)) { "Older letters" } }
                    }
                    h2 { "Every matching letter" }
                    p { "Each action first shows how many letters it takes, and asks to confirm." }
                    @if view.can_replay {
                        form.inline method="post" action="/console/dead-letters/replay" {
                            input type="hidden" name="csrf" value=(csrf);
                            (hidden(chosen))
                            button type="submit" { "Replay matching letters…" }
                        }
                        " "
                    }
                    form.inline method="post" action="/console/dead-letters/discard" {
                        input type="hidden" name="csrf" value=(csrf);
                        (hidden(chosen))
                        button.danger type="submit" { "Discard matching letters…" }
                    }
                }
            }
        },
    )
}

/// What a bulk action's first `POST` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preview {
    /// A replay: what it takes and leaves.
    Replay(ReplayPreview),
    /// A discard: how many letters match.
    Discard(i64),
}

/// The confirmation of a bulk action over `chosen`'s letters, which `back` lists.
pub(crate) fn bulk_confirm(chosen: &Chosen, preview: &Preview, back: &str) -> Confirm {
    let mut fields = chosen.fields();
    fields.push(("confirm", CONFIRMED.to_owned()));
    let filter = chosen.summary();
    match *preview {
        Preview::Replay(p) => Confirm {
            title: "Replay letters".to_owned(),
            what: html! {
                p { "This will replay " strong { (counted(p.replayable, "letter", "letters")) } " (" (filter) "): one new job each, from its retained payload." }
                @if p.not_retained + p.unreadable > 0 {
                    p { "It leaves " (counted(p.not_retained, "letter", "letters")) " with no payload retained (replay each through the API with its request) and "
                        (counted(p.unreadable, "letter", "letters")) " sealed under a key no longer held." }
                }
            },
            action: "/console/dead-letters/replay".to_owned(),
            fields,
            button: format!("Replay {}", counted(p.replayable, "letter", "letters")),
            danger: false,
            back: back.to_owned(),
        },
        Preview::Discard(n) => {
            let n = u64::try_from(n).unwrap_or(0);
            Confirm {
                title: "Discard letters".to_owned(),
                what: html! {
                    p { "This will discard " strong { (counted(n, "letter", "letters")) } " (" (filter) ") with their retained payloads. The jobs' outcomes stay; the letters cannot be replayed afterwards." }
                },
                action: "/console/dead-letters/discard".to_owned(),
                fields,
                button: format!("Discard {}", counted(n, "letter", "letters")),
                danger: true,
                back: back.to_owned(),
            }
        }
    }
}

/// The confirmation of `what` on one letter.
pub(crate) fn one_confirm(letter: &Letter, what: Bulk) -> Confirm {
    let id = letter.job_id;
    let fields = vec![("confirm", CONFIRMED.to_owned())];
    let facts = html! {
        dl.facts {
            dt { "Job" } dd { a.id href={ "/console/jobs/" (id) } { (id) } }
            dt { "Kind" } dd { code { (letter.kind) } }
            dt { "Queue" } dd { code { (letter.queue) } }
            dt { "Code" } dd { code { (letter.code) } " — " (meaning(&letter.code)) }
        }
    };
    match what {
        Bulk::Replay => Confirm {
            title: "Replay letter".to_owned(),
            what: html! {
                p { "This will make one new job of the same kind, queue and priority from the letter's retained payload." }
                (facts)
            },
            action: format!("/console/dead-letters/{id}/replay"),
            fields,
            button: "Replay 1 letter".to_owned(),
            danger: false,
            back: format!("/console/jobs/{id}"),
        },
        Bulk::Discard => Confirm {
            title: "Discard letter".to_owned(),
            what: html! {
                p { "This will discard the letter and any retained payload. The job's outcome stays; it cannot be replayed afterwards." }
                (facts)
            },
            action: format!("/console/dead-letters/{id}/discard"),
            fields,
            button: "Discard 1 letter".to_owned(),
            danger: true,
            back: format!("/console/jobs/{id}"),
        },
    }
}

/// What a letter whose payload is not retained (or no longer readable) needs to be replayed.
pub(crate) fn not_retained(viewer: (Role, &str), id: Uuid) -> Markup {
    layout(
        "Replay",
        Some(viewer),
        html! {
            h1 { "Replay through the API" }
            p { "This letter's payload was not retained (or was sealed under a key no longer held), so the console cannot replay it." }
            p { "Its owner replays it by sending the job's request again: " code { "POST /v1/dead-letters/" (id) "/replay" } " with the original body, which is accepted only if it is the job's request." }
            p { a href={ "/console/jobs/" (id) } { "Back to the job" } }
        },
    )
}
