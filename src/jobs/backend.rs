//! The client an enqueue or a cancel runs its statements on: a tokio-postgres client or
//! transaction ([`Pg`]), or, with the `sqlx` feature, a sqlx connection or transaction
//! ([`Sqlx`]). The enqueue and cancel logic is written once, over [`Backend`]; each backend only
//! binds the same parameters to the same SQL and reads the same columns back.
//!
//! Invariants this module keeps:
//! - Both backends run exactly the statements they are given, with the parameters in the same
//!   order and of the same SQL types, on the caller's own connection or transaction: a job
//!   enqueued in a transaction commits or rolls back with it, whichever library opened it.
//! - A sqlx error is classified by its SQLSTATE as a tokio-postgres one is ([`Error::code`]);
//!   neither backend logs anything.

use crate::error::Error;
use crate::jobs::state::JobState;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

/// The columns of one enqueue's INSERT, in its parameters' order (`$1` to `$12`, and `$13` for
/// the statement that takes it).
pub(crate) struct InsertParams<'a> {
    /// `$1`: the new jobs' ids.
    pub(crate) ids: &'a [Uuid],
    /// `$2`: their idempotency key digests (or keys of their own).
    pub(crate) key_digests: &'a [Vec<u8>],
    /// `$3`: their payload fingerprints.
    pub(crate) fingerprints: &'a [Vec<u8>],
    /// `$4`: their payloads.
    pub(crate) payloads: &'a [serde_json::Value],
    /// `$5`: their attempt bounds.
    pub(crate) max_attempts: &'a [i32],
    /// `$6`: when each is due, as asked.
    pub(crate) run_ats: &'a [Option<DateTime<Utc>>],
    /// `$7`: the owner digest.
    pub(crate) owner: &'a [u8],
    /// `$8`: the jobs' kind.
    pub(crate) kind: &'a str,
    /// `$9`: the job each replaces, if any.
    pub(crate) replaces: &'a [Option<Uuid>],
    /// `$10`: their queues.
    pub(crate) queues: &'a [&'a str],
    /// `$11`: their priorities.
    pub(crate) priorities: &'a [i16],
    /// `$12`: their concurrency keys.
    pub(crate) concurrency_keys: &'a [Option<&'a str>],
    /// `$13`, only for the statement that takes it: whether each keeps a past `run_at`.
    pub(crate) dated: Option<&'a [bool]>,
}

/// The parameters of one cancel statement: `$1` the job, `$2` the owner digest, `$3` the code it
/// ends with, and `$4`, for the statement that never waits, whether this is its last try.
pub(crate) struct CancelParams<'a> {
    /// The job.
    pub(crate) id: Uuid,
    /// The owner digest.
    pub(crate) owner: &'a [u8],
    /// The code the job ends with.
    pub(crate) code: &'a str,
    /// Whether this is the last try (the statement that never waits takes it; the one that
    /// waits does not).
    pub(crate) last: Option<bool>,
}

/// The sealed payloads one enqueue keeps, parallel arrays in its statement's order.
#[derive(Debug, Default)]
pub(crate) struct Retained<'a> {
    /// `$1`: the jobs.
    pub(crate) ids: Vec<Uuid>,
    /// `$2`: the ids of the keys that sealed them.
    pub(crate) key_ids: Vec<&'a str>,
    /// `$3`: the sealed payloads.
    pub(crate) sealed: Vec<Vec<u8>>,
    /// `$4`: how long each is kept after its job fails, in seconds.
    pub(crate) ttls: Vec<i32>,
}

/// A job found under an idempotency key: the key digest, the job's id and its fingerprint.
pub(crate) type Existing = (Vec<u8>, Uuid, Vec<u8>);

/// Runs the statements of an enqueue and a cancel on one caller's connection or transaction.
pub(crate) trait Backend: Send {
    /// Runs an INSERT of `params`; returns the ids it inserted when `returning` (else none).
    fn insert<'a>(
        &'a mut self,
        sql: &'static str,
        params: &'a InsertParams<'a>,
        returning: bool,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, Error>>;

    /// Runs the read of the owner's jobs under `digests` (`$1` the owner, `$2` the digests).
    fn existing<'a>(
        &'a mut self,
        sql: &'static str,
        owner: &'a [u8],
        digests: &'a [Vec<u8>],
    ) -> BoxFuture<'a, Result<Vec<Existing>, Error>>;

    /// Runs a cancel statement; returns the job's status as its snapshot saw it and whether the
    /// statement ended or marked it, or nothing when the owner has no such job.
    fn cancel<'a>(
        &'a mut self,
        sql: &'static str,
        params: CancelParams<'a>,
    ) -> BoxFuture<'a, Result<Option<(JobState, bool)>, Error>>;

    /// Runs the INSERT of sealed payloads `rows`.
    fn retain<'a>(
        &'a mut self,
        sql: &'static str,
        rows: &'a Retained<'a>,
    ) -> BoxFuture<'a, Result<(), Error>>;
}

/// A tokio-postgres client: a transaction's own (`GenericClient::client`), on whose connection
/// its statements run inside the transaction.
pub(crate) struct Pg<'c>(pub(crate) &'c tokio_postgres::Client);

impl Backend for Pg<'_> {
    fn insert<'a>(
        &'a mut self,
        sql: &'static str,
        p: &'a InsertParams<'a>,
        returning: bool,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, Error>> {
        Box::pin(async move {
            let dated = p.dated.unwrap_or_default();
            let params: [(&(dyn ToSql + Sync), Type); 13] = [
                (&p.ids, Type::UUID_ARRAY),
                (&p.key_digests, Type::BYTEA_ARRAY),
                (&p.fingerprints, Type::BYTEA_ARRAY),
                (&p.payloads, Type::JSONB_ARRAY),
                (&p.max_attempts, Type::INT4_ARRAY),
                (&p.run_ats, Type::TIMESTAMPTZ_ARRAY),
                (&p.owner, Type::BYTEA),
                (&p.kind, Type::TEXT),
                (&p.replaces, Type::UUID_ARRAY),
                (&p.queues, Type::TEXT_ARRAY),
                (&p.priorities, Type::INT2_ARRAY),
                (&p.concurrency_keys, Type::TEXT_ARRAY),
                (&dated, Type::BOOL_ARRAY),
            ];
            let params = if p.dated.is_some() {
                &params[..]
            } else {
                &params[..12]
            };
            if !returning {
                self.0.execute_typed(sql, params).await?;
                return Ok(Vec::new());
            }
            let rows = self.0.query_typed(sql, params).await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn existing<'a>(
        &'a mut self,
        sql: &'static str,
        owner: &'a [u8],
        digests: &'a [Vec<u8>],
    ) -> BoxFuture<'a, Result<Vec<Existing>, Error>> {
        Box::pin(async move {
            let rows = self
                .0
                .query_typed(sql, &[(&owner, Type::BYTEA), (&digests, Type::BYTEA_ARRAY)])
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
    }

    fn cancel<'a>(
        &'a mut self,
        sql: &'static str,
        p: CancelParams<'a>,
    ) -> BoxFuture<'a, Result<Option<(JobState, bool)>, Error>> {
        Box::pin(async move {
            let last = p.last.unwrap_or(false);
            let params: [(&(dyn ToSql + Sync), Type); 4] = [
                (&p.id, Type::UUID),
                (&p.owner, Type::BYTEA),
                (&p.code, Type::TEXT),
                (&last, Type::BOOL),
            ];
            let params = if p.last.is_some() {
                &params[..]
            } else {
                &params[..3]
            };
            match self.0.query_typed_opt(sql, params).await? {
                None => Ok(None),
                Some(row) => Ok(Some((row.try_get(0)?, row.try_get(1)?))),
            }
        })
    }

    fn retain<'a>(
        &'a mut self,
        sql: &'static str,
        rows: &'a Retained<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.0
                .execute_typed(
                    sql,
                    &[
                        (&rows.ids, Type::UUID_ARRAY),
                        (&rows.key_ids, Type::TEXT_ARRAY),
                        (&rows.sealed, Type::BYTEA_ARRAY),
                        (&rows.ttls, Type::INT4_ARRAY),
                    ],
                )
                .await?;
            Ok(())
        })
    }
}

/// A sqlx connection, or a transaction through it (`&mut *tx`).
#[cfg(feature = "sqlx")]
pub(crate) struct Sqlx<'c>(pub(crate) &'c mut sqlx::PgConnection);

#[cfg(feature = "sqlx")]
impl Backend for Sqlx<'_> {
    fn insert<'a>(
        &'a mut self,
        sql: &'static str,
        p: &'a InsertParams<'a>,
        returning: bool,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, Error>> {
        use sqlx::Row;
        Box::pin(async move {
            let payloads: Vec<sqlx::types::Json<&serde_json::Value>> =
                p.payloads.iter().map(sqlx::types::Json).collect();
            let query = sqlx::query(sql)
                .bind(p.ids)
                .bind(p.key_digests)
                .bind(p.fingerprints)
                .bind(payloads)
                .bind(p.max_attempts)
                .bind(p.run_ats)
                .bind(p.owner)
                .bind(p.kind)
                .bind(p.replaces)
                .bind(p.queues)
                .bind(p.priorities)
                .bind(p.concurrency_keys);
            let query = match p.dated {
                Some(dated) => query.bind(dated),
                None => query,
            };
            if !returning {
                query.execute(&mut *self.0).await?;
                return Ok(Vec::new());
            }
            let rows = query.fetch_all(&mut *self.0).await?;
            Ok(rows
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?)
        })
    }

    fn existing<'a>(
        &'a mut self,
        sql: &'static str,
        owner: &'a [u8],
        digests: &'a [Vec<u8>],
    ) -> BoxFuture<'a, Result<Vec<Existing>, Error>> {
        use sqlx::Row;
        Box::pin(async move {
            let rows = sqlx::query(sql)
                .bind(owner)
                .bind(digests)
                .fetch_all(&mut *self.0)
                .await?;
            Ok(rows
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                .collect::<Result<_, sqlx::Error>>()?)
        })
    }

    fn cancel<'a>(
        &'a mut self,
        sql: &'static str,
        p: CancelParams<'a>,
    ) -> BoxFuture<'a, Result<Option<(JobState, bool)>, Error>> {
        use sqlx::Row;
        Box::pin(async move {
            let mut query = sqlx::query(sql).bind(p.id).bind(p.owner).bind(p.code);
            if let Some(last) = p.last {
                query = query.bind(last);
            }
            let Some(row) = query.fetch_optional(&mut *self.0).await? else {
                return Ok(None);
            };
            let status: String = row.try_get(0)?;
            let status = JobState::parse(&status).ok_or(Error::Internal)?;
            Ok(Some((status, row.try_get(1)?)))
        })
    }

    fn retain<'a>(
        &'a mut self,
        sql: &'static str,
        rows: &'a Retained<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            sqlx::query(sql)
                .bind(&rows.ids)
                .bind(&rows.key_ids)
                .bind(&rows.sealed)
                .bind(&rows.ttls)
                .execute(&mut *self.0)
                .await?;
            Ok(())
        })
    }
}
