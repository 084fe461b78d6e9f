//! The fire instants of a recurrence: the daylight-saving rule on known days, the expression's
//! forms, what is refused, and the rule's property over every transition of 2000 to 2037 in a
//! sample of zones.

use super::*;

/// `rfc3339` as an instant.
fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
}

/// The fires of `cron` in `zone` strictly after `from` and up to `to`.
fn fires(cron: &str, zone: &str, from: &str, to: &str) -> Vec<DateTime<Utc>> {
    let recurrence = Recurrence::parse(cron, zone).unwrap();
    let (mut cursor, end) = (at(from), at(to));
    let mut out = Vec::new();
    while let Some(next) = recurrence.next_after(cursor).filter(|n| *n <= end) {
        out.push(next);
        cursor = next;
    }
    out
}

#[test]
fn a_new_york_1_30_fires_once_on_both_transition_days() {
    // 2024-03-10: 02:00 EST jumps to 03:00 EDT; 01:30 exists once (EST).
    assert_eq!(
        fires(
            "30 1 * * *",
            "America/New_York",
            "2024-03-09T12:00:00Z",
            "2024-03-11T12:00:00Z"
        ),
        [at("2024-03-10T06:30:00Z"), at("2024-03-11T05:30:00Z")]
    );
    // 2024-11-03: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice, fires at the first.
    assert_eq!(
        fires(
            "30 1 * * *",
            "America/New_York",
            "2024-11-02T12:00:00Z",
            "2024-11-04T12:00:00Z"
        ),
        [at("2024-11-03T05:30:00Z"), at("2024-11-04T06:30:00Z")]
    );
}

#[test]
fn a_slot_in_the_gap_fires_at_its_end_and_a_repeated_hour_fires_once() {
    // 02:30 does not exist on 2024-03-10 in New York: it fires at 03:00 EDT (07:00Z).
    assert_eq!(
        fires(
            "30 2 * * *",
            "America/New_York",
            "2024-03-09T12:00:00Z",
            "2024-03-11T12:00:00Z"
        ),
        [at("2024-03-10T07:00:00Z"), at("2024-03-11T06:30:00Z")]
    );
    // Every half hour through the gap: 02:00 and 02:30 both land on 03:00 EDT, one fire, and
    // 03:00 itself is that same instant.
    assert_eq!(
        fires(
            "*/30 * * * *",
            "America/New_York",
            "2024-03-10T06:00:00Z",
            "2024-03-10T08:00:00Z"
        ),
        [
            at("2024-03-10T06:30:00Z"),
            at("2024-03-10T07:00:00Z"),
            at("2024-03-10T07:30:00Z"),
            at("2024-03-10T08:00:00Z"),
        ]
    );
    // Hourly through the fall back: 01:00 fires at its first pass only, then 02:00 EST.
    assert_eq!(
        fires(
            "0 * * * *",
            "America/New_York",
            "2024-11-03T04:00:00Z",
            "2024-11-03T08:00:00Z"
        ),
        [
            at("2024-11-03T05:00:00Z"),
            at("2024-11-03T07:00:00Z"),
            at("2024-11-03T08:00:00Z"),
        ]
    );
}

#[test]
fn aliases_seconds_and_the_zone_name_are_read() {
    assert_eq!(
        fires(
            "@hourly",
            "UTC",
            "2024-01-01T00:00:00Z",
            "2024-01-01T02:00:00Z"
        ),
        [at("2024-01-01T01:00:00Z"), at("2024-01-01T02:00:00Z")]
    );
    assert_eq!(
        fires(
            "*/20 * * * * *",
            "Asia/Kolkata",
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:01:00Z"
        ),
        [
            at("2024-01-01T00:00:20Z"),
            at("2024-01-01T00:00:40Z"),
            at("2024-01-01T00:01:00Z"),
        ]
    );
    assert_eq!(
        Recurrence::parse("0 9 * * MON-FRI", "Europe/London")
            .unwrap()
            .zone(),
        "Europe/London"
    );
}

#[test]
fn a_bad_expression_an_unknown_zone_and_a_schedule_that_never_fires_are_refused() {
    let refused = |cron: &str, zone: &str| Recurrence::parse(cron, zone).unwrap_err();
    assert_eq!(refused("", "UTC"), RecurrenceError::Cron);
    assert_eq!(refused("61 * * * *", "UTC"), RecurrenceError::Cron);
    assert_eq!(refused("* * * *", "UTC"), RecurrenceError::Cron);
    assert_eq!(refused("0 0 1 1 * 2030", "UTC"), RecurrenceError::Cron);
    assert_eq!(refused(&"* ".repeat(200), "UTC"), RecurrenceError::Cron);
    assert_eq!(
        refused("* * * * *", "Mars/Olympus"),
        RecurrenceError::TimeZone
    );
    assert_eq!(refused("0 0 30 2 *", "UTC"), RecurrenceError::Never);
}

/// The zones the property is checked in: two with DST, one whose shift is 30 minutes, one with
/// none, and two that changed their standard offset (Moscow in 2011 and 2014, Caracas in 2007
/// and 2016).
const ZONES: &[&str] = &[
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Europe/Moscow",
    "America/Caracas",
];

/// The daily slots checked around each transition (hour, minute): every quarter hour of the
/// two hours before and after it, local time.
fn slots_around(local: NaiveDateTime) -> Vec<(u32, u32)> {
    (-8..=8)
        .map(|q| local + Duration::minutes(15 * q))
        .map(|t| (t.hour(), t.minute() - t.minute() % 15))
        .collect()
}

/// Every instant zone `zone`'s UTC offset changes at, 2000 to 2037 (found hour by hour, then to
/// the minute).
fn transitions(zone: Tz) -> Vec<DateTime<Utc>> {
    let offset = |t: DateTime<Utc>| t.with_timezone(&zone).naive_local() - t.naive_utc();
    let mut out = Vec::new();
    let mut t = at("2000-01-01T00:00:00Z");
    let end = at("2037-12-31T00:00:00Z");
    while t < end {
        let next = t + Duration::hours(1);
        if offset(t) != offset(next) {
            let minute = (1..=60)
                .map(|m| t + Duration::minutes(m))
                .find(|m| offset(*m) == offset(next))
                .unwrap_or(next);
            out.push(minute);
        }
        t = next;
    }
    out
}

/// The property: on every transition day of every sample zone, each daily slot near the
/// transition fires exactly once in the two local days around it, at the instant the rule says
/// (itself, its first occurrence, or its gap's end), and the fires never go back.
#[test]
fn every_transition_from_2000_to_2037_fires_each_slot_exactly_once() {
    let mut checked = 0;
    for name in ZONES {
        let zone: Tz = name.parse().unwrap();
        let found = transitions(zone);
        assert_eq!(
            found.is_empty(),
            *name == "Asia/Kolkata",
            "{name}: {found:?}"
        );
        for transition in found {
            let local = transition.with_timezone(&zone).naive_local();
            let from = transition - Duration::hours(26);
            let to = transition + Duration::hours(26);
            for (hour, minute) in slots_around(local) {
                let cron = format!("{minute} {hour} * * *");
                let recurrence = Recurrence::parse(&cron, name).unwrap();
                let got = fires(&cron, name, &from.to_rfc3339(), &to.to_rfc3339());
                assert!(
                    got.windows(2).all(|w| w[0] < w[1]),
                    "{name} {cron}: {got:?}"
                );
                // What the rule says, day by day: each local date in the window, its slot.
                let mut expected = Vec::new();
                let mut date = from.with_timezone(&zone).date_naive() - Duration::days(1);
                while date <= to.with_timezone(&zone).date_naive() + Duration::days(1) {
                    let slot = date.and_hms_opt(hour, minute, 0).unwrap();
                    let instant = match zone.from_local_datetime(&slot) {
                        LocalResult::Single(t) => t.with_timezone(&Utc),
                        LocalResult::Ambiguous(first, _) => first.with_timezone(&Utc),
                        LocalResult::None => {
                            let end = recurrence.gap_end(slot).unwrap();
                            assert_eq!(
                                end, transition,
                                "{name} {cron}: a gap ends where it starts"
                            );
                            end
                        }
                    };
                    if instant > from && instant <= to {
                        expected.push(instant);
                    }
                    date += Duration::days(1);
                }
                expected.dedup();
                assert_eq!(got, expected, "{name} {cron} around {transition}");
                assert!(
                    (1..=3).contains(&got.len()),
                    "{name} {cron}: never zero, never two a day: {got:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 3_000, "{checked} slots checked");
}
