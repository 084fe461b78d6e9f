//! Beats: how a replica with a session proves that it is alive, so that recovery never takes its
//! jobs while it still trusts their leases, and still takes a dead replica's jobs within two
//! seconds.
//!
//! A replica's locks (its owner lock and alive locks, see `alive`) vanish with its connections,
//! whether its process died or every connection was cut at once (a pooler or proxy restart, a NAT
//! reset, an operator ending its backends). Locks alone cannot tell the two apart, so recovery
//! also asks for silence: the session writes its owner's row of `etl_owner_beats` every
//! [`BEAT_INTERVAL`], and recovery takes a lock-backed owner for dead only when its last beat is
//! older than the owner's [`SILENCE`] (`rescuer`).
//!
//! Invariants this module keeps:
//! - A beat is one statement on the session's own connection (the one that holds the owner
//!   lock): it writes an UNLOGGED row, so its commit writes no WAL and never waits for a
//!   synchronous standby.
//! - The replica trusts its leases no longer than [`TRUSTED_AFTER_BEAT`] after it sent its last
//!   beat that succeeded ([`BeatClock`]; every held job's watch takes the earlier of its lease
//!   clock and this one, `lease::watch_lease`). A beat is recorded no earlier than it was sent,
//!   so the replica stops trusting, and cancels its handlers, at least `SILENCE −
//!   TRUSTED_AFTER_BEAT` (250 ms) before any judge may take its jobs: no overlap.
//! - A cut shorter than `TRUSTED_AFTER_BEAT − BEAT_INTERVAL − reconnect − beat round trip` moves
//!   no job: the replica beats again as soon as its session is back (`session`), before the
//!   trust runs out, and no judge saw `SILENCE` of silence. With a reconnect attempt at most every
//!   250 ms, that is at least 1 s.
//! - Against a schema without the beats table (a migration down under a running replica), beats
//!   are off: the replica's trust is its leases' alone, and recovery judges it by its locks, as
//!   a release before beats did; its next beat that succeeds bounds the trust again.
//!
//! The arithmetic with the defaults: a SIGKILLed replica's last beat is at most 100 ms old when
//! it dies, so its jobs are reclaimable 1.65–1.75 s later, and the judge's next pass is scheduled
//! for that moment (`rescuer`): they run elsewhere within 2 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// How often the session beats.
pub(crate) const BEAT_INTERVAL: Duration = Duration::from_millis(100);

/// How long after sending its last beat that succeeded the replica still trusts its leases.
pub(crate) const TRUSTED_AFTER_BEAT: Duration = Duration::from_millis(1500);

/// How long a lock-backed owner must have been silent (no beat, on the database's clock) before
/// recovery may judge it dead: [`TRUSTED_AFTER_BEAT`] and a margin of 250 ms for its handlers to
/// stop.
pub(crate) const SILENCE: Duration = Duration::from_millis(1750);

/// How long one beat may take before the session stops waiting for it (the next one is due; the
/// session's probe judges whether the connection is lost).
pub(crate) const BEAT_TIMEOUT: Duration = Duration::from_secs(1);

/// Records that owner `$1` beat now, to be judged dead after `$2` ms of silence.
///
/// Locks: the owner's row of the UNLOGGED `etl_owner_beats`, which only this replica's session
/// writes, to the end of its own implicit transaction.
pub(crate) const BEAT_SQL: &str = "
INSERT INTO etl_owner_beats (owner_id, beat_at, silence_ms) VALUES ($1, now(), $2)
    ON CONFLICT (owner_id) DO UPDATE
   SET beat_at = excluded.beat_at, silence_ms = excluded.silence_ms";

/// Until when the replica trusts its leases, by its beats: the send time of its last beat that
/// succeeded plus [`TRUSTED_AFTER_BEAT`], or without bound while beats are off.
#[derive(Debug)]
pub(crate) struct BeatClock {
    /// The instant the offsets count from.
    base: Instant,
    /// Milliseconds after `base` until which the leases are trusted; [`u64::MAX`]: no bound.
    trusted_ms: AtomicU64,
    /// A beat succeeded after the trust had lapsed: a judge may have taken this live replica's
    /// jobs meanwhile (`refund`).
    pub(crate) regained: Notify,
}

impl Default for BeatClock {
    /// A clock that trusts nothing yet: the session beats before the replica claims.
    fn default() -> BeatClock {
        BeatClock {
            base: Instant::now(),
            trusted_ms: AtomicU64::new(0),
            regained: Notify::new(),
        }
    }
}

impl BeatClock {
    /// A beat sent at `sent` succeeded: trust until `sent + TRUSTED_AFTER_BEAT` (never backwards
    /// while beats are on; a beat after they were off bounds the trust again). When the trust it
    /// had given (since the first beat) ran out before now, signals [`BeatClock::regained`].
    pub(crate) fn beat_sent_at(&self, sent: Instant) {
        let ms_after_base =
            |at: Instant| u64::try_from(at.saturating_duration_since(self.base).as_millis());
        let ms = ms_after_base(sent + TRUSTED_AFTER_BEAT)
            .unwrap_or(u64::MAX - 1)
            .min(u64::MAX - 1);
        let now = ms_after_base(Instant::now()).unwrap_or(u64::MAX);
        // The closure always answers `Some`, so the update cannot fail.
        let before = self
            .trusted_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(if now == u64::MAX { ms } else { now.max(ms) })
            })
            .unwrap_or_else(|before| before);
        if before != 0 && before != u64::MAX && before < now {
            self.regained.notify_one();
        }
    }

    /// Beats are off (the schema has no beats table): the leases alone bound the trust.
    pub(crate) fn off(&self) {
        self.trusted_ms.store(u64::MAX, Ordering::Relaxed);
    }

    /// The instant until which the leases are trusted, or `None` without bound.
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        match self.trusted_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(self.base + Duration::from_millis(ms)),
        }
    }
}

/// What one beat did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Recorded: the clock moved.
    Recorded,
    /// The schema has no beats table: beats are off.
    Off,
}

/// Beats once for `owner_id` on `client` and moves `clock` on success.
///
/// # Errors
/// The database error of the statement (other than a missing beats table, which turns beats
/// off).
pub(crate) async fn beat(
    client: &Client,
    owner_id: &str,
    clock: &BeatClock,
) -> Result<Beat, tokio_postgres::Error> {
    let sent = Instant::now();
    let silence_ms = i32::try_from(SILENCE.as_millis()).unwrap_or(i32::MAX);
    match client
        .execute_typed(
            BEAT_SQL,
            &[(&owner_id, Type::TEXT), (&silence_ms, Type::INT4)],
        )
        .await
    {
        Ok(_) => {
            clock.beat_sent_at(sent);
            Ok(Beat::Recorded)
        }
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
            clock.off();
            Ok(Beat::Off)
        }
        Err(e) => Err(e),
    }
}

/// Beats for `owner_id` through `pool` every [`BEAT_INTERVAL`], for ever: while the session
/// reconnects, the replica still proves it is alive as long as its pool reaches the database
/// (a cut of the session's URL alone moves no job). A beat that fails or is slow is left to the
/// next one.
pub(crate) async fn beat_through(
    pool: &crate::db::Pool,
    owner_id: &str,
    clock: &BeatClock,
) -> std::convert::Infallible {
    let mut beats = tokio::time::interval(BEAT_INTERVAL);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beats.tick().await;
        let once = async {
            let conn = crate::db::checkout(pool).await?;
            Ok::<_, crate::error::Error>(beat(&conn, owner_id, clock).await?)
        };
        // Failing or slow: the next beat is due.
        let _ = tokio::time::timeout(BEAT_TIMEOUT, once).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{BeatClock, TRUSTED_AFTER_BEAT};
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test]
    async fn a_beat_clock_moves_only_forward_and_off_lifts_its_bound() {
        let clock = BeatClock::default();
        let now = Instant::now();
        assert!(
            clock.trusted_until().is_some_and(|until| until <= now),
            "nothing is trusted before the first beat"
        );
        clock.beat_sent_at(now);
        let after = clock.trusted_until().unwrap_or(now);
        assert!(after + Duration::from_millis(1) >= now + TRUSTED_AFTER_BEAT);
        assert!(after <= now + TRUSTED_AFTER_BEAT);
        clock.beat_sent_at(clock.base);
        assert_eq!(clock.trusted_until(), Some(after), "never backwards");
        clock.off();
        assert_eq!(clock.trusted_until(), None);
        clock.beat_sent_at(now);
        assert_eq!(
            clock.trusted_until(),
            Some(after),
            "a beat after beats were off bounds the trust again"
        );
    }

    /// Whether `clock` signalled a regained trust (taking the signal).
    async fn regained(clock: &BeatClock) -> bool {
        tokio::time::timeout(Duration::from_millis(1), clock.regained.notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_after_the_trust_lapsed_signals_a_regain_and_no_other_does() {
        let clock = BeatClock::default();
        clock.beat_sent_at(Instant::now());
        assert!(!regained(&clock).await, "the first beat regains nothing");
        tokio::time::advance(TRUSTED_AFTER_BEAT / 2).await;
        clock.beat_sent_at(Instant::now());
        assert!(!regained(&clock).await, "the trust had not lapsed");
        tokio::time::advance(TRUSTED_AFTER_BEAT * 2).await;
        clock.beat_sent_at(Instant::now());
        assert!(regained(&clock).await, "the trust had lapsed");
        clock.off();
        tokio::time::advance(TRUSTED_AFTER_BEAT * 2).await;
        clock.beat_sent_at(Instant::now());
        assert!(!regained(&clock).await, "beats were off: nothing lapsed");
    }
}
