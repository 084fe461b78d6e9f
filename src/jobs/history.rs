//! A job's history beside its status: the attempts that did not end it (`etl_job_attempts`,
//! migration 0012) and the jobs submitted to replace it.
//!
//! Invariants this module keeps:
//! - Every read is scoped by the owner digest through the job's intake row: another owner's job
//!   has no history to read.
//! - An attempt shows numbers, times, how it ended and its diagnosis (`job::diagnosis`: the
//!   phase, the decision, type names, the kind's declared detail), never an error message.
//! - A stored diagnosis this release cannot read (a newer release's) is shown as absent, never
//!   fails the read.

use crate::error::Error;
use crate::job::diagnosis::Diagnosis;
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
    /// The ending as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptEnding::Retried => "retried",
            AttemptEnding::Recovered => "recovered",
            AttemptEnding::Released => "released",
        }
    }

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
    /// Why it failed, for a retried or recovered attempt (none for a released one, or one ended
    /// by a release before diagnoses).
    pub diagnosis: Option<Diagnosis>,
}

/// The attempt that ended a failed job, with its diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastAttempt {
    /// The attempt's number.
    pub attempt: i32,
    /// Why it failed.
    pub diagnosis: Diagnosis,
}

/// A job's attempts: those that did not end it, oldest first, and, for a failed job, the one
/// that did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts {
    /// The attempts that did not end the job, oldest first.
    pub past: Vec<PastAttempt>,
    /// The attempt that ended it `failed`, with its diagnosis (none for a job not failed, or
    /// failed by a release before diagnoses).
    pub last: Option<LastAttempt>,
}

/// The attempt history of job `$1` of owner `$2`, oldest first. Locks: none; probes the
/// intake's primary key and walks `etl_job_attempts_job_idx` for the one job.
pub const ATTEMPTS_SQL: &str = "
SELECT a.attempt, a.started_at, a.ended_at, a.ending, a.due_at, a.diagnosis
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
                diagnosis: diagnosis(row, 5),
            })
        })
        .collect())
}

/// The diagnosis in column `i` of `row`, if there is one this release can read.
fn diagnosis(row: &Row, i: usize) -> Option<Diagnosis> {
    Diagnosis::from_json(row.get::<_, Option<serde_json::Value>>(i)?)
}

/// The attempt that ended job `$1` of owner `$2` `failed`, with its diagnosis (no row when the
/// job has not failed, or failed without one). Locks: none; probes the intake's and the
/// outcomes' primary keys.
pub const LAST_ATTEMPT_SQL: &str = "
SELECT o.attempts, o.diagnosis
  FROM etl_job_intake i
  JOIN etl_job_outcomes o ON o.job_id = i.id
 WHERE i.id = $1 AND i.owner_key = $2 AND o.diagnosis IS NOT NULL";

/// The attempt that ended job `id` of `owner` `failed`, with its diagnosis (none for another
/// owner's job).
///
/// # Errors
/// Database errors.
pub async fn last_attempt(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
) -> Result<Option<LastAttempt>, Error> {
    let owner: &[u8] = owner;
    let row = client
        .query_typed_opt(
            LAST_ATTEMPT_SQL,
            &[(&id, Type::UUID), (&owner, Type::BYTEA)],
        )
        .await?;
    Ok(row.and_then(|row| {
        Some(LastAttempt {
            attempt: row.get(0),
            diagnosis: diagnosis(&row, 1)?,
        })
    }))
}

/// Every attempt of job `id` of `owner` that ended ([`Attempts`]), read in one round trip (the
/// two statements pipelined; on a snapshot, they see the same state).
///
/// # Errors
/// Database errors.
pub async fn attempts(
    client: &impl GenericClient,
    owner: &[u8; 32],
    id: Uuid,
) -> Result<Attempts, Error> {
    let (past, last) = tokio::try_join!(
        past_attempts(client, owner, id),
        last_attempt(client, owner, id)
    )?;
    Ok(Attempts { past, last })
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
