//! The operators' audit page (`/console/operator/audit`): the newest entries of the audit log
//! ([`crate::service::audit`]), each with where it came from (the console or the API).
//!
//! Invariants this module keeps:
//! - The page is for operator keys only ([`OperatorViewer`]) and shows at most
//!   [`SHOWN`] entries, read along the primary key however long the log.
//! - It shows what the log keeps and nothing more: a key's id, never an owner.

use super::access::{page, OperatorViewer};
use super::pages::layout;
use super::when;
use crate::service::api_keys::Role;
use crate::service::audit::{newest, Entry, SHOWN};
use crate::service::problem::Problem;
use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use uuid::Uuid;

/// The operators' audit page: the newest entries.
pub(super) async fn audit_page(
    OperatorViewer(viewer, mut conn): OperatorViewer,
) -> Result<Response, Problem> {
    let entries = conn.run(|c| newest(&*c)).await?;
    Ok(page(
        StatusCode::OK,
        audit(super::access::shown(&viewer), &entries),
    ))
}

/// The audit page's markup.
fn audit(viewer: (Role, &str), entries: &[Entry]) -> Markup {
    layout(
        "Audit",
        Some(viewer),
        html! {
            h1 { "Audit" }
            p { "The newest " (SHOWN) " operator actions, taken from the console or the API: who (the key's id), from where, what, on what, how many, when." }
            @if entries.is_empty() {
                p.empty { "No operator action has been taken." }
            } @else {
                table {
                    thead { tr { th { "When" } th { "Key" } th { "Source" } th { "Action" } th { "Target" } th { "How many" } } }
                    tbody {
                        @for entry in entries {
                            tr {
                                td { (when::at(entry.at)) }
                                td { span.id { (entry.key_id) } }
                                td { (entry.source) }
                                td { code { (entry.action) } }
                                td {
                                    @match Uuid::parse_str(&entry.target) {
                                        Ok(job) => a.id href={ "/console/jobs/" (job) } { (job) },
                                        Err(_) => code { (entry.target) },
                                    }
                                }
                                td { (entry.affected) }
                            }
                        }
                    }
                }
            }
        },
    )
}
