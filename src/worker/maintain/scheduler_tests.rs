//! What one evaluation of a schedule does under each policy, off the database.

use super::*;

/// `rfc3339` as an instant.
fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
}

/// Every minute, in UTC.
fn minutely() -> Recurrence {
    Recurrence::parse("* * * * *", "UTC").unwrap()
}

#[test]
fn an_on_time_fire_makes_one_job_and_the_next_is_the_following_minute() {
    let plan = plan(
        &minutely(),
        at("2030-01-01T00:10:00Z"),
        at("2030-01-01T00:10:00.050Z"),
        (Missed::Coalesce, Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!(plan.enqueue, [at("2030-01-01T00:10:00Z")]);
    assert_eq!(plan.next, at("2030-01-01T00:11:00Z"));
    assert_eq!(
        (plan.last, plan.without_job, plan.recorded),
        (at("2030-01-01T00:10:00Z"), 0, None)
    );
}

#[test]
fn missed_fires_coalesce_catch_up_within_their_bound_or_are_skipped() {
    let (due, now) = (at("2030-01-01T00:00:00Z"), at("2030-01-01T00:09:30Z"));
    let coalesced = plan(
        &minutely(),
        due,
        now,
        (Missed::Coalesce, Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!(coalesced.enqueue, [at("2030-01-01T00:09:00Z")]);
    assert_eq!(
        (coalesced.without_job, coalesced.next),
        (9, at("2030-01-01T00:10:00Z"))
    );

    let caught_up = plan(
        &minutely(),
        due,
        now,
        (Missed::CatchUp(3), Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!(
        caught_up.enqueue,
        [
            at("2030-01-01T00:07:00Z"),
            at("2030-01-01T00:08:00Z"),
            at("2030-01-01T00:09:00Z")
        ]
    );
    assert_eq!(caught_up.without_job, 7);
    let all = plan(
        &minutely(),
        due,
        now,
        (Missed::CatchUp(1000), Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!((all.enqueue.len(), all.without_job), (10, 0));

    let skipped = plan(&minutely(), due, now, (Missed::Skip, Overlap::Allow, false)).unwrap();
    assert!(skipped.enqueue.is_empty());
    assert_eq!(
        skipped.recorded,
        Some((at("2030-01-01T00:09:00Z"), "missed"))
    );
    assert_eq!(skipped.without_job, 10);
    // Under skip, a fire within the grace still runs.
    let on_time = plan(
        &minutely(),
        at("2030-01-01T00:09:00Z"),
        at("2030-01-01T00:09:04Z"),
        (Missed::Skip, Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!(on_time.enqueue, [at("2030-01-01T00:09:00Z")]);
}

#[test]
fn an_overlapping_fire_makes_no_job_and_a_catch_up_makes_one_under_overlap_skip() {
    let (due, now) = (at("2030-01-01T00:00:00Z"), at("2030-01-01T00:02:00Z"));
    let overlapped = plan(
        &minutely(),
        due,
        now,
        (Missed::Coalesce, Overlap::Skip, true),
    )
    .unwrap();
    assert!(overlapped.enqueue.is_empty());
    assert_eq!(
        overlapped.recorded,
        Some((at("2030-01-01T00:02:00Z"), "overlapped"))
    );
    let one = plan(
        &minutely(),
        due,
        now,
        (Missed::CatchUp(5), Overlap::Skip, false),
    )
    .unwrap();
    assert_eq!(one.enqueue, [at("2030-01-01T00:02:00Z")]);
    assert_eq!(one.without_job, 2);
    // Allowed overlap: the live job changes nothing.
    let allowed = plan(
        &minutely(),
        due,
        now,
        (Missed::CatchUp(5), Overlap::Allow, true),
    )
    .unwrap();
    assert_eq!(allowed.enqueue.len(), 3);
}

#[test]
fn a_long_stretch_of_missed_fires_is_walked_only_so_far() {
    let every_second = Recurrence::parse("* * * * * *", "UTC").unwrap();
    let due = at("2030-01-01T00:00:00Z");
    let now = due + chrono::Duration::days(30);
    let plan = plan(
        &every_second,
        due,
        now,
        (Missed::Coalesce, Overlap::Allow, false),
    )
    .unwrap();
    assert_eq!(plan.next, now + chrono::Duration::seconds(1));
    assert_eq!(plan.enqueue.len(), 1);
    assert_eq!(plan.without_job as usize, WALK_AT_MOST - 1);
}
