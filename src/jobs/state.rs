//! The domain's one list of job states: [`JobState`], the values of `etl_jobs.status`: the live
//! states in `etl_job_records.status`, the ended ones in `etl_job_outcomes.status`.
//!
//! A leaf: it imports nothing of this crate, so the worker, `jobs` and the API all name states
//! through it without importing each other. docs/state-machine.md draws the transitions.
//!
//! Invariants this module keeps:
//! - [`JobState::ALL`] is exactly the union of the lists the `etl_job_records.status` and
//!   `etl_job_outcomes.status` CHECK constraints admit; a test compares them.
//! - A state is stored, sent and served as its lowercase name ([`JobState::as_str`]): in SQL
//!   through [`ToSql`]/[`FromSql`] (text), in JSON through `Serialize`. A name that is not a
//!   state is an error on the way in ([`FromSql`], [`JobState::parse`]), never a default.
//! - SQL text keeps its state literals (`status = 'running'`): the type is for the values Rust
//!   reads, writes and compares.

use std::error::Error;
use std::fmt;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// The buffer `ToSql` writes into, named through postgres-types' own re-export (the one its
/// `to_sql_checked!` macro uses), so the crate needs no direct dependency on `bytes`.
type SqlBuffer = tokio_postgres::types::private::BytesMut;

/// A job's state (`etl_jobs.status`).
///
/// The served OpenAPI document shows it once, inline, as the listing's `status` filter: the
/// schema's description says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(
    feature = "service",
    schema(rename_all = "lowercase", description = "A job state, as a filter.")
)]
pub enum JobState {
    /// Waiting to run (or to retry).
    Pending,
    /// Running under a lease.
    Running,
    /// Ended with its effects committed.
    Succeeded,
    /// Ended without effects, with a failure code.
    Failed,
    /// Cancelled by its owner (or replaced).
    Cancelled,
}

impl JobState {
    /// Every state, in the order of the state machine.
    pub const ALL: [JobState; 5] = [
        JobState::Pending,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The stored name of this state.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state named `name`, if any.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether the job has ended (`succeeded`, `failed` or `cancelled`): nothing changes it
    /// any more.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state equals its stored name: `status == "succeeded"` reads as the SQL it mirrors.
impl PartialEq<&str> for JobState {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// Written as its name, into any text type.
impl ToSql for JobState {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut SqlBuffer,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.as_str().to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// Read from any text type; a name that is not a state is an error.
impl<'a> FromSql<'a> for JobState {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<JobState, Box<dyn Error + Sync + Send>> {
        let name = <&str as FromSql>::from_sql(ty, raw)?;
        JobState::parse(name).ok_or_else(|| "not a job state".into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::JobState;

    #[test]
    fn every_state_round_trips_through_its_name_and_only_three_are_terminal() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
            assert_eq!(state.to_string(), state.as_str());
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::Value::String(state.as_str().to_owned())
            );
            assert!(state == state.as_str());
        }
        assert_eq!(JobState::parse("Pending"), None);
        assert_eq!(JobState::parse(""), None);
        let terminal: Vec<_> = JobState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [JobState::Succeeded, JobState::Failed, JobState::Cancelled]
        );
    }
}
