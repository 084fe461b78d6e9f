//! The state of one job in a batch of the group commit, mapped forward phase by phase, and the
//! one place that reads a job's outcome off it once its batch is over.
//!
//! Invariants this module keeps:
//! - A job's own failure (its fence failed, its owner asked to cancel, its effects failed) is
//!   final: whatever the batch does after, that is the job's outcome.
//! - A job is reported succeeded only if its success was written and its batch committed, or its
//!   ledger row is found under its claim after a commit whose outcome is unknown.
//! - Every other job takes the batch's failure: [`Failure::Infrastructure`] when the batch did
//!   not commit for the infrastructure's sake (no connection, a lost session whose ledger shows
//!   no success of the job), else its code.

use crate::codes::Code;
use crate::job::handler::{Effects, Output};
use crate::worker::complete::completer::{Failure, Transition};
use crate::worker::lease::Lease;
use std::collections::HashSet;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// One job whose compute phase is done, waiting for its effects to commit.
pub(crate) struct Ready {
    /// The lease that fences it.
    pub(crate) lease: Lease,
    /// Its effects.
    pub(crate) effects: OwnedEffects,
    /// Whether it needs the execution transaction: its effects are not `NoEffects`
    /// (`<dyn Effects>::writes`, read off their type), so their `apply` must run.
    pub(crate) writes: bool,
    /// How long its effects may take, from when they start applying.
    pub(crate) budget: Duration,
    /// The job's span (its id, kind, queue and attempt), which its effects apply in, so the
    /// logs they write are found with the rest of the attempt's.
    pub(crate) span: tracing::Span,
}

/// A job's effects, held by the commit lane, whose drop never unwinds into the lane: a handler's
/// `Drop` that panics is caught and logged (`handler_panicked`). Else one such panic would end
/// the lane, and a second one, dropping the rest of the batch while the first unwinds, would
/// abort the process.
pub(crate) struct OwnedEffects(Option<Box<dyn Effects>>);

impl OwnedEffects {
    /// Holds `effects`.
    pub(crate) fn new(effects: Box<dyn Effects>) -> OwnedEffects {
        OwnedEffects(Some(effects))
    }

    /// The effects, to apply: only once (a second take finds none).
    pub(super) fn take(&mut self) -> Option<Box<dyn Effects>> {
        self.0.take()
    }

    /// The effects, to read (set-based effects read their members without taking them).
    pub(super) fn get(&self) -> Option<&(dyn Effects + 'static)> {
        self.0.as_deref()
    }
}

impl Drop for OwnedEffects {
    fn drop(&mut self) {
        if let Some(effects) = self.0.take() {
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(effects)));
            if dropped.is_err() {
                tracing::error!(code = %Code::HandlerPanicked, "a job's effects panicked when dropped");
            }
        }
    }
}

/// What a job of a batch came to.
pub(super) type Outcome = Result<Transition, Failure>;

/// Where one job of a batch stands. Each phase of the batch maps it forward, and
/// [`Step::settle`] reads its outcome off it once the batch is over, in one place:
///
/// ```text
/// Claimed ──fence──▶ Fenced ──apply──▶ Applying ──▶ Applied ──succeed──▶ Succeeded
///    │                 │                   │
///    └─────────────────┴───────────────────┴──▶ Ended(failure)   (the job's own, final)
/// ```
///
/// A batch that writes nothing goes `Claimed → Succeeded | Ended` in one statement.
pub(super) enum Step {
    /// Queued; its fence not checked yet.
    Claimed(Ready),
    /// Fenced and row-locked; its effects not applied yet.
    Fenced(Ready),
    /// Its effects are being applied (a batch that fails now fails it with the batch).
    Applying,
    /// Its effects are applied in the transaction; its success is not written yet.
    Applied(Option<Output>),
    /// Its success is written; durable once the batch commits.
    Succeeded,
    /// It failed on its own, or its fence failed: final, whatever the batch does.
    Ended(Failure),
}

/// Maps `step` forward by `to` (`Applying` stands in while `to` runs).
pub(super) fn advance(step: &mut Step, to: impl FnOnce(Step) -> Step) {
    let from = std::mem::replace(step, Step::Applying);
    *step = to(from);
}

/// How a batch's transaction ended.
pub(super) enum BatchEnd {
    /// It committed (or, writing nothing, its one statement ran).
    Committed,
    /// The connection was lost, perhaps during COMMIT: the leases whose success (outcome and
    /// ledger) exists under their claim committed (`None`: the outcomes could not be read either).
    Unknown(Option<HashSet<Lease>>),
    /// It failed with this code (and the SQLSTATE of the statement that failed, if the database
    /// gave one) and committed nothing.
    Failed(Code, Option<SqlState>),
    /// An infrastructure fault ended it (no connection, a statement bound) and it committed
    /// nothing.
    Infrastructure,
}

impl Step {
    /// Whether the job needs the execution transaction (see [`Ready::writes`]).
    pub(super) fn writes(&self) -> bool {
        matches!(self, Step::Claimed(ready) if ready.writes)
    }

    /// `Claimed → Fenced | Ended` by what the fenced lock found (`None`: the fence failed; else
    /// whether a cancel was requested). A fenced live row proves the job's effects never
    /// committed: a commit deletes it.
    pub(super) fn fence(self, found: Option<&bool>) -> Step {
        let Step::Claimed(ready) = self else {
            return self;
        };
        match found {
            None => Step::Ended(Failure::LeaseLost),
            Some(true) => Step::Ended(Failure::Cancelled),
            Some(false) => Step::Fenced(ready),
        }
    }

    /// The job's outcome, now that its batch ended with `end`.
    pub(super) fn settle(self, lease: &Lease, end: &BatchEnd) -> Outcome {
        match (self, end) {
            (Step::Ended(failure), _) => Err(failure),
            (Step::Succeeded, BatchEnd::Committed) => Ok(Transition::Succeeded),
            (_, BatchEnd::Unknown(Some(committed))) if committed.contains(lease) => {
                Ok(Transition::Succeeded)
            }
            (_, BatchEnd::Failed(code, sqlstate)) => Err(Failure::Batch(*code, sqlstate.clone())),
            // Not committed, for the infrastructure's sake: never the job's failure.
            (_, BatchEnd::Infrastructure | BatchEnd::Unknown(_)) => Err(Failure::Infrastructure),
            // Committed without a success of its own (cannot happen: every fenced job ends
            // `Succeeded` or `Ended`): a fenced retry settles it.
            (_, BatchEnd::Committed) => Err(Failure::Code(Code::TransientDatabase)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    /// A lease of a fresh job.
    fn lease() -> Lease {
        Lease {
            job_id: Uuid::new_v4(),
            claim_id: Uuid::new_v4(),
            fencing_token: 1,
        }
    }

    /// The outcome, by name, of `step` in a batch that ended with `end`.
    fn settled(step: Step, lease: &Lease, end: &BatchEnd) -> String {
        match step.settle(lease, end) {
            Ok(transition) => format!("{transition:?}"),
            Err(Failure::Code(code) | Failure::Batch(code, _)) => format!("code: {code}"),
            Err(Failure::LeaseLost) => "lease lost".to_owned(),
            Err(Failure::Infrastructure) => "infrastructure".to_owned(),
            Err(_) => "other failure".to_owned(),
        }
    }

    #[test]
    fn a_job_reads_its_outcome_off_its_step_and_its_batch_end() {
        let (mine, other) = (lease(), lease());
        let committed_mine = BatchEnd::Unknown(Some(HashSet::from([mine])));
        let cases = [
            // A job's own failure stands, however the batch ended.
            (
                Step::Ended(Failure::LeaseLost),
                BatchEnd::Committed,
                "lease lost",
            ),
            (
                Step::Ended(Failure::LeaseLost),
                BatchEnd::Failed(Code::HandlerFailed, None),
                "lease lost",
            ),
            (Step::Succeeded, BatchEnd::Committed, "Succeeded"),
            // An unknown commit: the ledger under the job's claim decides.
            (Step::Succeeded, committed_mine, "Succeeded"),
            (
                Step::Succeeded,
                BatchEnd::Unknown(Some(HashSet::from([other]))),
                "infrastructure",
            ),
            (
                Step::Applied(None),
                BatchEnd::Unknown(None),
                "infrastructure",
            ),
            (Step::Applying, BatchEnd::Infrastructure, "infrastructure"),
            // A failed batch fails every job still open with its code.
            (
                Step::Succeeded,
                BatchEnd::Failed(Code::HandlerFailed, None),
                "code: handler_failed",
            ),
            (
                Step::Applying,
                BatchEnd::Failed(Code::TransientDatabase, None),
                "code: transient_database",
            ),
            // Committed, yet without a success of its own: never read as success.
            (
                Step::Applying,
                BatchEnd::Committed,
                "code: transient_database",
            ),
        ];
        for (step, end, expected) in cases {
            assert_eq!(settled(step, &mine, &end), expected);
        }
    }

    #[test]
    fn only_a_claimed_job_is_fenced_and_only_a_claimed_writer_needs_the_transaction() {
        assert!(matches!(Step::Applying.fence(None), Step::Applying));
        assert!(!Step::Succeeded.writes());
    }
}
