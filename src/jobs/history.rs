//! A job's history beside its status: the attempts that did not end it (`etl_job_attempts`,
//! migration 0012) and the jobs submitted to replace it.
//!
//! Invariants this module keeps:
//! - Every read is scoped by the owner digest through the job's intake row: another owner's job
//!   has no history to read.
//! - An attempt shows numbers, times and how it ended, never an error message.

use crate::error::Error;
use crate::time::canonical_utc;
use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// How an attempt that did not end its job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnding {
    /// A transient failure; a retry was scheduled.
    Retried,
    /// Its lease expired or its replica died; recovery gave the job back.
    Recovered,
    /// Its replica shut down before it finished; the attempt was not charged.
    Released,
}

impl AttemptEnding {
    /// The ending stored as `s` (the table's CHECK constraint admits these three only).
    fn parse(s: &str) -> Option<AttemptEnding> {
        match s {
            "retried" => Some(AttemptEnding::Retried),
            "recovered" => Some(AttemptEnding::Recovered),
            "released" => Some(AttemptEnding::Released),
            _ => None,
        }
    }
}

/// One attempt of a job that did not end it, from its attempt history: the timeline between
/// acceptance and the attempt the job's status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastAttempt {
    /// The attempt's number (a released attempt's number is used again by the next one).
    pub attempt: i32,
    /// When it started, canonical UTC.
    pub started_at: String,
    /// When it ended, canonical UTC.
    pub ended_at: String,
    /// How it ended.
    pub ending: AttemptEnding,
    /// When the job was due again, canonical UTC: the retry's scheduled time, or the moment it
    /// was given back.
    pub due_at: String,
}

/// The attempt history of job `$1` of owner `$2`, oldest first. Locks: none; probes the
/// intake's primary key and walks `etl_job_attempts_job_idx` for the one job.
pub const ATTEMPTS_SQL: &str = "
SELECT a.attempt, a.started_at, a.ended_at, a.ending, a.due_at
  FROM etl_job_intake i
  JOIN etl_job_attempts a ON a.job_id = i.id
 WHERE i.id = $1 AND i.owner_key = $2
 ORDER BY a.ended_at, a.attempt";

/// The attempts of job `id` of `owner` that did not end it, oldest first (none for another
/// owner's job).
///
/// # Errors
/// Database errors.
pub async fn past_attempts(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
) -> Result<Vec<PastAttempt>, Error> {
    let owner: &[u8] = owner;
    let rows = client
        .query_typed(ATTEMPTS_SQL, &[(&id, Type::UUID), (&owner, Type::BYTEA)])
        .await?;
    let time = |row: &Row, i: usize| canonical_utc(row.get::<_, DateTime<Utc>>(i));
    Ok(rows
        .iter()
        .filter_map(|row| {
            Some(PastAttempt {
                attempt: row.get(0),
                started_at: time(row, 1),
                ended_at: time(row, 2),
                ending: AttemptEnding::parse(row.get(3))?,
                due_at: time(row, 4),
            })
        })
        .collect())
}

/// The jobs of owner `$2` submitted to replace job `$1`, oldest first. Locks: none; reads the
/// partial index `etl_job_intake_replaces_idx` for the one job.
pub const REPLACED_BY_SQL: &str = "
SELECT i.id FROM etl_job_intake i
 WHERE i.replaces_job_id = $1 AND i.owner_key = $2
 ORDER BY i.id";

/// The jobs of `owner` that were submitted to replace job `id`, oldest first.
///
/// # Errors
/// Database errors.
pub async fn replaced_by(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
) -> Result<Vec<Uuid>, Error> {
    let owner: &[u8] = owner;
    let rows = client
        .query_typed(REPLACED_BY_SQL, &[(&id, Type::UUID), (&owner, Type::BYTEA)])
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
