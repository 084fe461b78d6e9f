//! The presence state machine's transitions, without a database.
use super::{Change, Presence, Registered, State, Ticket};
use crate::error::Error;
use crate::worker::stats::WorkerStats;
use std::time::Duration;
use tokio::time::Instant;

/// A listening replica polling every second.
fn presence() -> Presence {
    Presence::new(true, Duration::from_secs(1))
}

/// A registration that wrote the row, with the barrier free or held.
fn registered(free: bool) -> Result<Registered, Error> {
    Ok(Registered {
        written: true,
        free,
    })
}

/// A registration that found the row held by another transaction (and the barrier free).
fn skipped() -> Result<Registered, Error> {
    Ok(Registered {
        written: false,
        free: true,
    })
}

/// A failed presence statement.
fn failed() -> Result<Registered, Error> {
    Err(Error::Unavailable(None))
}

/// Sends `p`'s next claim at `now` after a short claim, answered with `answer`; returns the
/// ticket it carried and whether `p` claims again at once.
fn claim(
    p: &mut Presence,
    answer: Result<Registered, Error>,
    now: Instant,
    stats: &WorkerStats,
) -> (Ticket, bool) {
    let ticket = p.ticket(false, now);
    let again = p.after(ticket, Some(&answer), false, now, stats);
    (ticket, again)
}

#[test]
fn a_listening_replica_registers_on_its_first_claim_and_waits_once_settled() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    assert!(p.registered());
    let (ticket, again) = claim(&mut p, registered(true), now, &stats);
    assert_eq!((ticket.change, again), (Some(Change::Register), false));
    assert_eq!((p.state, stats.snapshot().waits), (State::Waiting, 1));
    // Waiting: claims carry nothing until a poll interval after the last refresh.
    assert_eq!(
        p.ticket(false, now + Duration::from_millis(999)).change,
        None
    );
    let due = now + Duration::from_secs(1);
    assert_eq!(p.ticket(false, due).change, Some(Change::Register));
}

#[test]
fn a_held_barrier_is_tried_again_at_doubling_intervals_up_to_the_poll() {
    let stats = WorkerStats::default();
    let (mut p, now) = (
        Presence::new(true, Duration::from_millis(5)),
        Instant::now(),
    );
    claim(&mut p, registered(false), now, &stats);
    assert_eq!(p.state, State::Unsettled);
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
    // The row is written: the retry tries the barrier alone.
    assert_eq!(p.ticket(false, now).change, Some(Change::Settle));
    p.retrying();
    assert_eq!(p.retry_at(), None);
    for pause in [2, 4, 5, 5] {
        // The row is there now, but that is not enough before a successful try.
        claim(&mut p, registered(false), now, &stats);
        assert_eq!(p.retry_at(), Some(now + Duration::from_millis(pause)));
    }
    claim(&mut p, registered(true), now, &stats);
    assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
    assert_eq!(p.backoff, super::FIRST_BACKOFF);
    let counted = stats.snapshot();
    assert_eq!((counted.barrier_held, counted.waits), (5, 1));
}

#[test]
fn a_failed_registration_is_retried_and_a_failed_refresh_rides_on_the_next_claim() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, failed(), now, &stats);
    assert_eq!(p.state, State::Joining);
    assert!(p.retry_at().is_some());
    // Not sent (the claim failed first): the same.
    let ticket = p.ticket(false, now);
    p.after(ticket, None, false, now, &stats);
    assert_eq!(p.ticket(false, now).change, Some(Change::Register));
    claim(&mut p, registered(true), now, &stats);
    let due = now + Duration::from_secs(1);
    let ticket = p.ticket(false, due);
    p.after(ticket, Some(&failed()), false, due, &stats);
    assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
    assert_eq!(
        p.ticket(false, due).change,
        Some(Change::Register),
        "still due"
    );
}

#[test]
fn a_refresh_must_settle_again_since_an_enqueue_skips_the_row_it_holds() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, registered(true), now, &stats);
    let due = now + Duration::from_secs(1);
    // The refresh held the row while an enqueue that skipped it still holds the barrier.
    claim(&mut p, registered(false), due, &stats);
    assert_eq!(p.state, State::Unsettled);
    assert!(p.retry_at().is_some());
    claim(&mut p, registered(true), due, &stats);
    assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
}

#[test]
fn a_registration_that_wrote_nothing_is_retried_even_with_the_barrier_free() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, skipped(), now, &stats);
    assert_eq!(p.state, State::Joining, "the row is not this replica's yet");
    assert_eq!(p.ticket(false, now).change, Some(Change::Register));
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
    claim(&mut p, skipped(), now, &stats);
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(2)));
    claim(&mut p, registered(true), now, &stats);
    assert_eq!((p.state, p.retry_at()), (State::Waiting, None));
    // A refresh that wrote nothing makes a waiting replica register again too.
    let due = now + Duration::from_secs(1);
    claim(&mut p, skipped(), due, &stats);
    assert_eq!(p.state, State::Joining);
    let counted = stats.snapshot();
    assert_eq!(
        (
            counted.registrations_skipped,
            counted.barrier_held,
            counted.waits
        ),
        (3, 0, 1)
    );
}

#[test]
fn an_unsettled_replica_retries_the_try_alone_and_registers_again_before_its_row_goes_stale() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, registered(false), now, &stats);
    let later = now + Duration::from_millis(999);
    let (ticket, _) = claim(&mut p, registered(false), later, &stats);
    assert_eq!(ticket.change, Some(Change::Settle));
    assert_eq!(p.state, State::Unsettled);
    // A poll interval after the row was written, the retry writes it again.
    let stale = now + Duration::from_secs(1);
    assert_eq!(p.ticket(false, stale).change, Some(Change::Register));
    claim(&mut p, registered(false), stale, &stats);
    let settled = stale + Duration::from_millis(500);
    let (ticket, _) = claim(&mut p, registered(true), settled, &stats);
    assert_eq!(ticket.change, Some(Change::Settle));
    assert_eq!(p.state, State::Waiting);
    // Waiting: the refresh is due a poll interval after the write, not after the try.
    assert_eq!(
        p.ticket(false, stale + Duration::from_millis(999)).change,
        None
    );
    assert_eq!(
        p.ticket(false, stale + Duration::from_secs(1)).change,
        Some(Change::Register)
    );
    // A try sent before a take settles nothing, as a registration would not.
    claim(
        &mut p,
        registered(false),
        stale + Duration::from_secs(1),
        &stats,
    );
    let in_flight = p.ticket(false, settled + Duration::from_millis(600));
    assert_eq!(in_flight.change, Some(Change::Settle));
    p.taken(1);
    p.after(in_flight, Some(&registered(true)), false, settled, &stats);
    assert_eq!(p.state, State::Joining, "the row may be the one taken");
    // A failed try is counted and tried again, still alone.
    let mut p = presence();
    claim(&mut p, registered(false), now, &stats);
    let failures = stats.snapshot().presence_failures;
    let (ticket, _) = claim(&mut p, failed(), now, &stats);
    assert_eq!(ticket.change, Some(Change::Settle));
    assert_eq!(p.state, State::Unsettled);
    assert!(p.retry_at().is_some());
    assert_eq!(p.ticket(false, now).change, Some(Change::Settle));
    assert_eq!(stats.snapshot().presence_failures, failures + 1);
}

#[test]
fn a_taken_row_makes_the_replica_register_again_and_earlier_claims_settle_nothing() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, registered(true), now, &stats);
    assert_eq!(p.ticket(false, now).change, None);
    // A registration in flight when an enqueue takes the row.
    p.taken(1);
    let in_flight = p.ticket(false, now);
    assert_eq!(in_flight.change, Some(Change::Register));
    p.taken(2);
    p.after(in_flight, Some(&registered(true)), false, now, &stats);
    assert_eq!(p.state, State::Joining, "its row may be the one taken");
    // A count seen already changes nothing; the next registration settles.
    p.taken(2);
    claim(&mut p, registered(true), now, &stats);
    assert_eq!(p.state, State::Waiting);
    // A take starts a held barrier's retries from the first pause again.
    p.taken(3);
    let t = p.ticket(false, now);
    p.after(t, Some(&registered(false)), false, now, &stats);
    let t = p.ticket(false, now);
    p.after(t, Some(&registered(false)), false, now, &stats);
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(2)));
    p.taken(4);
    assert_eq!(p.retry_at(), None, "the wake's claim registers");
    let t = p.ticket(false, now);
    p.after(t, Some(&registered(false)), false, now, &stats);
    assert_eq!(p.retry_at(), Some(now + Duration::from_millis(1)));
    claim(&mut p, registered(true), now, &stats);
    // A busy replica has no row to take.
    let leave = p.ticket(true, now);
    p.after(leave, Some(&registered(true)), true, now, &stats);
    p.taken(5);
    assert_eq!((p.state, p.ticket(true, now).change), (State::Busy, None));
}

#[test]
fn a_full_claim_makes_a_registered_replica_leave_on_its_next_claim() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, registered(true), now, &stats);
    let ticket = p.ticket(true, now);
    assert_eq!(ticket.change, Some(Change::Park));
    // Leaving ends in Busy, even when the delete failed (a row left behind is harmless).
    assert!(!p.after(ticket, Some(&failed()), true, now, &stats));
    assert_eq!((p.state, stats.snapshot().waits_left), (State::Busy, 1));
    assert!(!p.registered());
    // Busy: claims carry nothing; a short claim makes it join, on a claim sent at once.
    let ticket = p.ticket(true, now);
    assert_eq!(ticket.change, None);
    assert!(!p.after(ticket, None, true, now, &stats));
    assert!(p.after(ticket, None, false, now, &stats));
    assert_eq!(p.state, State::Joining);
}

#[test]
fn a_replica_that_cannot_be_woken_never_registers() {
    let (mut p, now) = (Presence::new(false, Duration::from_secs(1)), Instant::now());
    assert!(!p.registered());
    let ticket = p.ticket(false, now);
    assert_eq!(ticket.change, None);
    assert!(!p.after(ticket, None, false, now, &WorkerStats::default()));
    p.reconnected();
    assert_eq!(p.state, State::Busy);
}

#[test]
fn a_reconnect_makes_a_registered_replica_register_again_whatever_claims_in_flight_answer() {
    let (mut p, stats, now) = (presence(), WorkerStats::default(), Instant::now());
    claim(&mut p, registered(true), now, &stats);
    let in_flight = p.ticket(false, now + Duration::from_secs(1));
    p.reconnected();
    // The claim sent before the reconnect settles nothing: the table may have been emptied
    // after its statement ran.
    p.after(in_flight, Some(&registered(true)), false, now, &stats);
    assert_eq!(p.state, State::Joining);
    assert_eq!(p.ticket(false, now).change, Some(Change::Register));
}
