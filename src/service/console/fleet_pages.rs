//! The operators' pages, as `maud` templates: the operator view, the queues, and the drill-downs
//! from a queue and from a failure code to the jobs behind them.
//!
//! Invariants this module keeps:
//! - Aggregates and job metadata only: a drill-down shows a job's id, kind, queue, priority,
//!   state, times, attempts and failure code (what [`drill::JobMeta`] holds), never a payload,
//!   an owner, a principal or an idempotency key. A job id links to the job's page, which an
//!   operator may open for any owner's job.
//! - A queue's page carries its controls (pause or resume, cap, key cap): forms with the
//!   session's token, posted to `queue_actions`.
//! - Every value is escaped by the template engine, and every link is built from a queue's name
//!   or a stored failure code, which are identifiers (`[a-z][a-z0-9_.]*`): nothing in a path
//!   needs escaping.
//! - Every instant is shown relative to now, keeping the absolute one ([`when`]).

use super::charts;
use super::drill::{self, JobMeta};
use super::operator::{LastHour, Minute, Overview};
use super::pages::{live_layout, meaning, status};
use super::when;
use crate::service::api_keys::Role;
use crate::service::cells::CellFigures;
use crate::service::metrics::{QueueDepth, QUEUES_SHOWN};
use maud::{html, Markup};

/// How often the operators' pages refresh themselves, in seconds.
const OPERATOR_REFRESH: u32 = 10;

/// A queue's cap and the permits held of it: `2 of 4 held (50%)`, or `none`.
fn cap_usage(queue: &QueueDepth) -> String {
    match queue.cap {
        Some(cap) => {
            let percent = queue.permits_held * 100 / i64::from(cap.max(1));
            format!("{} of {cap} held ({percent}%)", queue.permits_held)
        }
        None => "none".to_owned(),
    }
}

/// A queue's key cap and the key permits held: `4 per key, 3 held`, or `none`.
fn key_cap(queue: &QueueDepth) -> String {
    match queue.key_cap {
        Some(cap) => format!("{cap} per key, {} held", queue.key_permits_held),
        None => "none".to_owned(),
    }
}

/// The table of `queues`: each queue (linked to its jobs) with its jobs by state (and how many
/// due jobs no live replica serves), its oldest due job's age, its cap usage, its key cap and
/// whether it is paused.
fn queue_table(queues: &[QueueDepth]) -> Markup {
    html! {
        @if queues.is_empty() {
            p.empty { "No queue has a job or a setting." }
        } @else {
            table {
                thead { tr { th { "Queue" } th { "Due" } th { "Unserved" } th { "Deferred" } th { "Running" } th { "Oldest due" } th { "Cap" } th { "Key cap" } th { "State" } } }
                tbody {
                    @for queue in queues {
                        tr {
                            td { a href={ "/console/queues/" (queue.queue) } { code { (queue.queue) } } }
                            td { (queue.due) }
                            @if queue.unserved > 0 { td.unserved { (queue.unserved) } } @else { td { "0" } }
                            td { (queue.deferred) }
                            td { (queue.running) }
                            td { @if queue.due > 0 { (when::span(queue.oldest_due_seconds)) } @else { "none due" } }
                            td { (cap_usage(queue)) }
                            td { (key_cap(queue)) }
                            td { @if queue.paused { "paused" } @else { "served" } }
                        }
                    }
                }
            }
        }
    }
}

/// The table of jobs' metadata; `empty` when there is none.
fn job_table(jobs: &[JobMeta], empty: &str) -> Markup {
    html! {
        @if jobs.is_empty() {
            p.empty { (empty) }
        } @else {
            table {
                thead { tr { th { "Job" } th { "Kind" } th { "Queue" } th { "Priority" } th { "Status" } th { "Attempts" } th { "Accepted" } th { "Due" } th { "Started" } th { "Finished" } th { "Code" } } }
                tbody {
                    @for job in jobs {
                        tr {
                            td { a.id href={ "/console/jobs/" (job.id) } { (job.id) } }
                            td { code { (job.kind) } }
                            td { code { (job.queue) } }
                            td { (job.priority) }
                            td { (status(job.status)) @if job.deferred { " (deferred)" } }
                            td { (job.attempts) " of " (job.max_attempts) }
                            td { (when::at(job.created_at)) }
                            td { (when::at(job.run_at)) }
                            td { @if let Some(started) = job.started_at { (when::at(started)) } }
                            td { @if let Some(finished) = job.finished_at { (when::at(finished)) } }
                            td { @if let Some(code) = &job.failure_code { code { (code) } } }
                        }
                    }
                }
            }
        }
    }
}

/// The last hour's failures per minute, one series per code that failed a job in it.
fn by_code(hour: &LastHour) -> Vec<(String, Vec<f64>)> {
    if hour.failures.is_empty() {
        return vec![("failed".to_owned(), vec![0.0; hour.minutes.len()])];
    }
    hour.failures
        .keys()
        .map(|code| {
            let values = hour
                .minutes
                .iter()
                .map(|m| m.failed_by_code.get(code).copied().unwrap_or(0) as f64)
                .collect();
            (code.clone(), values)
        })
        .collect()
}

/// The most queues the charts by queue draw a line of: the busiest in the hour, the rest summed
/// as one line.
const QUEUE_LINES: usize = 5;

/// The last hour's jobs per minute by queue, `column` 0 for those that succeeded and 1 for those
/// that failed: a series per queue, the [`QUEUE_LINES`] with the most jobs ended in the hour
/// (then by name), and the others summed as `other queues`.
fn by_queue(hour: &LastHour, column: usize) -> Vec<(String, Vec<f64>)> {
    let mut volume: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    for minute in &hour.minutes {
        for (queue, counts) in &minute.by_queue {
            *volume.entry(queue.as_str()).or_insert(0) += counts.iter().sum::<i64>();
        }
    }
    let mut queues: Vec<(&str, i64)> = volume.into_iter().collect();
    queues.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<&str> = queues.iter().take(QUEUE_LINES).map(|q| q.0).collect();
    let count = |minute: &Minute, queue: &str| {
        minute
            .by_queue
            .get(queue)
            .map_or(0, |counts| counts[column]) as f64
    };
    let mut series: Vec<(String, Vec<f64>)> = shown
        .iter()
        .map(|queue| {
            let values = hour.minutes.iter().map(|m| count(m, queue)).collect();
            ((*queue).to_owned(), values)
        })
        .collect();
    if queues.len() > QUEUE_LINES {
        let others = hour.minutes.iter().map(|m| {
            let all: i64 = m.by_queue.values().map(|counts| counts[column]).sum();
            all as f64 - shown.iter().map(|queue| count(m, queue)).sum::<f64>()
        });
        series.push(("other queues".to_owned(), others.collect()));
    }
    if series.is_empty() {
        series.push(("all queues".to_owned(), vec![0.0; hour.minutes.len()]));
    }
    series
}

/// The last hour's pickup latency per minute, in milliseconds: p50 and p99 (`None` in a minute
/// nobody reported a pickup's bucket in), and the mean (`None` in a minute without a pickup).
fn pickup_latency(hour: &LastHour) -> Vec<(String, Vec<Option<f64>>)> {
    let of = |f: &dyn Fn(&Minute) -> Option<f64>| hour.minutes.iter().map(f).collect();
    vec![
        ("p50".to_owned(), of(&|m| m.pickup_percentile_ms(0.5))),
        ("p99".to_owned(), of(&|m| m.pickup_percentile_ms(0.99))),
        ("mean".to_owned(), of(&|m| m.mean_pickup_ms())),
    ]
}

/// The last hour's backlog per minute: due, deferred or waiting to retry, and running (`None`
/// in a minute without a backlog row).
fn backlog_levels(hour: &LastHour) -> Vec<(String, Vec<Option<f64>>)> {
    let states = ["due", "deferred or retrying", "running"];
    states
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let values = hour
                .backlog
                .iter()
                .map(|b| b.map(|b| [b.due, b.deferred, b.running][i] as f64))
                .collect();
            (name.to_owned(), values)
        })
        .collect()
}

/// The cells of an API serving a directory's: each with its openness, owners and active jobs, or
/// unreachable.
fn cell_table(cells: &[CellFigures]) -> Markup {
    html! {
        table {
            thead { tr { th { "Cell" } th { "New owners" } th { "Owners" } th { "Due" } th { "Deferred" } th { "Running" } th { "Oldest due" } } }
            tbody {
                @for figures in cells {
                    tr {
                        td { code { (figures.cell.name) } }
                        td { @if figures.cell.open { "placed here" } @else { "closed" } }
                        td { (figures.cell.owners) }
                        @if let Some(s) = &figures.sample {
                            td { (s.due) } td { (s.deferred) } td { (s.running) }
                            td { (format!("{:.1}", s.oldest_due_seconds)) " s" }
                        } @else {
                            td colspan="4" { "unreachable" }
                        }
                    }
                }
            }
        }
    }
}

/// The operator view: live replicas, the backlog, the queues, and the last hour's charts and
/// failures (each code linked to its jobs).
pub(crate) fn operator(viewer: (Role, &str), overview: &Overview) -> Markup {
    let hour = &overview.hour;
    let series = |f: fn(&Minute) -> f64| -> Vec<f64> { hour.minutes.iter().map(f).collect() };
    let backlog = &overview.backlog;
    live_layout(
        "Operator",
        Some(viewer),
        Some(OPERATOR_REFRESH),
        html! {
            h1 { "Operator" }
            h2 { "Replicas" }
            @if overview.replicas.is_empty() {
                p.empty { "No replica has reported in the last hour." }
            } @else {
                table {
                    thead { tr { th { "Owner id" } th { "Started" } th { "Last report" } th { "Jobs held" } th { "Claim rate" } } }
                    tbody {
                        @for replica in &overview.replicas {
                            tr {
                                td { code { (replica.owner_id) } }
                                td { (when::at(replica.started_at)) }
                                td { (when::span(replica.silent_for)) " ago" }
                                td { (replica.held) }
                                td { (format!("{:.1}", replica.claim_rate)) " jobs/s" }
                            }
                        }
                    }
                }
            }
            h2 { "Backlog" }
            dl.facts {
                dt { "Due" } dd { (backlog.due) }
                dt { "Deferred or waiting to retry" } dd { (backlog.deferred) }
                dt { "Running" } dd { (backlog.running) }
                dt { "Oldest due" } dd { (format!("{:.1}", backlog.oldest_due_seconds)) " s" }
            }
            @if let Some(cells) = &overview.cells {
                h2 { "Cells" }
                (cell_table(cells))
                p { "The rest of this page is your own cell's." }
            }
            h2 { "Queues" }
            (queue_table(&overview.queues))
            p { a href="/console/queues" { "All queues, with their jobs" } }
            h2 { "The last hour" }
            (charts::lines("Jobs succeeded per minute by queue", &by_queue(hour, 0), "jobs"))
            (charts::lines("Jobs failed per minute by queue", &by_queue(hour, 1), "jobs"))
            (charts::lines("Failures per minute by code", &by_code(hour), "jobs"))
            (charts::levels("Pickup latency per minute: p50 and p99 (bucket bounds) and mean", &pickup_latency(hour), "ms"))
            (charts::levels("Backlog per minute", &backlog_levels(hour), "jobs"))
            (charts::bars("Jobs recovered per minute", &series(|m| m.recovered as f64), "jobs"))
            h2 { "Failures by code" }
            @if hour.failures.is_empty() {
                p.empty { "No job failed in the last hour." }
            } @else {
                table {
                    thead { tr { th { "Code" } th { "Jobs" } th { "Meaning" } } }
                    tbody {
                        @for (code, n) in &hour.failures {
                            tr {
                                td { a href={ "/console/failures/" (code) } { code { (code) } } }
                                td { (n) }
                                td { (meaning(code)) }
                            }
                        }
                    }
                }
            }
            h2 { "Recoveries" }
            @if hour.recoveries.is_empty() {
                p.empty { "No job was recovered in the last hour." }
            } @else {
                table {
                    thead { tr { th { "Minute" } th { "Recovered by" } th { "Jobs" } } }
                    tbody {
                        @for event in &hour.recoveries {
                            tr {
                                td { (when::at(event.minute)) }
                                td { code { (event.owner_id) } }
                                td { (event.jobs) }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The queues page: every queue with live jobs or settings (the [`QUEUES_SHOWN`] deepest), and
/// whether more were left out.
pub(crate) fn queues(viewer: (Role, &str), queues: &[QueueDepth], more: bool) -> Markup {
    live_layout(
        "Queues",
        Some(viewer),
        Some(OPERATOR_REFRESH),
        html! {
            h1 { "Queues" }
            p { "Live jobs by state, cap usage and pause, per queue, the deepest first. A queue's name leads to its jobs." }
            (queue_table(queues))
            @if more {
                p { "Only the " (QUEUES_SHOWN) " deepest queues are shown." }
            }
        },
    )
}

/// A queue's controls, each a form with the session's token `csrf`: pause or resume, its cap
/// and its key cap (a number; empty lifts it). Every change is written to the audit log.
fn controls(queue: &QueueDepth, csrf: &str) -> Markup {
    let path = format!("/console/queues/{}", queue.queue);
    html! {
        h2 { "Controls" }
        p { "Each change applies at once, wakes the replicas, and is written to the audit log." }
        div.controls {
            form.inline method="post" action={ (path) (if queue.paused { "/resume" } else { "/pause" }) } {
                input type="hidden" name="csrf" value=(csrf);
                @if queue.paused {
                    button type="submit" { "Resume queue" }
                } @else {
                    button.danger type="submit" { "Pause queue" }
                }
            }
            (cap_form(&path, "cap", "Cap (running jobs; empty: none)", queue.cap, csrf))
            (cap_form(&path, "key-cap", "Key cap (per concurrency key; empty: none)", queue.key_cap, csrf))
        }
    }
}

/// A form of the queue at `path` that sets its `setting` (`cap` or `key-cap`, the control's
/// path), labelled `label`, now `now` (empty: none).
fn cap_form(path: &str, setting: &str, label: &str, now: Option<i32>, csrf: &str) -> Markup {
    let id = setting.replace('-', "_");
    html! {
        form.filters method="post" action={ (path) "/" (setting) } {
            input type="hidden" name="csrf" value=(csrf);
            div {
                label for=(id) { (label) }
                input id=(id) name="cap" type="number" min="1" max="10000"
                      value=(now.map(|c| c.to_string()).unwrap_or_default());
            }
            button type="submit" { "Set " (setting.replace('-', " ")) }
        }
    }
}

/// One queue's page: its figures and its live jobs (running, then pending by kind in claim
/// order, at most [`drill::JOBS_SHOWN`] of each).
pub(crate) fn queue(viewer: (Role, &str), queue: &QueueDepth, jobs: &[JobMeta]) -> Markup {
    live_layout(
        "Queue",
        Some(viewer),
        Some(OPERATOR_REFRESH),
        html! {
            h1 { "Queue " code { (queue.queue) } }
            (queue_table(std::slice::from_ref(queue)))
            (controls(queue, viewer.1))
            h2 { "Its jobs" }
            p {
                "Running jobs first, then pending ones by kind, in the order replicas claim them; at most "
                (drill::JOBS_SHOWN) " of each. Job metadata only."
            }
            (job_table(jobs, "No job of this queue is pending or running."))
        },
    )
}

/// A failure code's page: what it means and the newest jobs accepted in the last
/// [`drill::CODE_WINDOW`] that ended with it.
pub(crate) fn failure(viewer: (Role, &str), code: &str, jobs: &[JobMeta]) -> Markup {
    live_layout(
        "Failures",
        Some(viewer),
        Some(OPERATOR_REFRESH),
        html! {
            h1 { "Failures " code { (code) } }
            p { (meaning(code)) }
            p {
                "The newest " (drill::JOBS_SHOWN) " jobs accepted in the last "
                (drill::CODE_WINDOW.num_hours()) " hours that ended with this code. Job metadata only."
            }
            (job_table(jobs, &format!("No job accepted in the last {} hours ended with this code.", drill::CODE_WINDOW.num_hours())))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_usage_says_held_of_cap_or_none() {
        let mut queue = QueueDepth {
            permits_held: 3,
            cap: Some(4),
            ..QueueDepth::default()
        };
        assert_eq!(cap_usage(&queue), "3 of 4 held (75%)");
        queue.cap = None;
        assert_eq!(cap_usage(&queue), "none");
        assert_eq!(key_cap(&queue), "none");
        queue.key_cap = Some(2);
        queue.key_permits_held = 5;
        assert_eq!(key_cap(&queue), "2 per key, 5 held");
    }
}
