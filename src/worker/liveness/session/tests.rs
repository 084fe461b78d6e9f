//! Which notifications wake a replica.
use super::Signals;
use std::sync::atomic::Ordering;

#[test]
fn a_notification_wakes_only_for_the_empty_payload_or_the_replicas_own_token() {
    let signals = Signals::default();
    assert!(signals.wake_token > 0);
    let own = signals.wake_token.to_string();
    let other = (signals.wake_token ^ 1).to_string();
    assert!(!signals.deliver(&other), "another replica's token");
    assert!(!signals.deliver("not-a-token"));
    assert_eq!(signals.takes.load(Ordering::Acquire), 0);
    assert!(signals.deliver(""), "the wake for every replica");
    assert_eq!(signals.takes.load(Ordering::Acquire), 0, "takes no row");
    assert!(signals.deliver(&own));
    assert!(signals.deliver(&own));
    assert_eq!(
        signals.takes.load(Ordering::Acquire),
        2,
        "each take counted"
    );
}
