//! The signals a replica's session gives its claim loop: which notifications woke it, which
//! queues opened, which wakes named other replicas, whether the owner lock is held, when the
//! session was lost, and until when its beats let it trust its leases.
//!
//! Invariant this module keeps: every list stays as short as the distinct names the replica
//! hears (a name is recorded once until the claim loop takes it).

use crate::worker::liveness::beat::BeatClock;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// Signals from the session to the claim loop.
#[derive(Debug)]
pub(crate) struct Signals {
    /// This process's wake token: what a NOTIFY that names this replica carries, and what its
    /// waiting row names (migration 0024). Random, nonzero, never reused by another process in
    /// practice; it says nothing of the replica.
    pub(crate) wake_token: i64,
    /// A notification for this replica arrived.
    pub(crate) notified: Notify,
    /// The queues of `q` wakes since the claim loop last looked ([`Signals::take_opened`]).
    opened: std::sync::Mutex<Vec<String>>,
    /// A wake named another replica: the claim loop looks at [`Signals::take_others`].
    pub(crate) others_woken: Notify,
    /// The (queue, kind) of wakes that named other replicas since the claim loop last looked.
    others: std::sync::Mutex<Vec<(String, String)>>,
    /// A bare wake token of this process arrived: the enqueue trigger of a schema before 0028
    /// (migrated down under the replica) took its waiting row, which is gone until it registers
    /// again ([`Signals::take_row_taken`]).
    row_taken: AtomicBool,
    /// The session reconnected: claim once to catch up.
    pub(crate) reconnected: Notify,
    /// The owner lock is held by another process now: stop.
    pub(crate) fatal: Notify,
    /// Whether the session holds the owner lock right now, as far as the replica knows: set when
    /// the lock is taken, cleared as soon as the session is found lost. Claims and heartbeats
    /// stamp it into `lease_owner_locked`.
    pub(crate) locked: AtomicBool,
    /// When the session was last found lost (the database unreachable from it, for all this
    /// replica knows).
    lost_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Until when the replica trusts its leases by its beats (`beat`): every held job's watch
    /// stops trusting at the earlier of its lease clock and this one.
    pub(crate) beats: BeatClock,
}

impl Default for Signals {
    fn default() -> Signals {
        Signals {
            wake_token: fastrand::i64(1..),
            notified: Notify::new(),
            opened: std::sync::Mutex::new(Vec::new()),
            others_woken: Notify::new(),
            others: std::sync::Mutex::new(Vec::new()),
            row_taken: AtomicBool::new(false),
            reconnected: Notify::new(),
            fatal: Notify::new(),
            locked: AtomicBool::new(false),
            lost_at: std::sync::Mutex::new(None),
            beats: BeatClock::default(),
        }
    }
}

impl Signals {
    /// Takes a notification whose payload is `payload` (see the module's invariants): wakes the
    /// claim loop when it is for this replica, and says whether it was.
    pub(crate) fn deliver(&self, payload: &str) -> bool {
        let mut words = payload.split(' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("t"), Some(token), Some(queue), Some(kind))
                if token.parse() != Ok(self.wake_token) =>
            {
                push_new(&self.others, (queue.to_owned(), kind.to_owned()));
                self.others_woken.notify_one();
                return false;
            }
            (Some("q"), Some(queue), None, None) => push_new(&self.opened, queue.to_owned()),
            (Some(token), None, None, None) if token.parse() == Ok(self.wake_token) => {
                self.row_taken.store(true, Ordering::Release);
            }
            _ => {}
        }
        self.notified.notify_one();
        true
    }

    /// The queues `q` wakes named since the last call.
    pub(crate) fn take_opened(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.opened))
    }

    /// Whether a bare wake token of this process arrived since the last call (see
    /// `row_taken`).
    pub(crate) fn take_row_taken(&self) -> bool {
        self.row_taken.swap(false, Ordering::AcqRel)
    }

    /// The (queue, kind) of the wakes that named other replicas since the last call.
    pub(crate) fn take_others(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *lock(&self.others))
    }

    /// When the session was last found lost, if ever.
    pub(crate) fn lost_at(&self) -> Option<std::time::Instant> {
        *self
            .lost_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes that the session was found lost just now.
    pub(crate) fn lost_now(&self) {
        *self
            .lost_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
    }
}

/// Locks `list`, whatever a panic left in it (a list of names is valid at every step).
fn lock<T>(list: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    list.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Appends `item` to `list` unless it is there already: the list stays as short as the distinct
/// names the replica hears.
fn push_new<T: PartialEq>(list: &std::sync::Mutex<Vec<T>>, item: T) {
    let mut list = lock(list);
    if !list.contains(&item) {
        list.push(item);
    }
}
