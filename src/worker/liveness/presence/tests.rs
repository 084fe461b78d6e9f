//! The presence state machine's transitions, without a database.
use super::{Change, Presence, State, Ticket, SETTLE_BACKOFF_MAX};
use crate::error::Error;
use crate::worker::stats::{ClaimReason, WorkerStats};
use std::time::Duration;
use tokio::time::Instant;

/// The queues the test replicas serve.
const QUEUES: [&str; 2] = ["mail", "bulk"];

/// `names` as owned strings.
fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// A listening replica serving [`QUEUES`], polling every second.
fn presence() -> Presence {
    Presence::new(true, names(&QUEUES), Duration::from_secs(1))
}

/// Tries that found the barriers of `held` taken.
fn held(held: &[&str]) -> Result<Vec<String>, Error> {
    Ok(names(held))
}

/// A failed presence statement.
fn failed() -> Result<Vec<String>, Error> {
    Err(Error::Unavailable(None))
}

/// Sends `p`'s next claim at `now` after a short claim, answered with `answer`; returns the
/// ticket it carried and whether `p` claims again at once.
fn claim(
    p: &mut Presence,
    answer: Result<Vec<String>, Error>,
    now: Instant,
    stats: &WorkerStats,
) -> (Ticket, bool) {
    let ticket = p.ticket(false, now);
    let again = p.after(&ticket, Some(&answer), &names(&QUEUES), false, now, stats);
    (ticket, again)
}

/// Takes the answer of `ticket`'s claim, after a short claim that asked `asked`, its tries all
/// successful.
fn tried(p: &mut Presence, ticket: &Ticket, asked: &[String], now: Instant, stats: &WorkerStats) {
    p.after(ticket, Some(&held(&[])), asked, false, now, stats);
}

#[test]
fn a_listening_replica_registers_on_its_first_claim_settling_every_served_queue() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    assert!(p.registered() && p.state == State::Joining);
    let (ticket, again) = claim(&mut p, held(&[]), now, &stats);
    assert_eq!(
        (ticket.change, again),
        (Some(Change::Register(names(&QUEUES))), false)
    );
    assert_eq!((p.state, stats.snapshot().waits), (State::Waiting, 1));
    // Waiting and settled: claims carry nothing until a poll interval after the last refresh.
    assert_eq!(
        p.ticket(false, now + Duration::from_millis(999)).change,
        None
    );
    let due = now + Duration::from_secs(1);
    assert_eq!(
        p.ticket(false, due).change,
        Some(Change::Register(names(&QUEUES)))
    );
}

#[test]
fn a_held_barrier_is_tried_again_alone_at_doubling_intervals_up_to_the_cap() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, held(&["bulk"]), now, &stats);
    assert_eq!(p.state, State::Waiting, "the row is there: wakes name it");
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
    // Only the held queue is tried again.
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["bulk"])))
    );
    p.retrying();
    assert_eq!(p.retry_at(), None);
    let presence = ClaimReason::Presence;
    for pause in [2, 4, 8, 16, 32, 32] {
        // The tries go alone while the pauses are short; once one reached the cap, each retry
        // claims too (a job another enqueue committed meanwhile waits no longer).
        let alone = super::retry_alone(presence, &p.ticket(false, now));
        assert_eq!(alone, pause <= 16, "the retry after a pause of {pause} ms");
        claim(&mut p, held(&["bulk"]), now, &stats);
        assert_eq!(p.retry_at(), Some(now + Duration::from_millis(pause)));
    }
    assert!(!super::retry_alone(presence, &p.ticket(false, now)));
    assert!(
        !super::retry_alone(ClaimReason::Notify, &p.ticket(false, now)),
        "only a retry goes alone"
    );
    assert_eq!(p.backoff, SETTLE_BACKOFF_MAX);
    claim(&mut p, held(&[]), now, &stats);
    assert_eq!((p.ticket(false, now).change, p.retry_at()), (None, None));
    assert_eq!(p.backoff, super::FIRST_BACKOFF);
    let counted = stats.snapshot();
    assert_eq!((counted.barrier_held, counted.waits), (7, 1));
}

#[test]
fn an_opened_queue_is_settled_by_a_registered_replica_only_when_it_serves_it() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, held(&[]), now, &stats);
    p.opened(["mail", "other", "mail"]);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["mail"])))
    );
    // A try of mail that comes back while bulk was opened meanwhile keeps bulk owed.
    let ticket = p.ticket(false, now);
    p.opened(["bulk"]);
    tried(&mut p, &ticket, &names(&QUEUES), now, &stats);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["bulk"])))
    );
    // A busy replica settles nothing: it claims again as its jobs end.
    let park = p.ticket(true, now);
    assert_eq!(park.change, Some(Change::Park));
    p.after(&park, Some(&held(&[])), &names(&QUEUES), true, now, &stats);
    p.opened(["mail"]);
    assert_eq!((p.state, p.ticket(true, now).change), (State::Busy, None));
}

#[test]
fn a_queue_opened_while_its_try_is_in_flight_stays_owed_after_the_try_succeeds() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    // Registering: its tries are in flight when a resume of mail is heard.
    let registering = p.ticket(false, now);
    p.opened(["mail"]);
    tried(&mut p, &registering, &names(&QUEUES), now, &stats);
    assert_eq!(p.state, State::Waiting);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["mail"]))),
        "the try sent before the resume settles nothing of it"
    );
    // Waiting: a try of mail in flight, and mail opened again meanwhile.
    let trying = p.ticket(false, now);
    p.opened(["mail"]);
    tried(&mut p, &trying, &names(&QUEUES), now, &stats);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["mail"])))
    );
    // The try sent after the last opening settles it.
    claim(&mut p, held(&[]), now, &stats);
    assert_eq!(p.ticket(false, now).change, None);
}

#[test]
fn a_failed_registration_is_retried_and_a_failed_try_stays_owed() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, failed(), now, &stats);
    assert_eq!(p.state, State::Joining);
    assert!(p.retry_at().is_some());
    // Not sent (the claim failed first): the same.
    let ticket = p.ticket(false, now);
    p.after(&ticket, None, &names(&QUEUES), false, now, &stats);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Register(names(&QUEUES)))
    );
    claim(&mut p, held(&["mail"]), now, &stats);
    let (ticket, _) = claim(&mut p, failed(), now, &stats);
    assert_eq!(ticket.change, Some(Change::Settle(names(&["mail"]))));
    assert!(p.retry_at().is_some());
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["mail"])))
    );
    // A failed refresh keeps the replica waiting; the refresh is still due.
    claim(&mut p, held(&[]), now, &stats);
    let due = now + Duration::from_secs(1);
    let ticket = p.ticket(false, due);
    p.after(
        &ticket,
        Some(&failed()),
        &names(&QUEUES),
        false,
        due,
        &stats,
    );
    assert_eq!(p.state, State::Waiting);
    assert_eq!(
        p.ticket(false, due).change,
        Some(Change::Register(names(&QUEUES)))
    );
    assert_eq!(stats.snapshot().presence_failures, 3);
}

#[test]
fn a_full_claim_makes_a_registered_replica_park_on_its_next_claim() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, held(&["mail"]), now, &stats);
    let ticket = p.ticket(true, now);
    assert_eq!(ticket.change, Some(Change::Park));
    // Parking ends in Busy, even when the park failed (a row left waiting draws backed-up
    // wakes only), and forgets the tries it owed.
    assert!(!p.after(&ticket, Some(&failed()), &names(&QUEUES), true, now, &stats));
    assert_eq!((p.state, stats.snapshot().waits_left), (State::Busy, 1));
    assert_eq!(p.retry_at(), None);
    assert!(!p.registered());
    // Busy: claims carry nothing; a short claim makes it join, on a claim sent at once.
    let ticket = p.ticket(true, now);
    assert_eq!(ticket.change, None);
    assert!(!p.after(&ticket, None, &names(&QUEUES), true, now, &stats));
    assert!(p.after(&ticket, None, &names(&QUEUES), false, now, &stats));
    assert_eq!(p.state, State::Joining);
    // A park from Joining counts no wait left.
    let park = p.ticket(true, now);
    p.after(&park, None, &names(&QUEUES), true, now, &stats);
    assert_eq!(stats.snapshot().waits_left, 1);
}

#[test]
fn a_replica_that_cannot_be_woken_never_registers() {
    let (mut p, now) = (
        Presence::new(false, names(&QUEUES), Duration::from_secs(1)),
        Instant::now(),
    );
    assert!(!p.registered());
    let ticket = p.ticket(false, now);
    assert_eq!(ticket.change, None);
    assert!(!p.after(
        &ticket,
        None,
        &names(&QUEUES),
        false,
        now,
        &WorkerStats::default()
    ));
    p.reconnected();
    assert_eq!(p.state, State::Busy);
}

#[test]
fn a_reconnect_makes_a_registered_replica_register_again_whatever_claims_in_flight_answer() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, held(&["bulk"]), now, &stats);
    let in_flight = p.ticket(false, now + Duration::from_secs(1));
    p.reconnected();
    // The claim sent before the reconnect settles nothing: the table may have been emptied
    // after its statement ran.
    tried(&mut p, &in_flight, &names(&QUEUES), now, &stats);
    assert_eq!(p.state, State::Joining);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Register(names(&QUEUES)))
    );
}

#[test]
fn a_try_settles_only_the_queues_its_claim_asked() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    // Registered: both tries succeed, but the claim gave bulk no share of its room.
    let registering = p.ticket(false, now);
    tried(&mut p, &registering, &names(&["mail"]), now, &stats);
    assert_eq!(p.state, State::Waiting);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["bulk"]))),
        "bulk is owed a claim that asks it"
    );
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
    // A failed claim (it asked nothing) settles nothing either.
    let trying = p.ticket(false, now);
    tried(&mut p, &trying, &[], now, &stats);
    assert_eq!(
        p.ticket(false, now).change,
        Some(Change::Settle(names(&["bulk"])))
    );
    // A claim that asked it settles it.
    let trying = p.ticket(false, now);
    tried(&mut p, &trying, &names(&["bulk"]), now, &stats);
    assert_eq!((p.ticket(false, now).change, p.retry_at()), (None, None));
    assert_eq!(stats.snapshot().barrier_held, 0, "no barrier was held");
}
