//! When a schedule fires: its cron expression read in its IANA time zone, with a written rule
//! for the local times daylight-saving time removes or repeats.
//!
//! Invariants this module keeps:
//! - Fires are local slots: the expression is matched against the zone's wall clock (never
//!   against UTC or a fixed offset), so `30 1 * * *` is 01:30 local every day.
//! - A slot that does not exist (spring forward) fires once, at the first instant after the gap;
//!   several slots in one gap share that instant, so they make one fire.
//! - A slot that happens twice (fall back) fires once, at its first occurrence; the repeated
//!   hour's second pass fires nothing.
//! - [`Recurrence::next_after`] is strictly increasing: it never returns an instant at or before
//!   the one it was given, so iterating it never fires one slot twice.
//!
//! The expression is parsed by `croner` (5 or 6 fields, seconds first when 6; `@hourly`-style
//! aliases; `L`, `W`, `#`), the zones are `chrono-tz`'s compiled-in tzdata; the mapping of local
//! slots to instants is this module's own, so the rule above holds whatever either crate does
//! with a gap or an overlap.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// The longest a cron expression may be, in bytes (the schema's bound).
pub const CRON_MAX: usize = 255;

/// Why an expression or a zone was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecurrenceError {
    /// The cron expression is empty, too long, or not one `croner` reads as 5 or 6 fields.
    #[error("cron expression invalid")]
    Cron,
    /// The time zone is not an IANA zone name.
    #[error("time zone unknown")]
    TimeZone,
    /// The expression matches no instant in the years a timestamp holds (`0 0 30 2 *`).
    #[error("cron expression never fires")]
    Never,
}

/// A cron expression in a time zone: the fire instants of a schedule.
#[derive(Debug, Clone)]
pub struct Recurrence {
    /// The parsed expression, matched against the zone's wall clock.
    cron: Cron,
    /// The zone whose wall clock it reads.
    zone: Tz,
}

/// How many slots [`Recurrence::next_after`] looks at before it gives up: a slot can fail to be
/// after the instant asked about only by being the second pass of a repeated hour or a gap's
/// end at that instant, so a handful suffices.
const SLOTS_TRIED: usize = 16;

/// How far past a missing slot its gap's end is looked for (the longest gap in tzdata is a day:
/// a zone that skipped a date).
const GAP_SEARCH_MINUTES: i64 = 26 * 60;

impl Recurrence {
    /// Reads `cron` (5 or 6 fields, or an alias such as `@hourly`) in the IANA zone `zone`.
    ///
    /// # Errors
    /// [`RecurrenceError::Cron`], [`RecurrenceError::TimeZone`], or [`RecurrenceError::Never`]
    /// for an expression with no fire.
    pub fn parse(cron: &str, zone: &str) -> Result<Recurrence, RecurrenceError> {
        if cron.trim().is_empty() || cron.len() > CRON_MAX {
            return Err(RecurrenceError::Cron);
        }
        let zone: Tz = zone.parse().map_err(|_| RecurrenceError::TimeZone)?;
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|_| RecurrenceError::Cron)?;
        let recurrence = Recurrence { cron: parsed, zone };
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        recurrence
            .next_after(epoch)
            .map(|_| recurrence)
            .ok_or(RecurrenceError::Never)
    }

    /// The zone's name.
    pub fn zone(&self) -> &'static str {
        self.zone.name()
    }

    /// The first fire strictly after `after`, or `None` if there is none a timestamp can hold.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut cursor = after.with_timezone(&self.zone).naive_local();
        for _ in 0..SLOTS_TRIED {
            let slot = self.next_slot(cursor)?;
            if let Some(instant) = self.instant_of(slot) {
                if instant > after {
                    return Some(instant);
                }
            }
            cursor = slot;
        }
        None
    }

    /// The first local slot of the expression strictly after local time `local`.
    fn next_slot(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        // The wall clock read as UTC: no gap, no repeat, every slot once.
        let wall = Utc.from_utc_datetime(&local);
        self.cron
            .find_next_occurrence(&wall, false)
            .ok()
            .map(|next| next.naive_utc())
    }

    /// The instant local slot `slot` fires at: itself; its first occurrence if it happens
    /// twice; the end of its gap if it does not exist.
    fn instant_of(&self, slot: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.zone.from_local_datetime(&slot) {
            LocalResult::Single(at) => Some(at.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
            LocalResult::None => self.gap_end(slot),
        }
    }

    /// The first instant after the gap local time `missing` falls in: gaps end on a whole
    /// minute, so the first whole minute after `missing` that exists is that instant.
    fn gap_end(&self, missing: NaiveDateTime) -> Option<DateTime<Utc>> {
        let minute = missing.with_second(0)?.with_nanosecond(0)?;
        (1..=GAP_SEARCH_MINUTES).find_map(|m| {
            self.zone
                .from_local_datetime(&(minute + Duration::minutes(m)))
                .earliest()
                .map(|at| at.with_timezone(&Utc))
        })
    }
}

#[cfg(test)]
#[path = "recurrence_tests.rs"]
mod tests;
