//! How the console shows an attempt's diagnosis (`job::diagnosis`): one line of metadata under
//! the attempt it explains.
//!
//! Invariants this module keeps:
//! - Only what the diagnosis holds is shown (the phase, the decision and its delay, the duration,
//!   the type names of the error chain with their enumerated facts, the kind's declared detail),
//!   every value escaped by the template engine; a diagnosis holds no message to show.

use crate::job::diagnosis::{Decision, ErrorLink};
use crate::job::Diagnosis;
use maud::{html, Markup};

/// `diagnosis` as one line: where the attempt failed, what came of it, how long it ran, the error
/// chain's types and the kind's detail.
pub(super) fn line(diagnosis: &Diagnosis) -> Markup {
    html! {
        span.diagnosis {
            "Failed in " (diagnosis.phase.as_str()) " after " (diagnosis.duration_ms) " ms; "
            @match (diagnosis.decision, diagnosis.delay_ms) {
                (Decision::Retry, Some(delay)) => { "retry in " (delay) " ms" },
                (Decision::Retry, None) => "retry",
                (Decision::Fail, _) => "no retry",
            }
            @if let Some(expired) = diagnosis.lease_expired {
                @if expired { "; its lease had expired" } @else { "; its replica was judged dead" }
            }
            @if !diagnosis.chain.is_empty() {
                "; error "
                @for (i, link) in diagnosis.chain.iter().enumerate() {
                    @if i > 0 { " ← " }
                    (error_link(link))
                }
                @if diagnosis.chain_cut { " ← …" }
            }
            @if let Some(detail) = &diagnosis.detail {
                "; detail "
                @for (i, (name, value)) in detail.iter().enumerate() {
                    @if i > 0 { ", " }
                    code { (name) "=" (value.to_string()) }
                }
            }
            @if let Some(dropped) = diagnosis.detail_dropped {
                " (" (dropped) " detail fields dropped)"
            }
        }
    }
}

/// One link of an error chain: its type, and its enumerated facts in parentheses.
fn error_link(link: &ErrorLink) -> Markup {
    let facts: Vec<&str> = [&link.io_kind, &link.sqlstate, &link.code, &link.json]
        .into_iter()
        .filter_map(|fact| fact.as_deref())
        .collect();
    html! {
        code { (link.type_name) }
        @if !facts.is_empty() { " (" (facts.join(", ")) ")" }
    }
}
