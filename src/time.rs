//! How the crate writes an instant: canonical UTC RFC 3339, the one form a status view, a
//! normalized request and a transformed timestamp all use.
//!
//! A leaf: it imports nothing of this crate, so the foundation (`jobs`) and the ETL job
//! (`etl::request`, `etl::transform`) can share it without importing each other.

use chrono::{DateTime, SecondsFormat, Utc};

/// An instant as canonical UTC RFC 3339 (`2026-01-02T03:04:05Z`, fractional seconds only if any).
pub(crate) fn canonical_utc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::canonical_utc;
    use chrono::{TimeZone, Utc};

    #[test]
    fn whole_seconds_drop_the_fraction_and_others_keep_their_digits() {
        let whole = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(canonical_utc(whole), "2026-01-02T03:04:05Z");
        let half = whole + chrono::Duration::milliseconds(500);
        assert_eq!(canonical_utc(half), "2026-01-02T03:04:05.500Z");
    }
}
