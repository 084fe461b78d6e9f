//! The presence statements: the SQL each presence change runs on `etl_waiting_replicas` (an
//! UNLOGGED table: no WAL) and on the queues' enqueue barriers, and how a claim session sends
//! them, pipelined before its claim.
//!
//! Invariants this module keeps:
//! - No statement here ever waits for an enqueue transaction: no enqueue locks a waiting row
//!   (migration 0028), and a barrier is only tried, never waited for.
//! - Each statement runs in its own implicit transaction, so the registration's row is committed
//!   before the tries that follow it, and the claim after the tries reads a snapshot taken after
//!   them.
//! - A claim session prepares the registration and the try once; behind a transaction-mode pooler
//!   nothing is prepared and each is sent unnamed.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

/// Records owner `$1` as waiting for work of the queues `$2` and kinds `$3`, to be named by
/// wakes of its wake token `$4`, or refreshes its row (parked or not).
///
/// Locks: the row's lock, to the end of its own implicit transaction. Only this replica writes
/// the row (recovery deletes it once stale), so the statement waits for no enqueue. The table
/// is UNLOGGED: no WAL.
pub(crate) const REGISTER_SQL: &str = "
INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token, refreshed_at)
VALUES ($1, $2, $3, $4, now())
    ON CONFLICT (owner_id) DO UPDATE
   SET refreshed_at = excluded.refreshed_at, queues = excluded.queues, kinds = excluded.kinds,
       wake_token = excluded.wake_token";

/// Tries the enqueue barrier (`durable_etl_lock_space()`, hashtext(queue)) of each queue of `$1`
/// in exclusive mode, and releases them at once (its implicit transaction ends with the statement); answers the
/// queues whose barrier an enqueue transaction holds.
///
/// Locks: none held after the statement; a try never waits, so it never queues an enqueue.
pub(crate) const SETTLE_SQL: &str = "
SELECT coalesce(array_agg(q), '{}') FROM unnest($1::text[]) AS q
 WHERE NOT pg_try_advisory_xact_lock(durable_etl_lock_space(), hashtext(q))";

/// Parks owner `$1`'s row, unless it is parked already: the replica no longer waits, and its
/// next registration updates the same row (migration 0027).
///
/// Locks: the row's lock, to the end of its own implicit transaction. The table is UNLOGGED: no
/// WAL.
pub(crate) const PARK_SQL: &str = "
UPDATE etl_waiting_replicas SET queues = '{}', kinds = '{}'
 WHERE owner_id = $1 AND queues IS DISTINCT FROM '{}'";

/// Deletes owner `$1`'s row: the replica stops.
///
/// Locks: the row's lock, to the end of its own implicit transaction.
pub(crate) const LEAVE_SQL: &str = "DELETE FROM etl_waiting_replicas WHERE owner_id = $1";

/// Deletes the rows of replicas that are gone: rows nobody refreshed for `$1` milliseconds (the
/// presence module's `STALE_AFTER`), and rows whose owner's lock no backend of this database
/// holds (its session ended: the replica died, or is reconnecting and registers again once it
/// is back). A gone replica's row only draws wakes that the waiting replicas back up; deleting
/// it keeps them from having to.
///
/// Locks: the lock of each deleted row; a row its replica refreshes meanwhile is re-checked
/// against its new version and kept when it no longer matches. Reads `pg_locks` once.
pub(crate) const FORGET_STALE_SQL: &str = "
WITH live_owners AS MATERIALIZED (
    SELECT (l.classid::bigint << 32) | l.objid::bigint AS lock_key
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
DELETE FROM etl_waiting_replicas w
 WHERE w.refreshed_at < now() - $1 * interval '1 millisecond'
    OR NOT EXISTS (SELECT 1 FROM live_owners o
                    WHERE o.lock_key = durable_etl_owner_lock_key(w.owner_id))";

/// A presence change, sent before a claim on the claim's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Upsert the row, then try the barriers of these queues (every served one).
    Register(Vec<String>),
    /// Try the barriers of these queues again (a retry sends the tries alone, and claims only
    /// once one succeeded).
    Settle(Vec<String>),
    /// Park the row ([`PARK_SQL`]).
    Park,
}

/// The presence statements a claim session prepares once ([`REGISTER_SQL`], [`SETTLE_SQL`]):
/// a registration then costs no parse or plan. Behind a transaction-mode pooler nothing is
/// prepared ([`Statements::unnamed`]) and each is sent unnamed.
#[derive(Debug)]
pub(crate) struct Statements {
    /// [`REGISTER_SQL`] and [`SETTLE_SQL`] prepared, or `None` to send them unnamed.
    prepared: Option<(Statement, Statement)>,
}

/// The types of [`REGISTER_SQL`]'s parameters.
const REGISTER_PARAMS: [Type; 4] = [Type::TEXT, Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8];

impl Statements {
    /// Prepares them on `client`.
    ///
    /// # Errors
    /// The database error of a statement.
    pub(crate) async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
        let register = client.prepare_typed(REGISTER_SQL, &REGISTER_PARAMS).await?;
        let settle = client
            .prepare_typed(SETTLE_SQL, &[Type::TEXT_ARRAY])
            .await?;
        Ok(Statements {
            prepared: Some((register, settle)),
        })
    }

    /// None prepared: each is sent unnamed (behind a transaction-mode pooler).
    pub(crate) fn unnamed() -> Statements {
        Statements { prepared: None }
    }

    /// Sends [`SETTLE_SQL`] for `queues` on `client`; answers the queues still held.
    async fn settle(
        &self,
        client: &Client,
        queues: &[String],
    ) -> Result<Vec<String>, tokio_postgres::Error> {
        let rows = match &self.prepared {
            Some((_, settle)) => client.query(settle, &[&queues]).await?,
            None => {
                client
                    .query_typed(SETTLE_SQL, &[(&queues, Type::TEXT_ARRAY)])
                    .await?
            }
        };
        Ok(first_column(&rows)?.unwrap_or_default())
    }
}

/// Sends `change` for `owner_id` on `client` (whose session prepared `statements`), to be
/// pipelined before a claim on the same client: every statement is queued when this future is
/// first polled, so poll it before the claim. Answers the queues whose barrier is still held.
///
/// # Errors
/// The database error of a statement.
pub(crate) async fn send(
    client: &Client,
    statements: &Statements,
    change: &Change,
    owner_id: &str,
    (queues, kinds): (&[&str], &[&str]),
    wake_token: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    match change {
        Change::Register(settle) => {
            let params: [&(dyn ToSql + Sync); 4] = [&owner_id, &queues, &kinds, &wake_token];
            let registered = async {
                match &statements.prepared {
                    Some((register, _)) => client.execute(register, &params).await,
                    None => {
                        let typed: Vec<_> = params.into_iter().zip(REGISTER_PARAMS).collect();
                        client.execute_typed(REGISTER_SQL, &typed).await
                    }
                }
            };
            let (registered, held) = futures::join!(registered, statements.settle(client, settle));
            registered?;
            held
        }
        Change::Settle(settle) => statements.settle(client, settle).await,
        Change::Park => {
            client
                .execute_typed(PARK_SQL, &[(&owner_id, Type::TEXT)])
                .await?;
            Ok(Vec::new())
        }
    }
}

/// The first column of the first of `rows`, if there is one.
///
/// # Errors
/// The column's value does not convert to `T`.
fn first_column<'a, T: tokio_postgres::types::FromSql<'a>>(
    rows: &'a [tokio_postgres::Row],
) -> Result<Option<T>, tokio_postgres::Error> {
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// Deletes `owner_id`'s waiting row on `client` ([`LEAVE_SQL`]): the replica stops.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn leave(client: &Client, owner_id: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(LEAVE_SQL, &[(&owner_id, Type::TEXT)])
        .await
        .map(drop)
}
