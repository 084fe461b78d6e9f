//! Times as the console shows them: relative to now ("3 s ago", "in 2 min"), in a `<time>`
//! element that keeps the absolute instant.
//!
//! Invariants this module keeps:
//! - Every instant a page shows goes through [`at`] (or [`at_text`] for one already written as
//!   canonical UTC): a `<time>` whose `datetime` and `title` are the canonical UTC instant, so
//!   the absolute time stays one hover (or one screen reader query) away, and whose text is the
//!   relative time.
//! - The relative text rounds towards zero in the largest unit that fits (s, min, h, d); under a
//!   second it says "now". It is computed when the page is rendered: the live refresh renders it
//!   again.

use crate::time::canonical_utc;
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{html, Markup};

/// A span of `seconds` in the largest unit that fits, rounded towards zero: `3 s`, `2 min`,
/// `5 h`, `4 d`.
pub(super) fn span(seconds: f64) -> String {
    // Whole seconds: a fraction never changes what the text says.
    #[allow(clippy::cast_possible_truncation)]
    let s = seconds.abs().min(i64::MAX as f64) as i64;
    match s {
        0..60 => format!("{s} s"),
        60..3_600 => format!("{} min", s / 60),
        3_600..86_400 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `at` relative to `now`: `now` under a second away, else `3 s ago` or `in 2 min`.
pub(super) fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (now - at).num_milliseconds() as f64 / 1000.0;
    if seconds.abs() < 1.0 {
        "now".to_owned()
    } else if seconds > 0.0 {
        format!("{} ago", span(seconds))
    } else {
        format!("in {}", span(seconds))
    }
}

/// `at` as a `<time>` relative to `now`, with the canonical instant as its `datetime` and
/// `title`.
pub(super) fn at_from(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    let absolute = canonical_utc(at);
    html! { time datetime=(absolute) title=(absolute) { (relative(at, now)) } }
}

/// `at` as a `<time>` relative to the current time (see [`at_from`]).
pub(super) fn at(at: DateTime<Utc>) -> Markup {
    at_from(at, Utc::now())
}

/// An instant written as RFC 3339 (a status view's canonical UTC) as [`at`] shows it; text that
/// is not one is shown as it is.
pub(super) fn at_text(text: &str) -> Markup {
    match DateTime::parse_from_rfc3339(text) {
        Ok(parsed) => at(parsed.with_timezone(&Utc)),
        Err(_) => html! { (text) },
    }
}

/// A time as a `datetime-local` field shows it (UTC, to the second).
pub(super) fn field_time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// A `datetime-local` field's value, read as UTC: `None` when empty, `Err` when not a time.
pub(super) fn utc_field(value: &str) -> Result<Option<DateTime<Utc>>, ()> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(value, format).ok())
        .map(|at| Some(at.and_utc()))
        .ok_or(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T12:00:00Z plus `ms` milliseconds.
    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
            + chrono::Duration::milliseconds(ms)
    }

    #[test]
    fn a_relative_time_uses_the_largest_unit_that_fits_either_way() {
        let now = t(0);
        let cases = [
            (0, "now"),
            (-999, "now"),
            (999, "now"),
            (-3_400, "3 s ago"),
            (59_999, "in 59 s"),
            (-60_000, "1 min ago"),
            (150_000, "in 2 min"),
            (-3_600_000, "1 h ago"),
            (86_399_000, "in 23 h"),
            (-2 * 86_400_000, "2 d ago"),
        ];
        for (ms, text) in cases {
            assert_eq!(relative(t(ms), now), text, "{ms} ms");
        }
        assert_eq!(span(f64::MAX), format!("{} d", i64::MAX / 86_400));
    }

    #[test]
    fn a_time_element_keeps_the_absolute_instant() {
        let html = at_from(t(-5_000), t(0)).into_string();
        assert_eq!(
            html,
            "<time datetime=\"2026-12-01T11:59:55Z\" title=\"2026-12-01T11:59:55Z\">5 s ago</time>"
        );
        let text = at_text("2026-12-01T11:59:55.250Z").into_string();
        assert!(
            text.starts_with("<time datetime=\"2026-12-01T11:59:55.250Z\""),
            "{text}"
        );
        assert!(text.ends_with(" ago</time>"), "{text}");
        assert_eq!(at_text("not a time").into_string(), "not a time");
    }
}
