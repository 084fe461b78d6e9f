//! Which notifications wake a replica, and what the others leave for its claim loop.
use super::Signals;

#[test]
fn a_wake_naming_this_replica_wakes_it_and_one_naming_another_is_left_to_back_up() {
    let signals = Signals::default();
    assert!(signals.wake_token > 0);
    let own = format!("t {} mail etl.load", signals.wake_token);
    let other = format!("t {} mail etl.load", signals.wake_token ^ 1);
    assert!(!signals.deliver(&other), "another replica's wake");
    assert!(!signals.deliver(&other), "the same one again");
    assert_eq!(
        signals.take_others(),
        vec![("mail".to_owned(), "etl.load".to_owned())],
        "recorded once"
    );
    assert!(signals.take_others().is_empty(), "taken");
    assert!(signals.deliver(&own));
    assert!(signals.take_others().is_empty());
    assert!(signals.take_opened().is_empty());
}

#[test]
fn a_queue_wake_and_the_empty_payload_wake_every_replica() {
    let signals = Signals::default();
    assert!(signals.deliver(""), "the wake for every replica");
    assert!(signals.take_opened().is_empty());
    assert!(signals.deliver("q mail"));
    assert!(signals.deliver("q mail"));
    assert!(signals.deliver("q bulk"));
    assert_eq!(signals.take_opened(), vec!["mail", "bulk"]);
    assert!(signals.take_opened().is_empty());
    // Its bare token (a take of a schema before 0028) wakes it and says its row is gone.
    assert!(!signals.take_row_taken());
    assert!(signals.deliver(&signals.wake_token.to_string()));
    assert!(signals.take_row_taken());
    assert!(!signals.take_row_taken(), "taken");
    // Anything else (a payload of another release) wakes it too, to be safe.
    assert!(signals.deliver(&(signals.wake_token ^ 1).to_string()));
    assert!(!signals.take_row_taken());
    assert!(signals.deliver("t 1 only-three"));
    assert!(signals.take_others().is_empty());
}
