//! What a job's attempt ended as: the transition its fenced write made ([`Transition`]), and why
//! an attempt ended without committing ([`Failure`]), before that write.
//!
//! Invariants this module keeps:
//! - An infrastructure fault is never the job's failure ([`Failure::Infrastructure`]): it never
//!   becomes a charged retry, only a commit again or a give-back ([`Transition::GivenBack`]).
//! - A [`Transition`] names only stable codes: a kind's own failure code is counted as
//!   `handler_failed` (`Failed(Code::HandlerFailed)`), so metrics keep to the crate's list.

use crate::codes::Code;
use crate::job::handler::JobError;

/// What a fenced transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The job is `succeeded`.
    Succeeded,
    /// The job is `pending` again, due after the retry delay.
    Retried,
    /// The job is `failed` with this code.
    Failed(Code),
    /// The job is `cancelled`: its owner asked, and its effects never committed.
    Cancelled,
    /// The fence matched no row: another claim (or a cancellation, or recovery) owns the job now.
    LeaseLost,
    /// The transition could not be written (the database did not answer); the lease will expire
    /// and recovery will return the job.
    Unwritten,
    /// An infrastructure fault kept the job's result from committing while its lease was
    /// trusted: the job is to be given back under its claim, its attempt not charged (the
    /// replica's give-back writes that once the database answers).
    GivenBack,
}

impl Transition {
    /// Whether the statement that wrote it may have freed its claim's permits (and so woke
    /// nobody, migration 0023): every transition this replica wrote, and an unwritten one whose
    /// statement may have committed unanswered; not a lost lease, whose permits are freed (and
    /// their waiting replicas woken) by whoever took the job, nor a job to give back, whose
    /// release wakes them itself.
    pub fn frees_permits(self) -> bool {
        !matches!(self, Transition::LeaseLost | Transition::GivenBack)
    }
}

/// Why an attempt ended without committing, before the transition is written.
pub(crate) enum Failure {
    /// The handler or the database said so.
    Job(JobError),
    /// A stored code decided by the executor or the group commit itself.
    Code(Code),
    /// The group commit's own statement (or its COMMIT) failed with this code, and this SQLSTATE
    /// if the database gave one: the job's effects applied, but nothing of the batch committed.
    Batch(Code, Option<tokio_postgres::error::SqlState>),
    /// The lease was gone when the effects transaction checked it.
    LeaseLost,
    /// The effects overran their own budget; cut and rolled back, they are tried again.
    EffectsOverrun,
    /// The owner asked to cancel the job.
    Cancelled,
    /// An infrastructure fault (see `infrastructure`), never the job's: its result is committed
    /// again while its lease is trusted, else the job is given back uncharged.
    Infrastructure,
}
