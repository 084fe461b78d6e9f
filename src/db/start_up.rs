//! Bounded start-up: every step of a process's start runs before one deadline, and a step that
//! failed for a reason that may pass is tried again.
//!
//! Invariants this module keeps:
//! - Each attempt is bounded (a blackholed server answers nothing), and so is the whole start-up.
//! - Only a lost or refused connection, a timed-out attempt and a transient database error are
//!   retried, after a pause that doubles from 100 ms up to 2 s; anything else (a refused role or
//!   password, a missing database, an incompatible schema) ends start-up at once.
//! - Giving up names the target (address, database, role; never the password) and the last
//!   attempt's cause, never an error's text.
//! - The first failed attempt is logged at once with the same (target, stable code, SQLSTATE,
//!   cause); a start-up that keeps failing logs again at most once per
//!   [`STARTUP_WARN_EVERY`], with the count of failed attempts, never once per attempt.

use crate::error::{Error, Target};
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// First pause between two start-up attempts.
const STARTUP_RETRY_MIN: Duration = Duration::from_millis(100);

/// Longest pause between two start-up attempts.
const STARTUP_RETRY_MAX: Duration = Duration::from_secs(2);

/// Least time between two warnings of a start-up that keeps failing: the first failed attempt is
/// logged at once, then at most one line per this interval.
const STARTUP_WARN_EVERY: Duration = Duration::from_secs(10);

/// When a process must have started: every start-up step (connecting, the schema and session
/// settings checks, the owner lock, the release of a previous incarnation's jobs) runs before it.
#[derive(Debug, Clone)]
pub struct StartUp {
    /// The end of the whole start-up, shared by all its steps; once it has passed, start-up fails
    /// `database_unavailable`.
    pub deadline: tokio::time::Instant,
    /// The longest one attempt of one step may take (a blackholed server answers nothing).
    pub attempt: Duration,
    /// A signal during start-up stops the retries.
    pub shutdown: crate::shutdown::Shutdown,
    /// Where the connections go, named when start-up gives up.
    pub target: Target,
}

impl StartUp {
    /// Runs `step` until it succeeds, before the deadline: each attempt is bounded, and an attempt
    /// that loses its connection, times out or meets a transient database error is tried again
    /// after a pause that doubles from 100 ms up to 2 s. Any other error ends start-up at once.
    ///
    /// # Errors
    /// The first error that is not worth retrying (such as [`Error::Refused`]);
    /// [`Error::Unreachable`], naming the target and the last attempt's cause, when the deadline
    /// passes or a shutdown is requested while retrying; an attempt the deadline cut short says
    /// nothing of the database, so the cause is then the one before it.
    pub async fn run<T, F, Fut>(&self, mut step: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let deadline = self.deadline;
        let mut pause = STARTUP_RETRY_MIN;
        let mut shutdown = self.shutdown.clone();
        let mut failures: u32 = 0;
        let mut warned: Option<tokio::time::Instant> = None;
        let mut cause: Option<tokio_postgres::Error> = None;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let cut_short = left < self.attempt;
            let error = match tokio::time::timeout(left.min(self.attempt), step()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !retried_at_start_up(&e) => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => Error::Unavailable(None),
            };
            let code = error.code();
            // Only these are retried (`retried_at_start_up`; a timed-out attempt is the first).
            let source = match error {
                Error::Unavailable(source) => source,
                Error::Database(source) => Some(source),
                _ => None,
            };
            let source = match source {
                None if cut_short => cause.take(),
                source => source,
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left <= pause || shutdown.stage() != crate::shutdown::Stage::Running {
                return Err(Error::Unreachable {
                    target: self.target.clone(),
                    source,
                });
            }
            failures = failures.saturating_add(1);
            let now = tokio::time::Instant::now();
            if warned.is_none_or(|at| now.duration_since(at) >= STARTUP_WARN_EVERY) {
                warned = Some(now);
                self.warn_retrying(code, source.as_ref(), failures, pause);
            }
            cause = source;
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.reached(crate::shutdown::Stage::Draining) => {}
            }
            pause = (pause * 2).min(STARTUP_RETRY_MAX);
        }
    }
}

impl StartUp {
    /// Logs that a start-up step failed with `code` (and the database's `source`, if any: the
    /// `failures`-th failed attempt) and is tried again after `pause`: where (address, database,
    /// role; never the password), the stable code, the SQLSTATE if the server answered one, and
    /// the cause as a fixed phrase, never the error's text.
    fn warn_retrying(
        &self,
        code: crate::codes::Code,
        source: Option<&tokio_postgres::Error>,
        failures: u32,
        pause: Duration,
    ) {
        tracing::warn!(
            address = %self.target.address,
            database = %self.target.database,
            role = %self.target.user,
            code = %code,
            sqlstate = source.and_then(tokio_postgres::Error::code).map(SqlState::code),
            cause = crate::error::attempt_cause(source),
            failures,
            retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "start-up step failed; retrying"
        );
    }
}

/// Whether a start-up step that failed with `e` is worth another attempt: a lost or refused
/// connection, or a transient database error (a lock or statement timeout, too many connections).
fn retried_at_start_up(e: &Error) -> bool {
    match e {
        Error::Unavailable(_) => true,
        Error::Database(db) => crate::error::is_transient(db),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::StartUp;
    use crate::error::{Error, Target};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// An attempt refused, then one the deadline cut short: start-up gives up naming the refusal,
    /// the last thing the database said, not "no answer".
    #[tokio::test]
    async fn an_attempt_the_deadline_cut_short_keeps_the_cause_before_it() {
        let refused = tokio_postgres::connect(
            "host=127.0.0.1 port=1 connect_timeout=5",
            tokio_postgres::NoTls,
        )
        .await
        .err();
        let refused = std::sync::Mutex::new(refused);
        let (_trigger, shutdown) = crate::shutdown::manual();
        let start_up = StartUp {
            deadline: tokio::time::Instant::now() + Duration::from_millis(400),
            attempt: Duration::from_secs(5),
            shutdown,
            target: Target::of(&"host=127.0.0.1 port=1".parse().unwrap()),
        };
        let calls = AtomicU32::new(0);
        let result: Result<(), Error> = start_up
            .run(|| async {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(Error::Unavailable(refused.lock().unwrap().take()))
                } else {
                    std::future::pending().await
                }
            })
            .await;
        let err = result.unwrap_err();
        assert!(err.to_string().contains("connection refused"), "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
